"""A mixed plan's "two_level" group (core/two_level.h): the all-to-all
within each node's part of the group, the KV across nodes.

This rank's layout is worker/two_level_layout.h's, through the native
module (CpContext.two_level_layout): the all-to-all of _all_to_all.py over
this rank's node part (its tokens in head-parallel rows by document and
position), then one batch_isend_irecv with the same position of every
other node part carrying [K | V] of this position's KV heads for exactly
the runs core::TwoLevelNeeds names (the analyzer's own), the prefixed runs
staged from head-parallel and received rows, attention on the CPU kernels
(CpuAttention over the layout's whole and prefixed runs), and the output
back to its owners. Backward mirrors it: the received rows' gradients go
back across nodes (the targeted exchange's return, _attention.py), then
dQ, dK, dV to the tokens' owners. The bytes, forward plus backward, are
core::GroupedSchemeBytes' for the group (TwoLevelGroupPhase).
"""
import torch

from flashcp._native import native
from flashcp.torch._all_to_all import A2aPlan, _ToHeads, _ToTokens
from flashcp.torch._context import CpContext


@torch.compiler.disable  # torch.compile: runs eagerly (a graph break), not traced
def attention_two_level(q, k, v, ctx: CpContext, scale: float, ranks) -> torch.Tensor:
    """attention() of this rank's two_level group `ranks` on CPU tensors
    (checked by the caller)."""
    from flashcp.torch._attention import _Exchange, _LocalAttention
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    lay = ctx.two_level_layout(ranks)
    key = (hq, hkv, d, "two_level", tuple(ranks))
    a = ctx._a2a.get(key)
    if a is None:
        a = ctx._a2a[key] = A2aPlan(ctx, hq, hkv, d, lay.native)
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
