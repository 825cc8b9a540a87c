"""What each rank runs in test_two_level_kernels.py (the CUDA two-level
composition on the CPU with a kernel test double) and test_cuda_two_level.py
(on cuda:0, marked gpu)."""
import ctypes

import torch

import flashcp.torch as ft
from cases import global_inputs, reference


class ShardKernelDouble:
    """A test double of the cuDNN shard kernels as CpContext.two_level_cuda_kernel
    gives them (the binding's CudaAttentionCache interface: buffers as
    (address, count), bf16 storage, fp32 LSE, cuDNN's GQA: query head a
    reads KV head a // (nq / nk)), computed in torch on the CPU over one
    layout's batches: whole (start, rows) attend their own rows causally;
    prefixed (first query row, query rows, staged rows) attend their staged
    rows (contiguous, in batch order), query j the first staged - rows + j + 1.
    Checks every count as the binding does, and that only the asked group
    runs; rows a call does not own are written NaN (the caller must merge
    by index, as the real kernels promise nothing there)."""

    def __init__(self, lay, rows, heads_q, heads_kv, head_dim, scale):
        self.whole = list(lay.whole_batches)
        self.prefix = list(lay.prefix_batches)
        self.stage_rows = sum(kv for _, _, kv in self.prefix)
        assert self.stage_rows == len(lay.stage_src) // 8  # int64 bytes
        self.rows, self.hq, self.hkv, self.d, self.scale = rows, heads_q, heads_kv, head_dim, scale
        self.calls = []

    def _t(self, buf, rows, heads, dtype=torch.bfloat16):
        addr, count = buf
        shape = (rows, heads, self.d) if dtype == torch.bfloat16 else (rows, heads)
        assert count == int(torch.Size(shape).numel()), (count, shape)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        raw = (ctypes.c_uint16 if dtype == torch.bfloat16 else ctypes.c_float) * count
        return torch.frombuffer(raw.from_address(addr), dtype=dtype).view(shape)

    def _one(self, q, k, v, diag):
        """q [n, hq, d], k, v [m, hkv, d], query j sees keys [0, diag + j]."""
        g = self.hq // self.hkv
        qs = q.transpose(0, 1)
        ks = k.repeat_interleave(g, dim=1).transpose(0, 1)
        vs = v.repeat_interleave(g, dim=1).transpose(0, 1)
        s = (qs @ ks.transpose(1, 2)) * self.scale
        n, m = q.shape[0], k.shape[0]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(diag + 1), float("-inf"))
        return (torch.softmax(s, -1) @ vs).transpose(0, 1), torch.logsumexp(s, -1).transpose(0, 1)

    def _attend(self, q, k, v, whole):
        """Per batch of the group: (query rows, o, lse)."""
        out = []
        if whole:
            for start, n in self.whole:
                o, lse = self._one(q[start:start + n], k[start:start + n], v[start:start + n], 0)
                out.append((slice(start, start + n), o, lse))
        else:
            at = 0
            for start, n, kv in self.prefix:
                o, lse = self._one(q[start:start + n], k[at:at + kv], v[at:at + kv], kv - n)
                out.append((slice(start, start + n), o, lse))
                at += kv
        return out

    def _group(self, groups):
        from flashcp._native import native
        m = native()
        assert groups in (m.CUDA_WHOLE_SHARDS, m.CUDA_PREFIXED_SHARDS), groups
        return groups == m.CUDA_WHOLE_SHARDS

    def _kv(self, whole, k, v):
        rows = self.rows if whole else self.stage_rows
        return self._t(k, rows, self.hkv).float(), self._t(v, rows, self.hkv).float()

    def forward(self, q, k, v, ks, vs, o, lse, stream, groups):
        whole = self._group(groups)
        assert stream == 0
        if whole:
            assert (ks, vs) == ((0, 0), (0, 0))
        else:
            assert (k, v) == ((0, 0), (0, 0))
        self.calls.append(("forward", whole))
        kf, vf = self._kv(whole, *((k, v) if whole else (ks, vs)))
        ot, lt = self._t(o, self.rows, self.hq), self._t(lse, self.rows, self.hq, torch.float32)
        ot.fill_(float("nan"))
        lt.fill_(float("nan"))
        for rows, ob, lb in self._attend(self._t(q, self.rows, self.hq).float(), kf, vf, whole):
            ot[rows] = ob.to(ot.dtype)
            lt[rows] = lb

    def backward(self, q, k, v, ks, vs, o, lse, dout, dq, dk, dv, dks, dvs, stream, groups):
        whole = self._group(groups)
        assert stream == 0
        if whole:
            assert (ks, vs, dks, dvs) == ((0, 0),) * 4
        else:
            assert (k, v, dk, dv) == ((0, 0),) * 4
        self.calls.append(("backward", whole))
        self._t(o, self.rows, self.hq)  # counts checked
        self._t(lse, self.rows, self.hq, torch.float32)
        kb, vb, dkb, dvb = (k, v, dk, dv) if whole else (ks, vs, dks, dvs)
        kv_rows = self.rows if whole else self.stage_rows
        with torch.enable_grad():  # called from inside autograd's backward
            x = [self._t(q, self.rows, self.hq).float().requires_grad_(),
                 self._t(kb, kv_rows, self.hkv).float().requires_grad_(),
                 self._t(vb, kv_rows, self.hkv).float().requires_grad_()]
            parts = self._attend(*x, whole)
            do = self._t(dout, self.rows, self.hq).float()
            if parts:
                grads = torch.autograd.grad([ob for _, ob, _ in parts],
                                            x, [do[rows] for rows, _, _ in parts],
                                            allow_unused=True)
            else:
                grads = [None] * 3
        dqt = self._t(dq, self.rows, self.hq)
        owned = torch.zeros(self.rows, dtype=torch.bool)
        for rows, _, _ in parts:
            owned[rows] = True
        g0 = grads[0] if grads[0] is not None else torch.zeros(dqt.shape)
        dqt.copy_(torch.where(owned[:, None, None], g0, float("nan")).to(dqt.dtype))
        for buf, g in ((dkb, grads[1]), (dvb, grads[2])):
            t = self._t(buf, kv_rows, self.hkv)
            t.copy_(g if g is not None else torch.zeros(t.shape))


def kernel_double_cases(rank, n, specs):
    """flashcp.torch's CUDA two-level composition (two_level_on_kernels:
    the node part's head exchange, the KV across nodes, the staging, the GQA
    choice, the kernels' autograd node) on CPU bf16 tensors with
    ShardKernelDouble in place of the cuDNN kernels, against dense
    attention in fp32: per spec, max abs errors of O, dQ, dK, dV, the
    reference's max abs, the (query, KV) heads the kernel was made for,
    this position's (query, KV) heads and gqa_order, the kernel calls, the
    bytes sent and received, and the layout's whole and prefixed batch
    counts. A rank outside spec["ranks"] (the two-level group) runs its
    group's scheme of the mixed plan spec["scheme"] through attention()
    (CPU kernels): errors, reference and bytes only."""
    from flashcp.torch import _two_level as tl
    out = {}
    for key, spec in specs.items():
        lens = spec["doc_lens"]
        hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
        ctx = ft.CpContext(spec["plan"], rank, doc_lens=lens,
                           ranks_per_node=spec["ranks_per_node"])
        q, k, v, dout = global_inputs(sum(lens), hq, hkv, d, spec["seed"], torch.bfloat16)
        want = [ft.dispatch(t, ctx) for t in reference(q, k, v, dout, lens)]
        ql, kl, vl = (ft.dispatch(t, ctx).requires_grad_() for t in (q, k, v))
        ranks = spec["ranks"]
        if rank not in ranks:  # another group of the mixed plan: its own (CPU) scheme
            o = ft.attention(ql, kl, vl, ctx, scheme=spec["scheme"])
            o.backward(ft.dispatch(dout, ctx))
            got = [o.detach(), ql.grad, kl.grad, vl.grad]
            out[key] = {"err": [float((x.float() - y).abs().max()) for x, y in zip(got, want)],
                        "ref": [float(y.abs().max()) for y in want],
                        "moved": (ctx.stats.bytes_sent, ctx.stats.bytes_received)}
            continue
        lay = ctx.two_level_layout(ranks)
        a = tl.two_level_plan(ctx, hq, hkv, d, ranks)
        made, doubles = [], []

        def kernel_of(heads_q, heads_kv):
            made.append((heads_q, heads_kv))
            doubles.append(ShardKernelDouble(lay.native, a.rows, heads_q, heads_kv, d,
                                             d ** -0.5))
            return doubles[-1]

        o = tl.two_level_on_kernels(ql, kl, vl, ctx, a, lay, kernel_of)
        o.backward(ft.dispatch(dout, ctx))
        got = [o.detach(), ql.grad, kl.grad, vl.grad]
        out[key] = {"err": [float((x.float() - y).abs().max()) for x, y in zip(got, want)],
                    "ref": [float(y.abs().max()) for y in want], "made": made,
                    "heads": (a.heads[a.pos][1], a.heads[a.pos][3]), "gqa": a.gqa_order,
                    "calls": doubles[0].calls,
                    "moved": (ctx.stats.bytes_sent, ctx.stats.bytes_received),
                    "batches": (len(lay.native.whole_batches), len(lay.native.prefix_batches))}
    return out


def cuda_against_cpu_cases(rank, n, specs):
    """Per spec, attention() with the mixed plan spec["scheme"] on cuda:0
    (bf16) and on the CPU (fp32 on the same bf16 values), forward and
    backward, CpContext(ranks_per_node=spec["ranks_per_node"]): ("ok", max
    abs errors of O, dQ, dK, dV, the CPU result's max abs of each, {device:
    (bytes sent, bytes received)})."""
    out = {}
    for key, spec in specs.items():
        lens = spec["doc_lens"]
        hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
        ctx = ft.CpContext(spec["plan"], rank, doc_lens=lens,
                           ranks_per_node=spec["ranks_per_node"])
        q, k, v, dout = (ft.dispatch(t, ctx) for t in
                         global_inputs(sum(lens), hq, hkv, d, spec["seed"], torch.bfloat16))
        runs, moved = {}, {}
        for dev, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
            ql, kl, vl = (t.to(dev, dtype).requires_grad_() for t in (q, k, v))
            sent, received = ctx.stats.bytes_sent, ctx.stats.bytes_received
            o = ft.attention(ql, kl, vl, ctx, scheme=spec["scheme"])
            o.backward(dout.to(dev, dtype))
            if dev == "cuda":
                torch.cuda.synchronize()
            runs[dev] = [t.detach().float().cpu() for t in (o, ql.grad, kl.grad, vl.grad)]
            moved[dev] = (ctx.stats.bytes_sent - sent, ctx.stats.bytes_received - received)
        err = [float((a - b).abs().max()) for a, b in zip(runs["cuda"], runs["cpu"])]
        ref = [float(b.abs().max()) for b in runs["cpu"]]
        out[key] = ("ok", err, ref, moved)
    return out
