"""flashcp.torch.pipeline: runs a pipeline plan (flashcp.plan_pipeline) on CPU.

The plan's chunks are executed by d_p real processes over gloo, one pipeline
stage each, with a small decoder split by layers: every stage runs its ops in
the plan's 1F1B order (flashcp.pipeline_stage_order, the order the simulator
replays), sends activations forward and gradients backward, checkpoints the
plan's ckpt[stage][chunk] layers of each chunk (torch.utils.checkpoint), and
keeps the K/V of a split document's earlier slices for its later slices,
whose dK/dV it accumulates and applies at the earlier slice's backward (the
slices run backward last first). `reference` trains the same model on the
whole documents without a pipeline; fp32 losses and gradients match it.

    python -m flashcp.torch.pipeline --job JOB.json --rank R

JOB.json: {"plan": <plan_pipeline dict>, "pp_size": d_p, "doc_lens": [...],
"model": {layers, hidden, heads, ffn, vocab, seed}, "orders": per stage
[[chunk, backward], ...] (flashcp.pipeline_stage_order), "store": <file path
for the gloo rendezvous>, "out": <folder>}; run_plan writes it and starts the
ranks. Each rank writes out/rank<R>.json:
its stage's gradients' max relative error against `reference`, the loss (last
stage), the iteration's wall seconds and its ops' seconds, and from a
separate iteration its peak heap bytes above weights and gradients
(HeapMeter: activation memory) with the heap before and after every op.
"""
import argparse
import ctypes
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

Slice = Tuple[int, int, int]  # doc, start, len


@dataclass
class TinyDecoderConfig:
    layers: int = 4
    hidden: int = 32
    heads: int = 2
    ffn: int = 64
    vocab: int = 64
    seed: int = 0


class Layer(nn.Module):
    """Pre-norm decoder layer whose attention runs per slice: a slice's
    queries see its document's earlier tokens (`ctx`: K/V of earlier slices)
    and its own, causally."""

    def __init__(self, cfg: TinyDecoderConfig):
        super().__init__()
        d = cfg.hidden
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.w1 = nn.Linear(d, cfg.ffn)
        self.w2 = nn.Linear(cfg.ffn, d)

    def forward(self, x: torch.Tensor, slices: Sequence[Slice],
                ctx: Sequence[Tuple[List[torch.Tensor], List[torch.Tensor]]]):
        """x: [tokens, hidden] of the slices in order; ctx[i]: the K and V
        pieces of slice i's document before its start. Returns the output
        and this layer's K and V of every token."""
        h = self.ln1(x)
        q, k, v = self.wq(h), self.wk(h), self.wv(h)
        outs, at = [], 0
        dh = x.shape[1] // self.heads
        for (_, start, n), (kc, vc) in zip(slices, ctx):
            qi = q[at:at + n].view(n, self.heads, dh).transpose(0, 1)
            keys = torch.cat(list(kc) + [k[at:at + n]]).view(-1, self.heads, dh).transpose(0, 1)
            vals = torch.cat(list(vc) + [v[at:at + n]]).view(-1, self.heads, dh).transpose(0, 1)
            # Query j (position start + j) sees keys 0 .. start + j.
            pos_q = torch.arange(start, start + n).unsqueeze(1)
            pos_k = torch.arange(start + n).unsqueeze(0)
            scores = (qi @ keys.transpose(1, 2)) / math.sqrt(dh)
            scores = scores.masked_fill(pos_k > pos_q, float("-inf"))
            outs.append((scores.softmax(-1) @ vals).transpose(0, 1).reshape(n, -1))
            at += n
        x = x + self.wo(torch.cat(outs))
        return x + self.w2(F.gelu(self.w1(self.ln2(x)))), k, v


class TinyDecoder(nn.Module):
    def __init__(self, cfg: TinyDecoderConfig):
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)


def doc_tokens(cfg: TinyDecoderConfig, doc: int, length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Input ids and target ids of document `doc` (deterministic)."""
    g = torch.Generator().manual_seed(cfg.seed * 1000003 + doc)
    ids = torch.randint(cfg.vocab, (length + 1,), generator=g)
    return ids[:-1], ids[1:]


def reference(cfg: TinyDecoderConfig, doc_lens: Sequence[int]):
    """Loss (mean over all tokens) and gradients of training on the whole
    documents, no pipeline, no chunks."""
    model = TinyDecoder(cfg)
    total = sum(doc_lens)
    loss = torch.zeros(())
    for d, n in enumerate(doc_lens):
        ids, labels = doc_tokens(cfg, d, n)
        x = model.embed(ids)
        for layer in model.layers:
            x, _, _ = layer(x, [(d, 0, n)], [([], [])])
        logits = model.head(model.norm(x))
        loss = loss + F.cross_entropy(logits, labels, reduction="sum") / total
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


def stage_parameter_names(cfg: TinyDecoderConfig, pp_size: int, stage: int) -> List[str]:
    """The parameters stage `stage` holds: its layers, the embedding on the
    first stage, the final norm and LM head on the last."""
    per = cfg.layers // pp_size
    names = []
    model = TinyDecoder(cfg)
    for name, _ in model.named_parameters():
        part = name.split(".")
        if part[0] == "layers":
            if stage * per <= int(part[1]) < (stage + 1) * per:
                names.append(name)
        elif part[0] == "embed":
            if stage == 0:
                names.append(name)
        elif stage == pp_size - 1:
            names.append(name)
    return names


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


class HeapMeter:
    """Bytes the C heap has in use (glibc mallinfo2: uordblks + hblkhd), where
    torch's CPU allocator puts every tensor; `sample` records the peak above
    `base` since the last `reset`. None where glibc has no mallinfo2."""

    def __init__(self):
        try:
            f = ctypes.CDLL("libc.so.6").mallinfo2
            f.restype = _MallInfo2
            self._f = f
        except (OSError, AttributeError):
            self._f = None
        self.base = 0
        self.peak = 0

    def available(self) -> bool:
        return self._f is not None

    def in_use(self) -> int:
        m = self._f()
        return int(m.uordblks + m.hblkhd)

    def sample(self) -> int:
        now = self.in_use() - self.base
        self.peak = max(self.peak, now)
        return now


@dataclass
class _Saved:
    inp: Optional[torch.Tensor]  # received activation (requires grad), None on stage 0
    out: torch.Tensor            # output, or the loss on the last stage
    kv: List[Tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)  # layer, K, V
    leaves: List[Tuple[Tuple[int, int, int], torch.Tensor, torch.Tensor]] = field(default_factory=list)


class Stage:
    """One pipeline stage: its layers, the K/V kept for later slices, and the
    dK/dV those slices return."""

    def __init__(self, cfg: TinyDecoderConfig, plan: dict, doc_lens: Sequence[int],
                 pp_size: int, stage: int):
        self.cfg, self.plan, self.doc_lens = cfg, plan, list(doc_lens)
        self.pp, self.stage = pp_size, stage
        self.model = TinyDecoder(cfg)
        per = cfg.layers // pp_size
        self.layer_ids = list(range(stage * per, (stage + 1) * per))
        self.total = sum(doc_lens)
        self.saved: Dict[int, _Saved] = {}
        # (doc, layer, slice start) -> K, V rows of an earlier slice (graph
        # tensors), and their accumulated gradients from later slices.
        self.kept: Dict[Tuple[int, int, int], Tuple[torch.Tensor, torch.Tensor]] = {}
        self.dkv: Dict[Tuple[int, int, int], List[torch.Tensor]] = {}
        self.sends: List[dist.Work] = []
        self.loss = 0.0
        self.started = 0.0
        self.meter: Optional[HeapMeter] = None  # set: sample the heap through the ops
        self.mem_ops: List[Tuple[int, bool, int, int]] = []  # chunk, backward, bytes before, after

    def slices(self, chunk: int) -> List[Slice]:
        return [(s["doc"], s["start"], s["len"]) for s in self.plan["chunks"][chunk]["slices"]]

    def tokens(self, chunk: int) -> int:
        return sum(n for _, _, n in self.slices(chunk))

    def forward(self, chunk: int):
        sl = self.slices(chunk)
        n = self.tokens(chunk)
        inp = None
        if self.stage == 0:
            ids = torch.cat([doc_tokens(self.cfg, d, self.doc_lens[d])[0][a:a + m] for d, a, m in sl])
            x = self.model.embed(ids)
        else:
            inp = torch.empty(n, self.cfg.hidden)
            dist.recv(inp, self.stage - 1)
            inp.requires_grad_()
            x = inp
        self.started = time.thread_time()  # compute starts once the input is here
        saved = _Saved(inp=inp, out=x)
        ckpt = self.plan["ckpt"][self.stage][chunk]
        for i, l in enumerate(self.layer_ids):
            ctx = []
            for d, a, _ in sl:
                ks, vs = [], []
                for (kd, kl, ka), (k, v) in sorted(self.kept.items()):
                    if kd == d and kl == l and ka < a:
                        kleaf, vleaf = k.detach().requires_grad_(), v.detach().requires_grad_()
                        saved.leaves.append(((kd, kl, ka), kleaf, vleaf))
                        ks.append(kleaf)
                        vs.append(vleaf)
                ctx.append((ks, vs))
            layer = self.model.layers[l]
            if i < ckpt:
                x, k, v = checkpoint(layer, x, sl, ctx, use_reentrant=False)
            else:
                x, k, v = layer(x, sl, ctx)
            if self.meter is not None:
                self.meter.sample()
                if x.requires_grad:  # again at this layer boundary in the backward
                    x.register_hook(self._sample_hook)
            at = 0
            for d, a, m in sl:
                if a + m < self.doc_lens[d]:  # a later slice attends to it
                    self.kept[(d, l, a)] = (k[at:at + m], v[at:at + m])
                at += m
            saved.kv.append((l, k, v))
        if self.stage == self.pp - 1:
            labels = torch.cat([doc_tokens(self.cfg, d, self.doc_lens[d])[1][a:a + m] for d, a, m in sl])
            logits = self.model.head(self.model.norm(x))
            saved.out = F.cross_entropy(logits, labels, reduction="sum") / self.total
            self.loss += saved.out.item()
        else:
            saved.out = x
            self.sends.append(dist.isend(x.detach().contiguous(), self.stage + 1))
        self.saved[chunk] = saved

    def _sample_hook(self, grad):
        self.meter.sample()
        return grad

    def backward(self, chunk: int):
        saved = self.saved.pop(chunk)
        sl = self.slices(chunk)
        tensors, grads = [saved.out], [None]
        if self.stage != self.pp - 1:
            g = torch.empty_like(saved.out)
            dist.recv(g, self.stage + 1)
            grads = [g]
        self.started = time.thread_time()
        # dK/dV that later slices returned to this chunk's kept slices.
        for l, k, v in saved.kv:
            gk, gv, any_kept = torch.zeros_like(k), torch.zeros_like(v), False
            at = 0
            for d, a, m in sl:
                acc = self.dkv.pop((d, l, a), None)
                self.kept.pop((d, l, a), None)
                if acc is not None:
                    gk[at:at + m], gv[at:at + m] = acc
                    any_kept = True
                at += m
            if any_kept:
                tensors += [k, v]
                grads += [gk, gv]
        torch.autograd.backward(tensors, grads)
        for key, kleaf, vleaf in saved.leaves:
            acc = self.dkv.get(key)
            if acc is None:
                self.dkv[key] = [kleaf.grad, vleaf.grad]
            else:
                acc[0] = acc[0] + kleaf.grad
                acc[1] = acc[1] + vleaf.grad
        if saved.inp is not None:
            self.sends.append(dist.isend(saved.inp.grad.contiguous(), self.stage - 1))

    def run(self, order: Sequence[Tuple[int, bool]]) -> List[Tuple[int, bool, float, float]]:
        """Runs the ops in order; returns (chunk, backward, wall seconds,
        compute seconds) per op. Compute: this thread's CPU time after the
        op's input or gradient arrived (torch runs one thread per rank), so
        that other processes on a loaded host do not count. With `meter`
        set, the heap is sampled at every op's start and end and at every
        layer boundary of both passes (so a layer's transient peak inside its
        backward is not seen)."""
        timed = []
        self.mem_ops = []
        for chunk, backward in order:
            before = self.meter.sample() if self.meter is not None else 0
            t0 = time.perf_counter()
            (self.backward if backward else self.forward)(chunk)
            timed.append((chunk, backward, time.perf_counter() - t0,
                          time.thread_time() - self.started))
            if self.meter is not None:
                self.mem_ops.append((chunk, backward, before, self.meter.sample()))
        for w in self.sends:
            w.wait()
        self.sends.clear()
        if self.saved or self.kept or self.dkv:
            raise RuntimeError(f"stage {self.stage}: ops left state behind (a bad op order)")
        return timed


def run_rank(job: dict, rank: int) -> dict:
    torch.set_num_threads(1)
    cfg = TinyDecoderConfig(**job["model"])
    pp = int(job["pp_size"])
    order = [(int(k), bool(b)) for k, b in job["orders"][rank]]
    dist.init_process_group("gloo", init_method="file://" + job["store"], rank=rank, world_size=pp)
    try:
        stage = Stage(cfg, job["plan"], job["doc_lens"], pp, rank)
        # A first iteration warms up (lazy imports, allocator); its gradients
        # and loss are dropped (zeroed in place: gradients stay allocated, so
        # the heap's base holds weights and gradients). The second one samples
        # the heap: its peak above the base is the stage's activation memory
        # (activations, kept K/V, dK/dV, logits, sends in flight). The third
        # one is timed and compared.
        stage.run(order)
        meter = HeapMeter()
        peak_bytes, mem_ops = None, []
        if meter.available():
            stage.model.zero_grad(set_to_none=False)
            stage.loss = 0.0
            dist.barrier()
            meter.base = meter.in_use()
            stage.meter = meter
            stage.run(order)
            stage.meter = None
            peak_bytes, mem_ops = meter.peak, stage.mem_ops
        stage.model.zero_grad(set_to_none=False)
        stage.loss = 0.0
        dist.barrier()
        t0 = time.perf_counter()
        timed = stage.run(order)
        seconds = time.perf_counter() - t0
        dist.barrier()
    finally:
        dist.destroy_process_group()
    ref_loss, ref_grads = reference(cfg, job["doc_lens"])
    errors = {}
    mine = set(stage_parameter_names(cfg, pp, rank))
    for name, p in stage.model.named_parameters():
        if name not in mine:
            continue
        ref = ref_grads[name]
        got = p.grad if p.grad is not None else torch.zeros_like(ref)
        errors[name] = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    return {"rank": rank, "loss": stage.loss if rank == pp - 1 else None, "ref_loss": ref_loss,
            "grad_rel_err": errors, "seconds": seconds, "peak_activation_bytes": peak_bytes,
            "mem_ops": [list(m) for m in mem_ops],
            "ops": [[k, b, s, c] for k, b, s, c in timed]}


def run_plan(plan: dict, doc_lens: Sequence[int], pp_size: int, model: TinyDecoderConfig,
             workdir: str, timeout_s: float = 300) -> List[dict]:
    """Runs `plan` on pp_size processes (python -m flashcp.torch.pipeline)
    and returns each rank's result (run_rank), rank order. RuntimeError
    naming the rank when one fails or times out."""
    import subprocess
    import sys

    from flashcp import pipeline_stage_order  # the native 1F1B order, one place

    job = {"plan": plan, "pp_size": pp_size, "doc_lens": list(doc_lens),
           "model": model.__dict__, "orders": pipeline_stage_order(plan, pp_size),
           "store": os.path.join(workdir, "store"), "out": workdir}
    path = os.path.join(workdir, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "flashcp.torch.pipeline", "--job", path,
                               "--rank", str(r)], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(pp_size)]
    deadline = time.monotonic() + timeout_s
    errors = []
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"pipeline rank {r}: no result in {timeout_s} s") from None
        if p.returncode != 0:
            errors.append(f"rank {r} exited {p.returncode}: {err[-2000:]}")
    if errors:
        raise RuntimeError("; ".join(errors))
    out = []
    for r in range(pp_size):
        with open(os.path.join(workdir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--rank", type=int, required=True)
    a = ap.parse_args(argv)
    with open(a.job) as f:
        job = json.load(f)
    out = run_rank(job, a.rank)
    path = os.path.join(job["out"], f"rank{a.rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
