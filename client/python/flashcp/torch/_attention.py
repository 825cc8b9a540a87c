"""attention(): the CP attention step as autograd ops.

Forward: pack the K|V rows this rank sends (the native layout's pack_rows),
exchange them (targeted: isend/irecv with exactly the ranks that need
them; allgather / full_kv: one all_gather_into_tensor of equal blocks),
stage every prefixed shard's keys [prefix pieces, own rows] (stage_src),
then the kernels attend each shard to its prefix plus itself: on CPU the
project's CPU kernels (fp32), on CUDA the project's cuDNN path (bf16,
worker/cuda/shard_attention.h through the binding's CUDA hook). Backward,
through autograd: the kernels' dQ, dK, dV; the staging's gradients
index-added back onto local rows and the receive buffer; the receive
buffer's gradients returned to their owners by the mirror exchange.
"""
import math
from typing import Optional

import torch
import torch.distributed as dist

from flashcp.torch._context import CpContext, ExchangeError


def _p2p(ctx: CpContext, send, recv, what: str) -> None:
    """send/recv: lists of (group rank, tensor). Starts every isend and
    irecv, then waits on each; a failure (at start or wait, each bounded by
    the group's timeout) raises ExchangeError naming that peer."""
    works = []
    for op, items in ((dist.isend, send), (dist.irecv, recv)):
        for peer, t in items:
            try:
                works.append((peer, op(t, ctx.global_ranks[peer], ctx.group)))
            except RuntimeError as e:
                raise ExchangeError(f"rank {ctx.rank}: {what} with rank {peer} failed: {e}") from e
    for peer, work in works:
        try:
            work.wait()
        except RuntimeError as e:
            raise ExchangeError(f"rank {ctx.rank}: {what} with rank {peer} failed: {e}") from e


_PROBE_TAG = 0x5CF1  # the failure probe's messages, apart from the exchange's (tag 0)


def _gather_failed(ctx: CpContext, what: str, e: Exception) -> ExchangeError:
    # A failed collective does not say which peer failed (gloo names an
    # address). Probe every peer point to point (one element each way, every
    # wait bounded by the group's timeout): the peers whose transfer fails
    # are named. Ranks that failed the same collective probe each other too.
    failed = []
    one = torch.zeros(1)
    peers = [p for p in range(ctx.size) if p != ctx.rank]
    for p in peers:
        try:
            send = dist.isend(one, ctx.global_ranks[p], ctx.group, tag=_PROBE_TAG)
            recv = dist.irecv(torch.zeros(1), ctx.global_ranks[p], ctx.group, tag=_PROBE_TAG)
            send.wait()
            recv.wait()
        except RuntimeError:
            failed.append(p)
    named = (f"; no answer from rank{'s' if len(failed) > 1 else ''} "
             f"{', '.join(map(str, failed))}") if failed else ""
    return ExchangeError(f"rank {ctx.rank}: {what} over the group of {ctx.size} failed"
                         f"{named}: {e}")


class _Exchange(torch.autograd.Function):
    """pack [P, W] -> recv [R, W] (forward KV), and the mirror backward."""

    @staticmethod
    def forward(fctx, pack, ctx: CpContext, lay):
        fctx.ctx, fctx.lay = ctx, lay
        w = pack.shape[1:]
        recv = pack.new_zeros((lay.recv_rows,) + tuple(w))
        if ctx.size == 1:
            if lay.gather:
                recv.copy_(pack)
            return recv
        if lay.gather:
            try:
                dist.all_gather_into_tensor(recv, pack.contiguous(), group=ctx.group)
            except RuntimeError as e:
                raise _gather_failed(ctx, "forward KV all-gather", e) from e
        else:
            send = [(p, pack[first:first + rows]) for p, first, rows in lay.sends]
            rcv = [(p, recv[first:first + rows]) for p, first, rows in lay.recvs]
            _p2p(ctx, send, rcv, "forward KV exchange")
        return recv

    @staticmethod
    def backward(fctx, grad_recv):
        ctx, lay = fctx.ctx, fctx.lay
        g = grad_recv.contiguous()
        if ctx.size == 1:
            return (g.clone() if lay.gather else g.new_zeros((0,) + tuple(g.shape[1:]))), None, None
        if lay.gather:
            # Block j of g holds this rank's gradients of rank j's KV: send it
            # back to j (all-to-all), and sum what comes back in rank order.
            out = torch.empty_like(g)
            try:
                dist.all_to_all_single(out, g, group=ctx.group)
            except RuntimeError as e:
                raise _gather_failed(ctx, "backward dK/dV return", e) from e
            return out.view(ctx.size, lay.block_rows, *g.shape[1:]).sum(0), None, None
        rows = sum(r for _, _, r in lay.sends)
        grad_pack = g.new_zeros((rows,) + tuple(g.shape[1:]))
        send = [(p, g[first:first + r]) for p, first, r in lay.recvs]
        rcv = [(p, grad_pack[first:first + r]) for p, first, r in lay.sends]
        _p2p(ctx, send, rcv, "backward dK/dV return")
        return grad_pack, None, None


class _LocalAttention(torch.autograd.Function):
    """The CPU kernels over whole shards (keys in k, v) and prefixed shards
    (keys in k_stage, v_stage); Q and KV heads equal, fp32, contiguous."""

    @staticmethod
    def forward(fctx, q, k, v, ks, vs, kernel):
        o = torch.zeros_like(q)
        lse = torch.zeros(q.shape[0], q.shape[1], dtype=torch.float32)
        kernel.forward(_buf(q), _buf(k), _buf(v), _buf(ks), _buf(vs), _buf(o), _buf(lse))
        fctx.kernel = kernel
        fctx.save_for_backward(q, k, v, ks, vs, o, lse)
        return o

    @staticmethod
    def backward(fctx, dout):
        q, k, v, ks, vs, o, lse = fctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
        fctx.kernel.backward(_buf(q), _buf(k), _buf(v), _buf(ks), _buf(vs), _buf(o), _buf(lse),
                             _buf(dout), _buf(dq), _buf(dk), _buf(dv), _buf(dks), _buf(dvs))
        return dq, dk, dv, dks, dvs, None


class _CudaLocalAttention(torch.autograd.Function):
    """The cuDNN path over the same two shard groups: bf16 CUDA tensors,
    contiguous, KV heads as they are (GQA inside cuDNN), on the current
    stream of q's device."""

    @staticmethod
    def forward(fctx, q, k, v, ks, vs, kernel):
        with torch.cuda.device(q.device):
            o = torch.zeros_like(q)
            lse = torch.zeros(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
            kernel.forward(_buf(q), _buf(k), _buf(v), _buf(ks), _buf(vs), _buf(o), _buf(lse),
                           torch.cuda.current_stream(q.device).cuda_stream)
        fctx.kernel = kernel
        fctx.save_for_backward(q, k, v, ks, vs, o, lse)
        return o

    @staticmethod
    def backward(fctx, dout):
        q, k, v, ks, vs, o, lse = fctx.saved_tensors
        with torch.cuda.device(q.device):
            dout = dout.to(q.dtype).contiguous()
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
            fctx.kernel.backward(_buf(q), _buf(k), _buf(v), _buf(ks), _buf(vs), _buf(o),
                                 _buf(lse), _buf(dout), _buf(dq), _buf(dk), _buf(dv), _buf(dks),
                                 _buf(dvs), torch.cuda.current_stream(q.device).cuda_stream)
        return dq, dk, dv, dks, dvs, None


def _buf(t: torch.Tensor):
    return (t.data_ptr(), t.numel())


def _check(name: str, t, rows: int, ref: Optional[torch.Tensor]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(f"{name}: shape {tuple(t.shape)}; expected [C/N, heads, head_dim] "
                         f"with C/N = {rows}")
    if t.shape[0] != rows:
        raise ValueError(f"{name}: {t.shape[0]} rows; this rank holds C/N = {rows}")
    if t.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{name}: dtype {t.dtype}; expected torch.float32 or torch.bfloat16")
    if not t.is_contiguous():
        raise ValueError(f"{name}: not contiguous (strides {t.stride()}); call .contiguous()")
    if ref is not None:
        if t.dtype != ref.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} but q is {ref.dtype}")
        if t.device != ref.device:
            raise ValueError(f"{name}: on {t.device} but q is on {ref.device}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CpContext,
              scheme: str = "targeted", softmax_scale: Optional[float] = None) -> torch.Tensor:
    """Document-masked causal attention of this rank's tokens over the plan.

    q [C/N, Hq, D], k and v [C/N, Hkv, D] (Hq a multiple of Hkv: GQA),
    contiguous; on the CPU float32 or bfloat16 (computed in float32), on a
    CUDA device bfloat16 only (cuDNN; float32 CUDA tensors are refused, not
    converted); returns [C/N, Hq, D] in q's dtype (the padding row's output
    is 0). scheme: "targeted" (only the KV
    some rank needs, point to point), "allgather" (compacted non-last
    shards, all-gathered) or "full_kv" (the baseline). softmax_scale:
    default 1/sqrt(D). Every rank of ctx.group calls it, forward and backward.
    """
    if not isinstance(ctx, CpContext):
        raise TypeError(f"ctx: expected a flashcp.torch.CpContext, got {type(ctx).__name__}")
    rows = ctx.local_rows
    _check("q", q, rows, None)
    _check("k", k, rows, q)
    _check("v", v, rows, q)
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    if k.shape[2] != d:
        raise ValueError(f"k: head_dim {k.shape[2]} but q's is {d}")
    if hq % hkv:
        raise ValueError(f"heads: q has {hq}, k and v {hkv}; q's must be a multiple (GQA)")
    if q.device.type == "cuda":
        if q.dtype != torch.bfloat16:
            raise TypeError(
                f"q: dtype {q.dtype} on {q.device}; the CUDA path computes in bfloat16 "
                "(cuDNN) and does not convert: pass bfloat16 tensors (q.bfloat16()), or CPU "
                "tensors for float32")
    elif q.device.type != "cpu":
        raise ValueError(f"q: on {q.device}; expected a CPU or CUDA tensor")
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    if not scale > 0 or not math.isfinite(scale):
        raise ValueError(f"softmax_scale: {softmax_scale!r}; must be positive and finite")
    lay = ctx.layout(scheme)
    on_cuda = q.device.type == "cuda"
    if on_cuda:
        with torch.cuda.device(q.device):
            kernel = ctx.cuda_kernel(scheme, hq, hkv, d, scale, q.device)
    else:
        kernel = ctx.kernel(scheme, hq, d, scale)
    dtype = q.dtype
    pack_index, stage_index = lay.indices(q.device)

    # [K | V] per row, as the layout counts rows (one row: all KV heads).
    kv = torch.cat([k, v], dim=1)
    src = torch.cat([kv, kv.new_zeros((1,) + tuple(kv.shape[1:]))]) if lay.pads else kv
    pack = src.index_select(0, pack_index)
    recv = _Exchange.apply(pack, ctx, lay)
    stage = torch.cat([kv, recv]).index_select(0, stage_index)
    ks, vs = stage[:, :hkv], stage[:, hkv:]
    if on_cuda:
        return _CudaLocalAttention.apply(q, k, v, ks.contiguous(), vs.contiguous(), kernel)
    kl, vl = k, v
    if hq != hkv:
        g = hq // hkv
        kl, vl = kl.repeat_interleave(g, dim=1), vl.repeat_interleave(g, dim=1)
        ks, vs = ks.repeat_interleave(g, dim=1), vs.repeat_interleave(g, dim=1)
    f32 = torch.float32
    o = _LocalAttention.apply(q.to(f32).contiguous(), kl.to(f32).contiguous(),
                              vl.to(f32).contiguous(), ks.to(f32).contiguous(),
                              vs.to(f32).contiguous(), kernel)
    return o.to(dtype)
