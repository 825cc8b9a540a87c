#!/usr/bin/env python3
"""Trains a tiny block diffusion language model (BDLM) with FlashCP context
parallelism and checks it against training without CP.

Each step packs documents into C tokens x_0 (a seeded Markov chain), draws a
noise level t per block of b tokens of every document, masks each token of
a block with probability t (the noisy x_t, a MASK token) and feeds the 2C
rows [x_t ; x_0] through a 2-layer transformer under the block-diffusion
mask (docs/bdlm.md). The loss is the denoising loss: cross-entropy of x_0 at
the masked noisy rows, each weighted 1/t, over the masked count. With CP, N
gloo processes each hold 2C/N rows under a plan from flashcp.plan(...,
attention_mask="block_diffusion", block_size=b); the loss of every step must
equal single-process training (dense attention with the mask, same seeds)
within --rtol.

    .prefix/venv/bin/python client/python/examples/train_bdlm_tiny.py --cp 2,4 --steps 20
"""
import argparse
import datetime
import json
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
import flashcp.torch as ft

VOCAB, DIM, HEADS, HEAD_DIM, LAYERS, MAX_DOC = 32, 32, 2, 8, 2, 128
MASK = VOCAB  # the mask token: one more embedding row, never a target


def corpus(steps, tokens, block, seed):
    """Per step: (doc_lens, x0 [C], t per row [C], masked [C] bool)."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(3.0 * torch.randn(VOCAB, VOCAB, generator=g), dim=1)
    out = []
    for _ in range(steps):
        lens, left = [], tokens
        while left > 0:
            n = min(left, int(torch.randint(1, MAX_DOC + 1, (1,), generator=g)))
            if torch.rand(1, generator=g).item() < 0.2:
                n = 1  # one-token documents too
            lens.append(n)
            left -= n
        x0 = torch.empty(tokens, dtype=torch.int64)
        t = torch.empty(tokens)
        at = 0
        for n in lens:
            x0[at] = torch.randint(0, VOCAB, (1,), generator=g)
            for i in range(1, n):
                x0[at + i] = torch.multinomial(trans[x0[at + i - 1]], 1, generator=g)
            blocks = (n + block - 1) // block
            level = 0.05 + 0.9 * torch.rand(blocks, generator=g)  # per-block noise level
            t[at:at + n] = level.repeat_interleave(block)[:n]
            at += n
        masked = torch.rand(tokens, generator=g) < t
        out.append((lens, x0, t, masked))
    return out


def step_inputs(lens, x0, t, masked):
    """The 2C rows: ids [x_t ; x_0], positions, noisy flags, targets, weights."""
    xt = torch.where(masked, torch.full_like(x0, MASK), x0)
    pos = torch.cat([torch.arange(n) for n in lens])
    ids = torch.cat([xt, x0])
    noisy = torch.cat([torch.ones_like(x0, dtype=torch.bool), torch.zeros_like(x0, dtype=torch.bool)])
    targets = torch.cat([torch.where(masked, x0, torch.full_like(x0, -100)),
                         torch.full_like(x0, -100)])
    weights = torch.cat([torch.where(masked, 1.0 / t, torch.zeros_like(t)), torch.zeros_like(t)])
    return ids, torch.cat([pos, pos]), noisy, targets, weights


def bd_attention(q, k, v, lens, block):
    """Dense attention with the block-diffusion mask: the no-CP reference."""
    doc = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    pos = torch.cat([torch.arange(n) for n in lens])
    c = len(doc)
    doc2, blk = torch.cat([doc, doc]), torch.cat([pos // block, pos // block])
    noisy = torch.arange(2 * c) < c
    qn, kn, qb, kb = noisy[:, None], noisy[None, :], blk[:, None], blk[None, :]
    see = (qn & kn & (kb == qb)) | (qn & ~kn & (kb < qb)) | (~qn & ~kn & (kb <= qb))
    mask = see & (doc2[:, None] == doc2[None, :])
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                       attn_mask=mask)
    return o.transpose(0, 1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * HEADS * HEAD_DIM)
        self.o = nn.Linear(HEADS * HEAD_DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x, attend):
        q, k, v = self.qkv(self.norm1(x)).view(-1, 3, HEADS, HEAD_DIM).unbind(1)
        x = x + self.o(attend(q.contiguous(), k.contiguous(), v.contiguous()).reshape(x.shape[0], -1))
        return x + self.mlp(self.norm2(x))


class TinyBdlm(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB + 1, DIM)
        self.pos = nn.Embedding(MAX_DOC, DIM)
        self.copy = nn.Embedding(2, DIM)  # noisy or clean copy
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids, pos, noisy, attend):
        x = self.tok(ids) + self.pos(pos) + self.copy(noisy.long())
        for b in self.blocks:
            x = b(x, attend)
        return self.head(x)


def make_model(seed):
    torch.manual_seed(seed)
    model = TinyBdlm()
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def denoising_loss(logits, targets, weights, count):
    ce = F.cross_entropy(logits, targets.clamp(min=0), reduction="none")
    return (ce * weights).sum() / count


def train_reference(batches, block, seed):
    model, opt = make_model(seed)
    losses = []
    for lens, x0, t, masked in batches:
        ids, pos, noisy, targets, weights = step_inputs(lens, x0, t, masked)
        logits = model(ids, pos, noisy, lambda q, k, v: bd_attention(q, k, v, lens, block))
        loss = denoising_loss(logits, targets, weights, max(int(masked.sum()), 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_cp(rank, n, group, batches, block, seed, strategy):
    model, opt = make_model(seed)
    losses, imbalance = [], []
    start = time.perf_counter()
    for lens, x0, t, masked in batches:
        ids, pos, noisy, targets, weights = step_inputs(lens, x0, t, masked)
        # --- the lines a BDLM training loop adds for FlashCP ----------------
        plan = flashcp.plan(lens, n, strategy, attention_mask="block_diffusion", block_size=block)
        ctx = ft.CpContext(plan, rank, group, doc_lens=lens)
        logits = model(ft.dispatch(ids, ctx, pad_value=MASK), ctx.position_ids, ctx.is_noisy,
                       lambda q, k, v: ft.attention(q, k, v, ctx))
        local_t, local_w = ft.dispatch(targets, ctx, pad_value=-100), ft.dispatch(weights, ctx)
        loss = denoising_loss(logits, local_t, local_w, max(int(masked.sum()), 1))
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # each rank holds the gradient of its rows
            dist.all_reduce(p.grad, group=group)
        # ---------------------------------------------------------------------
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        losses.append(total.item())
        imbalance.append(plan.metrics.imbalance_ratio)
    return losses, time.perf_counter() - start, imbalance


def _rank_main(rank, n, store_path, batches, block, seed, strategy, out):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, n), rank=rank,
                            world_size=n, timeout=datetime.timedelta(seconds=60))
    try:
        result = train_cp(rank, n, dist.group.WORLD, batches, block, seed, strategy)
        if rank == 0:
            out.put(result)
        # torch's gloo threads drop a finished collective's tensors under the
        # GIL; a rank that reached interpreter exit first aborted there
        # ("terminate called without an active exception"). Waiting here
        # gives them the GIL while the interpreter is alive.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_cp(n, batches, block, seed, strategy):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="flashcp-bdlm-") as d:
        procs = [ctx.Process(target=_rank_main, args=(r, n, os.path.join(d, "store"), batches,
                                                      block, seed, strategy, out))
                 for r in range(n)]
        for p in procs:
            p.start()
        try:
            result = out.get(timeout=600)
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"CP N={n}: ranks exited with {[p.exitcode for p in procs]}")
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cp", default="2,4", help="CP sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=192, help="C: clean tokens per step (packed)")
    ap.add_argument("--block_size", type=int, default=4)
    ap.add_argument("--strategy", default="flashcp")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--json", action="store_true", help="also print the summary as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    batches = corpus(args.steps, args.tokens, args.block_size, args.seed)
    ref = train_reference(batches, args.block_size, args.seed)
    print(f"no CP: loss {ref[0]:.4f} -> {ref[-1]:.4f} over {args.steps} steps")
    summary = {"steps": args.steps, "tokens_per_step": args.tokens,
               "block_size": args.block_size, "strategy": args.strategy, "reference": ref,
               "runs": []}
    ok = True
    for n in (int(x) for x in args.cp.split(",")):
        losses, seconds, imbalance = run_cp(n, batches, args.block_size, args.seed, args.strategy)
        rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        ok &= rel <= args.rtol
        imb = sum(imbalance) / len(imbalance)
        print(f"CP N={n} {args.strategy}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, max rel diff "
              f"vs no CP {rel:.2e} ({'ok' if rel <= args.rtol else 'FAIL'}), "
              f"{seconds:.1f} s, imbalance {imb:.3f}")
        summary["runs"].append(dict(cp=n, losses=losses, max_rel=rel, seconds=seconds,
                                    imbalance=imb))
    if args.json:
        print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
