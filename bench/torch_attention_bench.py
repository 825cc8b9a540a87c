#!/usr/bin/env python3
"""flashcp.torch.attention() step time against the CPU engine
(worker::CpAttentionStep over its Gloo communicator) on the same plans, the
same inputs and the same processes: N ranks as processes, each running both
paths alternately, forward + backward between barriers; the slowest rank's
time per step, median and minimum over --repeats, and the process CPU
time (the slowest rank's, median): on a loaded machine wall time is mostly
scheduling, CPU time leaves that out.

    .prefix/venv/bin/python bench/torch_attention_bench.py \
        --plan_bin build/bin/flashcp-plan --cps 2,4 --tokens_per_rank 16384

Batches: flashcp-plan's pile sample of C = N * tokens-per-rank tokens
(seed 1), planned with --strategy. Prints a Markdown table; overhead =
attention() / engine - 1.
"""
import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _rank(rank, n, d, plan, scheme, heads, head_dim, repeats, threads, out):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    if os.environ.get("FLASHCP_BENCH_STACKS_AFTER_S"):  # where a stuck rank waits
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["FLASHCP_BENCH_STACKS_AFTER_S"]))
    import torch
    import torch.distributed as dist
    import _flashcp_engine_bench
    import flashcp
    import flashcp.torch as ft
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(d, "torch"), n), rank=rank,
                            world_size=n, timeout=datetime.timedelta(seconds=600))
    view = flashcp.plan_view(json.loads(plan))
    ctx = ft.CpContext(view, rank, threads=threads)
    scale = 1.0 / math.sqrt(head_dim)
    eng = _flashcp_engine_bench.EngineStep(list(view.doc_lens), n, view.padding,
                                            list(view.shards), rank, scheme, heads, head_dim,
                                            scale, threads)
    eng.connect(os.path.join(d, "engine"), 120.0)
    rows = ctx.local_rows
    g = torch.Generator().manual_seed(rank)
    q, k, v, dout = (torch.rand(rows, heads, head_dim, generator=g) * 2 - 1 for _ in range(4))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(rows, heads)
    buf = lambda t: (t.data_ptr(), t.numel())

    def torch_step():
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        ft.attention(ql, kl, vl, ctx, scheme=scheme).backward(dout)
        return time.perf_counter() - t0, time.process_time() - c0

    def engine_step():
        eng.barrier()
        c0 = time.process_time()
        wall = eng.step(buf(q), buf(k), buf(v), buf(dout), buf(o), buf(lse), buf(dq), buf(dk),
                        buf(dv))
        return wall, time.process_time() - c0

    torch_step()  # warm-up: caches (layout, kernels), first allocations
    engine_step()
    times = {"torch": [], "engine": [], "torch_cpu": [], "engine_cpu": []}
    for _ in range(repeats):
        for key, fn in (("torch", torch_step), ("engine", engine_step)):
            wall, cpu = fn()
            times[key].append(wall)
            times[key + "_cpu"].append(cpu)
    # The slowest rank's time per repeat.
    slow = {}
    for key, ts in times.items():
        t = torch.tensor(ts, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        slow[key] = t.tolist()
    if rank == 0:
        out.put(slow)
        out.close()
        out.join_thread()  # the result is in the pipe
    dist.barrier()
    # Leave without destructors: a rank could hang at exit, in the teardown of
    # its two gloo contexts (torch's and the engine's), after the others left.
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--plan_bin", "--plan-bin", default=os.path.join(here, "../build/bin/flashcp-plan"))
    ap.add_argument("--cps", default="2,4")
    ap.add_argument("--tokens_per_rank", "--tokens-per-rank", type=int, default=16384)
    ap.add_argument("--strategy", default="flashcp")
    ap.add_argument("--schemes", default="targeted,allgather")
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--head_dim", "--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="kernel threads per rank (both paths)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    print("| N | tokens/rank | strategy | scheme | imbalance | attention() s median / min | "
          "engine s median / min | overhead median / min | CPU s attention() / engine | "
          "CPU overhead |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in map(int, args.cps.split(",")):
        c = n * args.tokens_per_rank
        plan = subprocess.run([args.plan_bin, "--dataset", "pile", "--context", str(c),
                               "--batches", "1", "--seed", "1", "--cp", str(n), "--strategy",
                               args.strategy], check=True, capture_output=True, text=True,
                              timeout=600).stdout.strip().splitlines()[0]
        imbalance = json.loads(plan)["metrics"]["imbalance_ratio"]
        for scheme in args.schemes.split(","):
            out = ctx.Queue()
            with tempfile.TemporaryDirectory(prefix="flashcp-bench-") as d:
                os.mkdir(os.path.join(d, "engine"))  # the engine's gloo FileStore
                procs = [ctx.Process(target=_rank, args=(r, n, d, plan, scheme, args.heads,
                                                         args.head_dim, args.repeats,
                                                         args.threads, out))
                         for r in range(n)]
                for p in procs:
                    p.start()
                slow = out.get(timeout=3600)
                for p in procs:
                    p.join(timeout=60)
                    if p.is_alive():
                        p.kill()
            t, e = statistics.median(slow["torch"]), statistics.median(slow["engine"])
            tm, em = min(slow["torch"]), min(slow["engine"])
            tc, ec = statistics.median(slow["torch_cpu"]), statistics.median(slow["engine_cpu"])
            print(f"| {n} | {args.tokens_per_rank} | {args.strategy} | {scheme} | "
                  f"{imbalance:.3f} | {t:.3f} / {tm:.3f} | {e:.3f} / {em:.3f} | "
                  f"{100 * (t / e - 1):+.1f}% / {100 * (tm / em - 1):+.1f}% | "
                  f"{tc:.3f} / {ec:.3f} | {100 * (tc / ec - 1):+.1f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
