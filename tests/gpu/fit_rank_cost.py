#!/usr/bin/env python3
"""Fits a per-rank attention cost model to the device check's `cp` timings.

The planner balances attention pairs (SPEC Eq. 3), but a pair does not cost
the same everywhere: each sequence has a fixed cost and prefixed shards' pairs
cost more than whole documents'. This replans the timed batches with
flashcp-plan (same data set, context, seed and batch indices as the bench),
refuses to fit if any replanned plan's imbalance differs from the one the
bench recorded (then flashcp-plan plans differently from the commit that ran
the bench: build that commit's), computes each rank's features,
computes each rank's features, and least-squares fits
    ms = a*pairs_whole + b*pairs_prefixed + c*sequences + d*tokens
(and simpler models beside it), in sample. Needs numpy.

Usage: fit_rank_cost.py CP_RESULTS.jsonl FLASHCP_PLAN_BINARY [--context 131072] [--seed 1]
"""
import argparse
import json
import subprocess
import sys

import numpy as np

STRATEGIES = ("flashcp", "llama3", "per_doc", "zigzag")


def rank_features(plan):
    """Per rank: [pairs of whole docs, pairs of prefixed shards, whole seqs, prefixed seqs,
    whole tokens, prefixed tokens]. A shard starting at 0 runs as a whole document."""
    feats = [[0.0] * 6 for _ in range(plan["cp_size"])]
    for sh in plan["shards"]:
        length, start, f = sh["len"], sh["start"], feats[sh["rank"]]
        if start == 0:
            f[0] += length * (length + 1) / 2
            f[2] += 1
            f[4] += length
        else:
            f[1] += length * start + length * (length + 1) / 2
            f[3] += 1
            f[5] += length
    return feats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("flashcp_plan")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    times, recorded = {}, {}
    for line in open(a.results):
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("bench") == "cp" and "rank_ms" in r:
                key = (r["dataset"], r["batch"], r["cp"], r["strategy"])
                times[key] = r["rank_ms"]
                recorded[key] = r.get("predicted_imbalance")
    cells = sorted({(d, n) for d, _, n, _ in times})
    batches = 1 + max(b for _, b, _, _ in times)
    x, y, keys = [], [], []
    for d, n in cells:
        out = subprocess.run([a.flashcp_plan, "--dataset", d, "--context", str(a.context),
                              "--seed", str(a.seed), "--batches", str(batches), "--cp", str(n),
                              "--strategy", ",".join(STRATEGIES)],
                             check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            p = json.loads(line)
            # flashcp-plan's JSON before 2f96066 said "batch" and "imbalance".
            batch = p["batch_id"] if "batch_id" in p else p["batch"]
            key = (d, batch, n, p["strategy"])
            t = times.get(key)
            if t is None:
                continue
            # The bench records 4 decimals.
            want, got = recorded[key], p["metrics"].get("imbalance_ratio", p["metrics"].get("imbalance"))
            if want is not None and abs(got - want) > 6e-5:
                sys.exit(f"{a.flashcp_plan} plans {key} at imbalance {got:.4f}, the bench's plan "
                         f"was {want:.4f}: not the timed plans; build flashcp-plan from the "
                         f"commit that ran the bench")
            for r, f in enumerate(rank_features(p)):
                x.append(f)
                y.append(t[r])
                keys.append(key)
    x, y = np.array(x), np.array(y)
    pairs, seqs, tokens = x[:, 0] + x[:, 1], x[:, 2] + x[:, 3], x[:, 4] + x[:, 5]
    print(f"{len(y)} rank timings, {len({k[:3] for k in keys})} cells")
    models = [("pairs", np.c_[pairs]),
              ("pairs_whole, pairs_prefixed", x[:, :2]),
              ("pairs, seqs, tokens", np.c_[pairs, seqs, tokens]),
              ("pairs_whole, pairs_prefixed, seqs, tokens", np.c_[x[:, 0], x[:, 1], seqs, tokens])]
    for name, m in models:
        coef = np.linalg.lstsq(m, y, rcond=None)[0]
        pred = m @ coef
        err = np.abs(pred - y) / y
        crit = {}
        for k, pv, yv in zip(keys, pred, y):
            c = crit.setdefault(k, [0.0, 0.0])
            c[0], c[1] = max(c[0], pv), max(c[1], yv)
        by_cell = {}
        for k, (pv, yv) in crit.items():
            by_cell.setdefault(k[:3], {})[k[3]] = (pv, yv)
        agree = sum(min(v, key=lambda s: v[s][0]) == min(v, key=lambda s: v[s][1])
                    for v in by_cell.values())
        print(f"{name:42s} coef {np.array2string(coef, precision=4)}  "
              f"|rel err| mean {100 * err.mean():.1f}% p95 {100 * np.percentile(err, 95):.1f}%  "
              f"fastest strategy predicted {agree}/{len(by_cell)}")


if __name__ == "__main__":
    main()
