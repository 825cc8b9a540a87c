"""What each rank runs in test_cuda_all_to_all.py (harness.run): the
all_to_all scheme and mixed plans on CUDA tensors against the CPU path."""
import torch

import flashcp.torch as ft
from cases import global_inputs


def cuda_against_cpu_cases(rank, n, specs):
    """Per spec, attention() on cuda:0 (bf16) and on the CPU (fp32 on the
    same bf16 values), forward and backward, scheme spec["scheme"] (a name
    or a mixed plan): ("ok", max abs errors of O, dQ, dK, dV, the CPU
    result's max abs of each, {device: (bytes sent, bytes received)},
    whether this position's query heads read their KV heads in cuDNN's GQA
    order), or ("refused", {device: (type, message)}) where a device's call
    raised (both are expected to refuse alike)."""
    from flashcp.torch._all_to_all import A2aPlan
    out = {}
    for key, spec in specs.items():
        lens = spec["doc_lens"]
        hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
        ctx = ft.CpContext(spec["plan"], rank, doc_lens=lens)
        q, k, v, dout = (ft.dispatch(t, ctx) for t in
                         global_inputs(sum(lens), hq, hkv, d, spec["seed"], torch.bfloat16))
        runs, moved, refused = {}, {}, {}
        for dev, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
            ql, kl, vl = (t.to(dev, dtype).requires_grad_() for t in (q, k, v))
            sent, received = ctx.stats.bytes_sent, ctx.stats.bytes_received
            try:
                o = ft.attention(ql, kl, vl, ctx, scheme=spec["scheme"])
            except RuntimeError as e:  # raised before any collective, on both devices
                refused[dev] = (type(e).__name__, str(e))
                continue
            o.backward(dout.to(dev, dtype))
            if dev == "cuda":
                torch.cuda.synchronize()
            runs[dev] = [t.detach().float().cpu() for t in (o, ql.grad, kl.grad, vl.grad)]
            moved[dev] = (ctx.stats.bytes_sent - sent, ctx.stats.bytes_received - received)
        if refused:
            out[key] = ("refused", refused)
            continue
        err = [float((a - b).abs().max()) for a, b in zip(runs["cuda"], runs["cpu"])]
        ref = [float(b.abs().max()) for b in runs["cpu"]]
        gqa = A2aPlan(ctx, hq, hkv, d).gqa_order if spec["scheme"] == "all_to_all" else None
        out[key] = ("ok", err, ref, moved, gqa)
    return out


class KernelDouble:
    """A test double of the whole-shard CUDA attention as the binding's
    CudaAttention takes it (buffers as (address, count), bf16 storage, fp32
    LSE, cuDNN's GQA: query head a reads KV head a // (nq / nk)), computed
    in torch on the CPU: causal attention per document over the
    head-parallel rows, whose documents are `doc_lens` in order. Checks
    every count as the binding does (CudaBufferCheck) and that only the
    whole-shard group runs."""

    def __init__(self, doc_lens, heads_q, heads_kv, head_dim, scale):
        self.doc_lens, self.hq, self.hkv, self.d = list(doc_lens), heads_q, heads_kv, head_dim
        self.rows, self.scale = sum(doc_lens), scale

    def _t(self, buf, heads, dtype=torch.bfloat16):
        import ctypes
        addr, count = buf
        shape = (self.rows, heads, self.d) if dtype == torch.bfloat16 else (self.rows, heads)
        assert count == int(torch.Size(shape).numel()), (count, shape)
        raw = (ctypes.c_uint16 if dtype == torch.bfloat16 else ctypes.c_float) * count
        return torch.frombuffer(raw.from_address(addr), dtype=dtype).view(shape)

    def _attend(self, q, k, v):
        g = self.hq // self.hkv
        o, lse, at = [], [], 0
        for n in self.doc_lens:
            qs = q[at:at + n].transpose(0, 1)  # [hq, n, d]
            ks = k[at:at + n].repeat_interleave(g, dim=1).transpose(0, 1)
            vs = v[at:at + n].repeat_interleave(g, dim=1).transpose(0, 1)
            s = (qs @ ks.transpose(1, 2)) * self.scale
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            lse.append(torch.logsumexp(s, -1).transpose(0, 1))
            o.append((torch.softmax(s, -1) @ vs).transpose(0, 1))
            at += n
        return torch.cat(o), torch.cat(lse)

    def forward(self, q, k, v, ks, vs, o, lse, stream, groups):
        from flashcp._native import native
        assert (ks, vs, stream, groups) == ((0, 0), (0, 0), 0, native().CUDA_WHOLE_SHARDS)
        out, l = self._attend(self._t(q, self.hq).float(), self._t(k, self.hkv).float(),
                              self._t(v, self.hkv).float())
        self._t(o, self.hq).copy_(out)
        self._t(lse, self.hq, torch.float32).copy_(l)

    def backward(self, q, k, v, ks, vs, o, lse, dout, dq, dk, dv, dks, dvs, stream, groups):
        from flashcp._native import native
        assert (ks, vs, dks, dvs, stream, groups) == ((0, 0),) * 4 + (0, native().CUDA_WHOLE_SHARDS)
        self._t(o, self.hq)  # counts checked
        self._t(lse, self.hq, torch.float32)
        with torch.enable_grad():  # called from inside autograd's backward
            x = [self._t(b, h).float().requires_grad_() for b, h in
                 ((q, self.hq), (k, self.hkv), (v, self.hkv))]
            out, _ = self._attend(*x)
            grads = torch.autograd.grad(out, x, self._t(dout, self.hq).float())
        for buf, h, g in zip((dq, dk, dv), (self.hq, self.hkv, self.hkv), grads):
            self._t(buf, h).copy_(g)


def kernel_double_cases(rank, n, specs):
    """flashcp.torch's CUDA all_to_all composition (attention_on_kernels:
    the head exchange, the GQA choice, the kernels' autograd node) on CPU
    bf16 tensors with KernelDouble in place of the cuDNN kernels, against
    dense attention in fp32: per spec, max abs errors of O, dQ, dK, dV, the
    reference's max abs, the (query, KV) heads the kernel was made for,
    and this position's (query, KV) heads and gqa_order."""
    from flashcp.torch import _all_to_all as a2a
    from cases import reference
    out = {}
    for key, spec in specs.items():
        lens = spec["doc_lens"]
        hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
        ctx = ft.CpContext(spec["plan"], rank, doc_lens=lens)
        q, k, v, dout = global_inputs(sum(lens), hq, hkv, d, spec["seed"], torch.bfloat16)
        want = [ft.dispatch(t, ctx) for t in reference(q, k, v, dout, lens)]
        ql, kl, vl = (ft.dispatch(t, ctx).requires_grad_() for t in (q, k, v))
        a = a2a.a2a_plan(ctx, hq, hkv, d)
        # The group's documents by id, each whole: the head-parallel rows.
        docs = sorted({doc for doc, _, _, r in ctx.plan.shards if r in a.group})
        group_lens = [ctx.plan.doc_lens[x] for x in docs]
        assert sum(group_lens) == a.rows
        made = []

        def kernel_of(heads_q, heads_kv):
            made.append((heads_q, heads_kv))
            return KernelDouble(group_lens, heads_q, heads_kv, d, d ** -0.5)

        o = a2a.attention_on_kernels(ql, kl, vl, ctx, a, kernel_of)
        o.backward(ft.dispatch(dout, ctx))
        got = [o.detach(), ql.grad, kl.grad, vl.grad]
        out[key] = {"err": [float((x.float() - y).abs().max()) for x, y in zip(got, want)],
                    "ref": [float(y.abs().max()) for y in want], "made": made,
                    "heads": (a.heads[a.pos][1], a.heads[a.pos][3]), "gqa": a.gqa_order}
    return out
