"""A mixed plan's "two_level" group (core/two_level.h): the all-to-all
within each node's part of the group, the KV across nodes.

This rank's layout is worker/two_level_layout.h's, through the native
module (CpContext.two_level_layout): the all-to-all of _all_to_all.py over
this rank's node part (its tokens in head-parallel rows by document and
position), then one batch_isend_irecv with the same position of every
other node part carrying [K | V] of this position's KV heads for exactly
the runs core::TwoLevelNeeds names (the analyzer's own), the prefixed runs
staged from head-parallel and received rows, attention over the layout's
whole and prefixed runs, and the output back to its owners. Backward
mirrors it: the received rows' gradients go back across nodes (the
targeted exchange's return, _attention.py), then dQ, dK, dV to the
tokens' owners. The bytes, forward plus backward, are
core::GroupedSchemeBytes' for the group (TwoLevelGroupPhase).

CPU tensors: the CPU kernels (CpuAttention, fp32). CUDA tensors (bf16):
the cuDNN shard kernels over the head-parallel rows (the layout's whole
and prefixed batches; CpContext.two_level_cuda_kernel), every exchange
the same grouped batch_isend_irecv (NCCL-safe; host-staged over gloo),
on the current stream: two_level_on_kernels, whose composition runs on
the CPU with a test double of the kernels (test_two_level_kernels.py).
The CUDA path has not run on a GPU yet (docs/gpu.md).
"""
from typing import Any, Callable

import torch

from flashcp._native import native
from flashcp.torch._all_to_all import A2aPlan, _on_device, _stream, _ToHeads, _ToTokens
from flashcp.torch._context import CpContext


def two_level_plan(ctx: CpContext, hq: int, hkv: int, d: int, ranks) -> A2aPlan:
    """ctx's A2aPlan of the two-level group `ranks` under (Hq, Hkv, D): the
    all-to-all over this rank's node part (made once)."""
    key = (hq, hkv, d, "two_level", tuple(ranks))
    a = ctx._a2a.get(key)
    if a is None:
        a = ctx._a2a[key] = A2aPlan(ctx, hq, hkv, d, ctx.two_level_layout(ranks).native)
    return a


@torch.compiler.disable  # torch.compile: runs eagerly (a graph break), not traced
def attention_two_level(q, k, v, ctx: CpContext, scale: float, ranks) -> torch.Tensor:
    """attention() of this rank's two_level group `ranks` on CPU tensors,
    or bf16 CUDA tensors (checked by the caller)."""
    from flashcp.torch._attention import _Exchange, _LocalAttention
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    lay = ctx.two_level_layout(ranks)
    a = two_level_plan(ctx, hq, hkv, d, ranks)
    if q.is_cuda:
        def kernel_of(heads_q: int, heads_kv: int):
            with torch.cuda.device(q.device):
                return ctx.two_level_cuda_kernel(ranks, heads_q, heads_kv, d, scale, q.device)
        return two_level_on_kernels(q, k, v, ctx, a, lay, kernel_of)
    nq, nk = a.heads[a.pos][1], a.heads[a.pos][3]
    kkey = ("two_level", tuple(ranks), nq, d, float(scale))
    kernel = ctx._kernels.get(kkey)
    if kernel is None:  # the layout's whole and prefixed runs over the S head-parallel rows
        kernel = ctx._kernels[kkey] = native().CpuAttention(lay.native, nq, d, float(scale),
                                                            ctx.threads)
    qh, kh, vh = _ToHeads.apply(q, k, v, ctx, a)
    # Across nodes: [K | V] of this position's heads for the runs others need.
    kv = torch.cat([kh, vh], dim=1)
    pack_index, stage_index = lay.indices(q.device)
    recv = _Exchange.apply(kv.index_select(0, pack_index), ctx, lay)
    stage = torch.cat([kv, recv]).index_select(0, stage_index)
    f32 = torch.float32

    def per_query_head(t):  # GQA: KV per query head of this position
        return t.index_select(1, a.kv_of).to(f32).contiguous()

    oh = _LocalAttention.apply(qh.to(f32).contiguous(), per_query_head(kh), per_query_head(vh),
                               per_query_head(stage[:, :nk]), per_query_head(stage[:, nk:]),
                               kernel, ctx.stats)
    ctx.stats.calls += 1
    return _ToTokens.apply(oh.to(q.dtype), ctx, a)


class _KernelShardAttention(torch.autograd.Function):
    """The device kernels over the two-level layout's head-parallel rows,
    both shard groups on the current stream: whole batches (keys in kh, vh)
    and prefixed batches (keys staged in ks, vs). qh [S, nq, D], kh, vh
    [S, nk, D], ks, vs [stage rows, nk, D], contiguous, nk dividing nq
    (cuDNN's GQA); `kernel` as _context.cuda_kernel's. Each group writes
    its own o, lse, dq buffers, merged by index (whole_rows from the whole
    group), so neither depends on rows the other kernel does not own."""

    @staticmethod
    def forward(fctx, qh, kh, vh, ks, vs, kernel, whole_rows):
        from flashcp.torch._attention import _NONE, _buf
        mod = native()
        with _on_device(qh):
            s = _stream(qh)
            o_w, o_p = torch.zeros_like(qh), torch.zeros_like(qh)
            lse_w = torch.zeros(qh.shape[0], qh.shape[1], dtype=torch.float32, device=qh.device)
            lse_p = torch.zeros_like(lse_w)
            kernel.forward(_buf(qh), _buf(kh), _buf(vh), _NONE, _NONE, _buf(o_w), _buf(lse_w),
                           s, mod.CUDA_WHOLE_SHARDS)
            kernel.forward(_buf(qh), _NONE, _NONE, _buf(ks), _buf(vs), _buf(o_p), _buf(lse_p),
                           s, mod.CUDA_PREFIXED_SHARDS)
            o = o_p.index_copy(0, whole_rows, o_w.index_select(0, whole_rows))
        fctx.kernel, fctx.whole_rows = kernel, whole_rows
        fctx.save_for_backward(qh, kh, vh, ks, vs, o_w, lse_w, o_p, lse_p)
        return o

    @staticmethod
    def backward(fctx, dout):
        from flashcp.torch._attention import _NONE, _buf
        mod = native()
        qh, kh, vh, ks, vs, o_w, lse_w, o_p, lse_p = fctx.saved_tensors
        kernel, whole_rows = fctx.kernel, fctx.whole_rows
        with _on_device(qh):
            s = _stream(qh)
            dout = dout.to(qh.dtype).contiguous()
            dq_w, dq_p = torch.zeros_like(qh), torch.zeros_like(qh)
            dk, dv = torch.zeros_like(kh), torch.zeros_like(vh)
            dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
            kernel.backward(_buf(qh), _NONE, _NONE, _buf(ks), _buf(vs), _buf(o_p), _buf(lse_p),
                            _buf(dout), _buf(dq_p), _NONE, _NONE, _buf(dks), _buf(dvs), s,
                            mod.CUDA_PREFIXED_SHARDS)
            kernel.backward(_buf(qh), _buf(kh), _buf(vh), _NONE, _NONE, _buf(o_w), _buf(lse_w),
                            _buf(dout), _buf(dq_w), _buf(dk), _buf(dv), _NONE, _NONE, s,
                            mod.CUDA_WHOLE_SHARDS)
            dq = dq_p.index_copy(0, whole_rows, dq_w.index_select(0, whole_rows))
        return dq, dk, dv, dks, dvs, None, None


def two_level_on_kernels(q, k, v, ctx: CpContext, a: A2aPlan, lay,
                         kernel_of: Callable[[int, int], Any]) -> torch.Tensor:
    """The two-level step with the attention on device kernels: `a` the
    all-to-all over this rank's node part (two_level_plan), `lay` the
    group's SchemeLayout (CpContext.two_level_layout), kernel_of(query
    heads, KV heads) this position's kernels over lay (the CUDA path:
    CpContext.two_level_cuda_kernel; a test double on the CPU). The KV
    exchange across nodes is _attention.py's _Exchange over lay's KV-row
    fields (grouped batch_isend_irecv both ways). In backward the staging's
    gradients are summed in fp32 (a head-parallel row may be staged for
    several prefixed runs) and rounded to bf16 once, then added to the
    whole batches' dK, dV. KV heads go in as they are where
    a.gqa_order holds, else one copy per query head."""
    from flashcp.torch._attention import _Exchange
    qh, kh, vh = _ToHeads.apply(q, k, v, ctx, a)
    nk = kh.shape[1]
    kv = torch.cat([kh, vh], dim=1)
    pack_index, stage_index = lay.indices(q.device)
    recv = _Exchange.apply(kv.index_select(0, pack_index), ctx, lay)
    stage = torch.cat([kv.float(), recv.float()]).index_select(0, stage_index).to(kv.dtype)
    ks, vs = stage[:, :nk], stage[:, nk:]
    if not a.gqa_order:  # KV per query head
        kv_of = a.index(q.device)[1]
        kh, vh, ks, vs = (t.index_select(1, kv_of) for t in (kh, vh, ks, vs))
    kh, vh, ks, vs = (t.contiguous() for t in (kh, vh, ks, vs))
    oh = _KernelShardAttention.apply(qh, kh, vh, ks, vs, kernel_of(qh.shape[1], kh.shape[1]),
                                     lay.whole_rows_on(q.device))
    ctx.stats.calls += 1
    return _ToTokens.apply(oh, ctx, a)
