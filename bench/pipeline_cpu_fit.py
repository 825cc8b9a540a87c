"""Fits the pipeline mode's time profile from CPU pipeline runs and sets the
measured iteration time beside the simulator's prediction (issue 26;
docs/benchmarks.md, "Pipeline plans executed on CPU").

Each run plans a batch (flashcp.plan_pipeline) for a small decoder and
executes it with flashcp.torch.pipeline: d_p processes over gloo. Fit: every
op's compute seconds (after its input arrived) is, per stage of L/d_p layers,
forward L/d_p (fwd_pair_s pairs + fwd_token_s tokens + fwd_chunk_s) and
backward the same with bwd_* plus the recompute of its checkpointed layers
(the simulator's model, docs/pipeline.md); least squares on fit batches, then
fresh batches are planned with the fitted coefficients and run. Markdown on
stdout, the fit as JSON with --fit_out.

    .prefix/venv/bin/python bench/pipeline_cpu_fit.py [--fit_runs 3] [--eval_runs 1] [--fit_out F]
"""
import argparse
import json
import random
import sys
import tempfile

import torch

import flashcp
from flashcp.torch import pipeline as pipe

MODEL = pipe.TinyDecoderConfig(layers=4, hidden=64, heads=4, ffn=256, vocab=128, seed=1)
SHAPE = dict(layers=4, hidden=64, kv_hidden=64, ffn_hidden=256, vocab=128)


def batch(rng):
    return [rng.randint(16, 400) for _ in range(rng.randint(6, 10))]


def pairs(plan, chunk):
    return sum((2 * s["start"] + s["len"] + 1) * s["len"] / 2 for s in plan["chunks"][chunk]["slices"])


def tokens(plan, chunk):
    return sum(s["len"] for s in plan["chunks"][chunk]["slices"])


def plan_for(docs, pp, slice_count, coefficients=None):
    """A DPP plan whose budget lies halfway between no and full
    checkpointing's peaks, so some chunks recompute."""
    kw = dict(SHAPE, slice_count=slice_count, coefficients=coefficients)
    none = flashcp.plan_pipeline(docs, pp, "dpp_no_ckpt", **kw)
    full = flashcp.plan_pipeline(docs, pp, "dpp_full_ckpt", **kw)
    budget = (max(none["prediction"]["stage_peak_bytes"]) + max(full["prediction"]["stage_peak_bytes"])) / 2
    return flashcp.plan_pipeline(docs, pp, "dpp", memory_budget_gib=budget / 2**30, **kw)


def run(docs, pp, plan):
    with tempfile.TemporaryDirectory() as d:
        return pipe.run_plan(plan, docs, pp, MODEL, d, timeout_s=300)


def lstsq(rows, ys):
    a = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    x = torch.linalg.lstsq(a, y, driver="gelsd").solution.squeeze(1)
    return [max(0.0, v) for v in x.tolist()]  # a coefficient is never negative


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit_runs", type=int, default=3)
    ap.add_argument("--eval_runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fit_out", default="")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lp_of = {2: MODEL.layers // 2, 4: MODEL.layers // 4}
    fwd_rows, fwd_y, bwd_ops = [], [], []
    for i in range(a.fit_runs):
        docs, pp = batch(rng), 2
        plan = plan_for(docs, pp, 2 + i % 3)
        for r in run(docs, pp, plan):
            lp = lp_of[pp]
            for k, back, _, compute in r["ops"]:
                ckpt = plan["ckpt"][r["rank"]][k]
                if back:
                    bwd_ops.append((lp, ckpt, pairs(plan, k), tokens(plan, k), compute))
                else:
                    fwd_rows.append([lp * pairs(plan, k), lp * tokens(plan, k), lp])
                    fwd_y.append(compute)
    fa, fb, fc = lstsq(fwd_rows, fwd_y)
    bwd_rows, bwd_y = [], []
    for lp, ckpt, pr, tk, compute in bwd_ops:
        bwd_rows.append([lp * pr, lp * tk, lp])
        bwd_y.append(compute - ckpt * (fa * pr + fb * tk + fc))
    ba, bb, bc = lstsq(bwd_rows, bwd_y)
    fit = {"fwd_pair_s": fa, "fwd_token_s": fb, "fwd_chunk_s": fc,
           "bwd_pair_s": ba, "bwd_token_s": bb, "bwd_chunk_s": bc}
    print(f"Fit from {a.fit_runs} runs at d_p = 2 ({len(fwd_y)} forward and {len(bwd_y)} backward "
          f"ops), model L = {MODEL.layers}, D = {MODEL.hidden}, F = {MODEL.ffn}, V = {MODEL.vocab}, "
          f"fp32, one thread per rank:\n")
    print("| coefficient | fitted |\n|---|---|")
    for k, v in fit.items():
        print(f"| {k} | {v:.3e} |")
    print("\nFresh batches planned with the fitted coefficients, then run. Iteration: the "
          "simulator's against the slowest rank's wall seconds between barriers (after one warm-up "
          "iteration), which on a shared 2-core host also counts time other processes held the "
          "cores; busy: seconds of op compute per stage, mean over stages, the simulator's "
          "(1 - bubble) x iteration against the ranks' CPU seconds:\n")
    print("| d_p | docs | tokens | chunks | ckpt layers | iteration predicted / measured s | "
          "busy predicted / measured s | busy measured / predicted |")
    print("|---|---|---|---|---|---|---|---|")
    for pp in (2, 4):
        for i in range(a.eval_runs):
            docs = batch(rng)
            plan = plan_for(docs, pp, 2 + i % 3, coefficients=fit)
            res = run(docs, pp, plan)
            measured = max(r["seconds"] for r in res)
            pred = plan["prediction"]["iteration_s"]
            busy_pred = (1 - plan["prediction"]["bubble_share"]) * pred
            busy = sum(sum(op[3] for op in r["ops"]) for r in res) / pp
            ck = sum(sum(row) for row in plan["ckpt"])
            print(f"| {pp} | {len(docs)} | {sum(docs)} | {len(plan['chunks'])} | {ck} | "
                  f"{pred:.3f} / {measured:.3f} | {busy_pred:.3f} / {busy:.3f} | {busy / busy_pred:.2f} |")
            sys.stdout.flush()
    if a.fit_out:
        with open(a.fit_out, "w") as f:
            json.dump(fit, f, indent=1)


if __name__ == "__main__":
    main()
