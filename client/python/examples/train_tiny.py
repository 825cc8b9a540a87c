#!/usr/bin/env python3
"""Trains a tiny decoder with FlashCP context parallelism and checks it
against training without CP.

A 2-layer decoder (4 query heads, 2 KV heads: GQA) learns a packed corpus
made here (documents of 1 to 160 tokens from a seeded Markov chain). Each
step packs documents into one sequence; with CP, N gloo processes each hold
C/N of its tokens under the step's plan: from the real flashcp-planner
(started here on 127.0.0.1:0) and from the in-process planner
(flashcp.plan). The loss of every step must equal single-process training
without CP (dense attention with the document mask, same seeds) within
--rtol. Prints tokens/s and the plans' imbalance and saving; --json prints
the summary as one JSON line too.

Operations: every step's attention metrics go through
flashcp.torch.step_metrics (the flashcp_worker_* series the dashboards
read); --metrics_ports_file makes each rank serve them (prometheus_client,
127.0.0.1:0) and append "RANK PORT" to that file, for Prometheus to scrape;
--report_profile sends each step's per-rank attention times to the planner
(ReportStepTimes, the calibration's input; rank 0, every --report_every
steps). --hold_file keeps the ranks serving after training until that file
exists (a scraper's turn), at most --hold_s seconds.

    .prefix/venv/bin/python client/python/examples/train_tiny.py \
        --planner_bin build/bin/flashcp-planner --cp 2,4 --steps 20
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import flashcp
import flashcp.planner_process
import flashcp.torch as ft

VOCAB, DIM, HQ, HKV, HEAD_DIM, LAYERS, MAX_DOC = 64, 32, 4, 2, 8, 2, 160


def corpus(steps, tokens_per_step, seed):
    """Per step: (document lengths, token ids [sum of lengths])."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=g), dim=1)  # Markov chain
    batches = []
    for _ in range(steps):
        lens = []
        while sum(lens) < tokens_per_step:
            lens.append(int(torch.randint(1, MAX_DOC + 1, (1,), generator=g)))
        lens[-1] -= sum(lens) - tokens_per_step
        if lens[-1] == 0:
            lens.pop()
        ids = []
        for n in lens:
            t = int(torch.randint(0, VOCAB, (1,), generator=g))
            for _ in range(n):
                ids.append(t)
                t = int(torch.multinomial(trans[t], 1, generator=g))
        batches.append((lens, torch.tensor(ids)))
    return batches


def doc_mask_attention(q, k, v, doc_lens):
    """Dense attention with the document mask: the no-CP reference."""
    doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
    i = torch.arange(len(doc))
    mask = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    g = HQ // HKV
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                       attn_mask=mask)
    return o.transpose(0, 1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q = nn.Linear(DIM, HQ * HEAD_DIM)
        self.kv = nn.Linear(DIM, 2 * HKV * HEAD_DIM)
        self.o = nn.Linear(HQ * HEAD_DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x, attend):
        h = self.norm1(x)
        q = self.q(h).view(-1, HQ, HEAD_DIM)
        k, v = self.kv(h).view(-1, 2, HKV, HEAD_DIM).unbind(1)
        x = x + self.o(attend(q, k.contiguous(), v.contiguous()).reshape(-1, HQ * HEAD_DIM))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(MAX_DOC, DIM)  # positions within documents
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids, position_ids, attend):
        x = self.tok(ids) + self.pos(position_ids)
        for b in self.blocks:
            x = b(x, attend)
        return self.head(x)


def make_model(seed):
    torch.manual_seed(seed)
    model = TinyDecoder()
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def train_reference(batches, seed):
    """Single process, no CP: the whole packed sequence, dense attention."""
    model, opt = make_model(seed)
    losses = []
    for lens, ids in batches:
        pos = torch.cat([torch.arange(n) for n in lens])
        labels = torch.full_like(ids, -100)
        labels[:-1] = ids[1:]
        labels[torch.tensor(lens).cumsum(0) - 1] = -100
        logits = model(ids, pos, lambda q, k, v: doc_mask_attention(q, k, v, lens))
        loss = F.cross_entropy(logits, labels, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_cp(rank, n, group, batches, seed, planner, address, report=None):
    """One rank of CP training; returns (losses, seconds, plan metrics,
    operations summary). report: (profile, every) to send step times to the
    planner, or None."""
    model, opt = make_model(seed)
    # A 5 s connect timeout: flashcp_client's default min_reconnect_backoff_ms
    # (100) is also gRPC's minimum connect timeout, short on a loaded machine.
    tls_ca = os.environ.get("FLASHCP_TLS_CA")  # main() sets it from --tls_ca
    creds = None
    if tls_ca:
        import grpc
        with open(tls_ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    client = (flashcp.Client(address, options=(("grpc.min_reconnect_backoff_ms", 5000),),
                             credentials=creds)
              if planner == "service" else None)
    losses, metrics = [], []
    ops = {"bytes_sent": 0, "attention_seconds": 0.0, "steps": 0, "accepted_samples": 0,
           "profile_samples": 0}
    pending = []
    start = time.perf_counter()
    for lens, ids in batches:
        # --- the lines a training loop adds for FlashCP ---------------------
        plan = client.plan(lens, n) if client else flashcp.plan(lens, n)
        ctx = ft.CpContext(plan, rank, group, doc_lens=lens)
        local_ids = ft.dispatch(ids, ctx)
        labels = ctx.labels(ids)
        logits = model(local_ids, ctx.position_ids, lambda q, k, v: ft.attention(q, k, v, ctx))
        count = (labels != -100).sum()
        dist.all_reduce(count, group=group)
        loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / count
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # each rank holds the gradient of its tokens
            dist.all_reduce(p.grad, group=group)
        # What operations see: this step's attention (flashcp_worker_* series where
        # prometheus_client is installed) and its per-rank times for calibration.
        step = ft.step_metrics(ctx, "targeted", plan=plan)
        if report and client and rank == 0:
            pending.append(ft.step_times(plan, step.group_attention_seconds))
            if len(pending) >= report[1] or len(losses) + 1 == len(batches):
                got = client.report_step_times(report[0], pending)
                ops["accepted_samples"] += got.accepted_samples
                ops["profile_samples"] = got.profile_samples
                pending = []
        # ---------------------------------------------------------------------
        ops["bytes_sent"] += step.bytes_sent
        ops["attention_seconds"] += step.attention_seconds
        ops["steps"] += 1
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        losses.append(total.item())
        metrics.append((plan.metrics.imbalance_ratio, plan.metrics.comm_saving_ratio,
                        plan.metrics.targeted_saving_ratio))
    seconds = time.perf_counter() - start
    # The group's totals (what a scrape of every rank adds up to).
    sums = torch.tensor([ops["bytes_sent"], ops["attention_seconds"], ops["steps"]],
                        dtype=torch.float64)
    dist.all_reduce(sums, group=group)
    ops["bytes_sent"], ops["attention_seconds"], ops["steps"] = (
        int(sums[0]), float(sums[1]), int(sums[2]))
    return losses, seconds, metrics, ops


def _serve_metrics(rank, ports_file, port, addr):
    """prometheus_client's exporter on addr:port + rank (port 0: one the OS
    picks); appends "RANK PORT" to ports_file if given."""
    import prometheus_client
    server, _ = prometheus_client.start_http_server(port + rank if port else 0, addr=addr)
    if ports_file:
        with open(ports_file, "a") as f:  # one short line per rank: one write each
            f.write(f"{rank} {server.server_port}\n")


def _hold(hold_file, hold_s):
    deadline = time.monotonic() + hold_s
    while not os.path.exists(hold_file) and time.monotonic() < deadline:
        time.sleep(0.05)


def _rank_main(rank, n, store_path, batches, seed, address, planners, out, ops_args):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, n), rank=rank,
                            world_size=n, timeout=datetime.timedelta(seconds=60))
    try:
        if ops_args.get("ports_file") or ops_args.get("port"):
            _serve_metrics(rank, ops_args["ports_file"], ops_args["port"], ops_args["addr"])
        result = {p: train_cp(rank, n, dist.group.WORLD, batches, seed, p, address,
                              ops_args.get("report"))
                  for p in planners}
        if rank == 0:
            out.put(result)
        if ops_args.get("hold_file"):
            _hold(ops_args["hold_file"], ops_args["hold_s"])
        # torch's gloo threads drop a finished collective's tensors under the
        # GIL; a rank that reached interpreter exit first aborted there
        # ("terminate called without an active exception"). Waiting here
        # gives them the GIL while the interpreter is alive.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_cp(n, batches, seed, address, planners, ops_args=None):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="flashcp-train-") as d:
        procs = [ctx.Process(target=_rank_main,
                             args=(r, n, os.path.join(d, "store"), batches, seed, address,
                                   planners, out, ops_args or {})) for r in range(n)]
        for p in procs:
            p.start()
        try:
            result = out.get(timeout=600 + (ops_args or {}).get("hold_s", 0))
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"CP N={n}: ranks exited with {[p.exitcode for p in procs]}")
    return result


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--planner_bin", "--planner-bin", default=os.path.join(here, "../../../build/bin/flashcp-planner"))
    ap.add_argument("--cp", default="2,4", help="CP sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per step (packed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--planners", default="service,inprocess")
    ap.add_argument("--json", action="store_true", help="also print the summary as JSON")
    ap.add_argument("--planner_address", default="",
                    help="HOST:PORT of a running planner (default: start --planner_bin)")
    ap.add_argument("--metrics_ports_file", default="",
                    help="serve each rank's metrics on 127.0.0.1:0; append 'RANK PORT' here")
    ap.add_argument("--metrics_port", type=int, default=0,
                    help="serve rank r's metrics on --metrics_addr:PORT+r (a Job's pod)")
    ap.add_argument("--metrics_addr", default="127.0.0.1")
    ap.add_argument("--tls_ca", default="", help="PEM CA of a TLS planner (--planner_address)")
    ap.add_argument("--report_profile", default="",
                    help="report step times to the planner for this cost profile")
    ap.add_argument("--report_every", type=int, default=5, help="steps per report")
    ap.add_argument("--hold_file", default="", help="after training, serve until it exists")
    ap.add_argument("--hold_s", type=float, default=120.0)
    args = ap.parse_args(argv)
    if args.tls_ca:
        os.environ["FLASHCP_TLS_CA"] = os.path.abspath(args.tls_ca)  # the spawned ranks read it
    ops_args = {"ports_file": args.metrics_ports_file, "port": args.metrics_port,
                "addr": args.metrics_addr, "hold_file": args.hold_file,
                "hold_s": args.hold_s,
                "report": (args.report_profile, args.report_every) if args.report_profile else None}
    torch.set_num_threads(1)
    batches = corpus(args.steps, args.tokens, args.seed)
    ref = train_reference(batches, args.seed)
    print(f"no CP: loss {ref[0]:.4f} -> {ref[-1]:.4f} over {args.steps} steps")
    planners = args.planners.split(",")
    summary = {"steps": args.steps, "tokens_per_step": args.tokens, "reference": ref, "runs": []}
    ok = True
    with (contextlib.nullcontext(args.planner_address) if args.planner_address else
          flashcp.planner_process.start(os.path.abspath(args.planner_bin))) as address:
        for n in (int(x) for x in args.cp.split(",")):
            for planner, (losses, seconds, metrics, ops) in run_cp(
                    n, batches, args.seed, address, planners, ops_args).items():
                rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
                imb = sum(m[0] for m in metrics) / len(metrics)
                sav = sum(m[1] for m in metrics) / len(metrics)
                tsav = sum(m[2] for m in metrics) / len(metrics)
                tps = args.steps * args.tokens / seconds
                ok &= rel <= args.rtol
                print(f"CP N={n} plans={planner:9s}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
                      f"max rel diff vs no CP {rel:.2e} ({'ok' if rel <= args.rtol else 'FAIL'}), "
                      f"{tps:.0f} tokens/s, imbalance {imb:.3f}, saving allgather {sav:.3f} "
                      f"targeted {tsav:.3f}")
                summary["runs"].append(dict(cp=n, planner=planner, losses=losses, max_rel=rel,
                                            tokens_per_s=tps, imbalance=imb, comm_saving=sav,
                                            targeted_saving=tsav, operations=ops))
    if args.json:
        print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
