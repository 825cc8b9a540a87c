#!/usr/bin/env python3
"""Which plans changed between two flashcp-plan outputs, and how.

Reads two files of flashcp-plan JSON lines (one plan per line, e.g. the
cells scripts/plan_cmp.sh saves: one build's, then another's), pairs the
plans by (batch_id, strategy) and prints, for each pair whose plan differs
(doc_lens, padding or shards), one row: shards before/after and how many
changed, tokens that changed rank, cut documents, the imbalance (max / mean
attention workload) and the targeted exchange's phase bottleneck in tokens,
before -> after. A last line sums up: plans changed of all, the mean
imbalance and mean targeted bottleneck over all plans, before -> after.

  scripts/plan_diff.py BEFORE.json AFTER.json [--all]

--all prints a row for every plan, changed or not. Exit status 0 when every
plan is the same, 1 when any differs, 2 on unreadable or unpaired input.
Python 3 standard library only.
"""
import argparse
import collections
import json
import sys


def load(path):
    plans = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                plan = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"plan_diff: {path}:{number}: not JSON: {e}") from None
            key = (plan.get("batch_id"), plan.get("strategy"))
            if key in plans:
                raise SystemExit(f"plan_diff: {path}:{number}: batch {key} twice")
            plans[key] = plan
    return plans


def shard_set(plan):
    return {(s["doc"], s["start"], s["len"], s["rank"]) for s in plan.get("shards", [])}


def moved_tokens(before, after):
    """Tokens whose rank differs between the two plans (same documents)."""
    def owner(plan):
        spans = collections.defaultdict(list)
        for s in plan.get("shards", []):
            spans[s["doc"]].append((s["start"], s["start"] + s["len"], s["rank"]))
        return spans

    a, b = owner(before), owner(after)
    moved = 0
    for doc in set(a) | set(b):
        cuts = sorted({p for x, y, _ in a.get(doc, []) + b.get(doc, []) for p in (x, y)})
        for lo, hi in zip(cuts, cuts[1:]):
            ra = next((r for x, y, r in a.get(doc, []) if x <= lo and hi <= y), None)
            rb = next((r for x, y, r in b.get(doc, []) if x <= lo and hi <= y), None)
            if ra != rb:
                moved += hi - lo
    return moved


def targeted_bottleneck(plan):
    for scheme in plan.get("metrics", {}).get("bytes", []):
        if scheme.get("scheme") == "targeted":
            return scheme.get("phase_bottleneck_tokens", 0)
    return 0


def metric(plan, name):
    return plan.get("metrics", {}).get(name, 0)


def same(before, after):
    return (before.get("doc_lens") == after.get("doc_lens")
            and before.get("padding") == after.get("padding")
            and before.get("shards") == after.get("shards"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--all", action="store_true", help="a row for every plan")
    args = parser.parse_args()
    before, after = load(args.before), load(args.after)
    if set(before) != set(after):
        only = sorted(set(before) ^ set(after), key=str)
        print(f"plan_diff: the files plan different batches, e.g. {only[:3]}", file=sys.stderr)
        return 2
    header = (f"{'batch':>5} {'strategy':<14} {'shards':^12} {'changed':>7} {'moved_tok':>9} "
              f"{'cut_docs':^10} {'imbalance':^18} {'tgt_bottleneck':^20}")
    print(header)
    changed = 0
    sums = collections.Counter()
    for key in sorted(before, key=lambda k: (k[0], str(k[1]))):
        b, a = before[key], after[key]
        differs = not same(b, a)
        changed += differs
        sums["imb_b"] += metric(b, "imbalance_ratio")
        sums["imb_a"] += metric(a, "imbalance_ratio")
        sums["tgt_b"] += targeted_bottleneck(b)
        sums["tgt_a"] += targeted_bottleneck(a)
        if not differs and not args.all:
            continue
        if b.get("doc_lens") != a.get("doc_lens"):
            print(f"{key[0]:>5} {key[1]:<14} different documents: not the same batch")
            continue
        sb, sa = shard_set(b), shard_set(a)
        print(f"{key[0]:>5} {key[1]:<14} {len(sb):>5}->{len(sa):<5} {len(sb ^ sa):>7} "
              f"{moved_tokens(b, a):>9} {metric(b, 'cut_docs'):>4}->{metric(a, 'cut_docs'):<4} "
              f"{metric(b, 'imbalance_ratio'):>8.4f}->{metric(a, 'imbalance_ratio'):<8.4f} "
              f"{targeted_bottleneck(b):>9}->{targeted_bottleneck(a):<9}")
    n = len(before)
    if n:
        print(f"{changed} of {n} plans changed; mean imbalance "
              f"{sums['imb_b'] / n:.4f} -> {sums['imb_a'] / n:.4f}; mean targeted bottleneck "
              f"{sums['tgt_b'] / n:.1f} -> {sums['tgt_a'] / n:.1f} tokens")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
