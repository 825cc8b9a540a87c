"""Fits the pipeline mode's CPU profile from CPU pipeline runs and sets the
measured iteration time and per-stage peak memory beside the simulator's
prediction (issue 26; docs/benchmarks.md, "Pipeline plans executed on CPU").

Each run plans a batch (flashcp.plan_pipeline) for a small decoder and
executes it with flashcp.torch.pipeline: d_p processes over gloo.

Time fit: every op's compute seconds (after its input arrived) is, per stage
of L/d_p layers, forward L/d_p (fwd_pair_s pairs + fwd_token_s tokens +
fwd_chunk_s) and backward the same with bwd_* plus the recompute of its
checkpointed layers (the simulator's model, docs/pipeline.md).
Memory fit: the heap growth across a forward op with nothing checkpointed
(HeapMeter: bytes the C heap holds above weights and gradients) is L/d_p x
act_token_bytes x tokens, plus logits_token_bytes x tokens on the last stage;
ckpt_token_bytes and kv_token_bytes are counted, not fitted (fp32: 4 D and
2 x 4 D_kv). Least squares on the fit batches; residuals reported.

Then fresh batches are planned with the shipped named profile
`cpu_tiny_decoder` (core/internal/pipeline_model.cc holds its numbers, from
this script's fit; --eval_with fit uses the fresh fit instead) and run:
iteration, busy time and per-stage peak activation memory, predicted against
measured. Markdown on stdout, the fit as JSON with --fit_out.

    .prefix/venv/bin/python bench/pipeline_cpu_fit.py [--fit_runs 3] [--eval_runs 1]
        [--eval_with profile|fit] [--fit_out F]
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
PROFILE = "cpu_tiny_decoder"
# Counted, fp32: a checkpointed layer keeps its input; a slice later slices
# attend to keeps K and V.
COUNTED = {"ckpt_token_bytes": 4.0 * SHAPE["hidden"], "kv_token_bytes": 2 * 4.0 * SHAPE["kv_hidden"]}


def batch(rng):
    return [rng.randint(16, 400) for _ in range(rng.randint(6, 10))]


def pairs(plan, chunk):
    return sum((2 * s["start"] + s["len"] + 1) * s["len"] / 2 for s in plan["chunks"][chunk]["slices"])


def tokens(plan, chunk):
    return sum(s["len"] for s in plan["chunks"][chunk]["slices"])


def plan_for(docs, pp, slice_count, profile="", coefficients=None):
    """A DPP plan whose budget lies halfway between no and full
    checkpointing's peaks, so some chunks recompute."""
    kw = dict(SHAPE, slice_count=slice_count, profile=profile, coefficients=coefficients)
    none = flashcp.plan_pipeline(docs, pp, "dpp_no_ckpt", **kw)
    full = flashcp.plan_pipeline(docs, pp, "dpp_full_ckpt", **kw)
    budget = (max(none["prediction"]["stage_peak_bytes"]) + max(full["prediction"]["stage_peak_bytes"])) / 2
    return flashcp.plan_pipeline(docs, pp, "dpp", memory_budget_gib=budget / 2**30, **kw)


def run(docs, pp, plan):
    with tempfile.TemporaryDirectory() as d:
        return pipe.run_plan(plan, docs, pp, MODEL, d, timeout_s=300)


def lstsq(rows, ys):
    """Least squares, coefficients clamped at 0 (never negative); returns the
    coefficients and the RMS of the relative residuals."""
    a = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    x = torch.linalg.lstsq(a, y, driver="gelsd").solution.squeeze(1).clamp_min(0)
    rel = ((a @ x - y.squeeze(1)) / y.squeeze(1).abs().clamp_min(1e-30))
    return x.tolist(), rel.pow(2).mean().sqrt().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit_runs", type=int, default=3)
    ap.add_argument("--eval_runs", type=int, default=1)
    ap.add_argument("--eval_with", choices=["profile", "fit"], default="profile")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fit_out", default="")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lp_of = {2: MODEL.layers // 2, 4: MODEL.layers // 4}
    fwd_rows, fwd_y, bwd_ops, mem_rows, mem_y = [], [], [], [], []
    for i in range(a.fit_runs):
        docs, pp = batch(rng), 2
        plan = plan_for(docs, pp, 2 + i % 3)
        lp = lp_of[pp]
        for r in run(docs, pp, plan):
            last = r["rank"] == pp - 1
            for k, back, _, compute in r["ops"]:
                ckpt = plan["ckpt"][r["rank"]][k]
                if back:
                    bwd_ops.append((lp, ckpt, pairs(plan, k), tokens(plan, k), compute))
                else:
                    fwd_rows.append([lp * pairs(plan, k), lp * tokens(plan, k), lp])
                    fwd_y.append(compute)
            for k, back, before, after in r["mem_ops"]:
                if not back and plan["ckpt"][r["rank"]][k] == 0:
                    mem_rows.append([lp * tokens(plan, k), tokens(plan, k) if last else 0.0])
                    mem_y.append(after - before)
    fit = None
    if fwd_y:
        fit = fit_and_print(a, fwd_rows, fwd_y, bwd_ops, mem_rows, mem_y)
    if a.eval_runs:
        evaluate(a, rng, fit)
    if a.fit_out and fit:
        with open(a.fit_out, "w") as f:
            json.dump(fit, f, indent=1)


def fit_and_print(a, fwd_rows, fwd_y, bwd_ops, mem_rows, mem_y):
    (fa, fb, fc), f_res = lstsq(fwd_rows, fwd_y)
    bwd_rows, bwd_y = [], []
    for lp, ckpt, pr, tk, compute in bwd_ops:
        bwd_rows.append([lp * pr, lp * tk, lp])
        bwd_y.append(compute - ckpt * (fa * pr + fb * tk + fc))
    (ba, bb, bc), b_res = lstsq(bwd_rows, bwd_y)
    (act, logits), m_res = lstsq(mem_rows, mem_y)
    fit = {"fwd_pair_s": fa, "fwd_token_s": fb, "fwd_chunk_s": fc,
           "bwd_pair_s": ba, "bwd_token_s": bb, "bwd_chunk_s": bc,
           "act_token_bytes": act, "logits_token_bytes": logits, **COUNTED,
           "state_bytes_per_param": 8.0}
    print(f"Fit from {a.fit_runs} runs at d_p = 2 ({len(fwd_y)} forward and {len(bwd_y)} backward "
          f"ops for time, {len(mem_y)} forward ops without checkpointing for memory), model "
          f"L = {MODEL.layers}, D = {MODEL.hidden}, F = {MODEL.ffn}, V = {MODEL.vocab}, fp32, one "
          f"thread per rank. RMS relative residual: forward {f_res:.3f}, backward {b_res:.3f}, "
          f"memory {m_res:.3f}. Counted, not fitted: ckpt_token_bytes, kv_token_bytes; "
          f"state_bytes_per_param = 8 (fp32 weights and gradients, no optimizer).\n")
    print("| coefficient | fitted |\n|---|---|")
    for k, v in fit.items():
        print(f"| {k} | {v:.4g} |")
    return fit


def evaluate(a, rng, fit):
    with_fit = a.eval_with == "fit" and fit
    print(f"\nFresh batches planned with {'the fresh fit' if with_fit else f'the named profile `{PROFILE}`'}, then run. Iteration: the "
          "simulator's against the slowest rank's wall seconds between barriers (after one warm-up "
          "iteration), which on a shared 2-core host also counts time other processes held the "
          "cores; busy: seconds of op compute per stage, mean over stages, the simulator's "
          "(1 - bubble) x iteration against the ranks' CPU seconds; peak: per stage, the "
          "simulator's peak less model states against the measured peak heap bytes above weights "
          "and gradients (KiB, stage 0 first):\n")
    print("| d_p | docs | tokens | chunks | ckpt layers | iteration predicted / measured s | "
          "busy predicted / measured s | busy measured / predicted | peak KiB predicted | "
          "peak KiB measured | peak measured / predicted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for pp in (2, 4):
        for i in range(a.eval_runs):
            docs = batch(rng)
            if with_fit:
                plan = plan_for(docs, pp, 2 + i % 3, coefficients=fit)
            else:
                plan = plan_for(docs, pp, 2 + i % 3, profile=PROFILE)
            res = run(docs, pp, plan)
            measured = max(r["seconds"] for r in res)
            pred = plan["prediction"]["iteration_s"]
            busy_pred = (1 - plan["prediction"]["bubble_share"]) * pred
            busy = sum(sum(op[3] for op in r["ops"]) for r in res) / pp
            ck = sum(sum(row) for row in plan["ckpt"])
            peak_pred = [p - s for p, s in zip(plan["prediction"]["stage_peak_bytes"],
                                               plan["prediction"]["stage_model_state_bytes"])]
            peak = [r["peak_activation_bytes"] for r in res]
            ratio = " ".join(f"{m / p:.2f}" for m, p in zip(peak, peak_pred))
            print(f"| {pp} | {len(docs)} | {sum(docs)} | {len(plan['chunks'])} | {ck} | "
                  f"{pred:.3f} / {measured:.3f} | {busy_pred:.3f} / {busy:.3f} | {busy / busy_pred:.2f} | "
                  f"{' '.join(f'{p / 1024:.0f}' for p in peak_pred)} | "
                  f"{' '.join(f'{m / 1024:.0f}' for m in peak)} | {ratio} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
