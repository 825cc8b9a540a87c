"""attention(): the CP attention step as autograd ops.

Forward: pack the K|V rows this rank sends (the native layout's pack_rows),
exchange them (targeted: one batch_isend_irecv with exactly the ranks that
need them; allgather / full_kv: one all_gather_into_tensor of equal blocks),
stage every prefixed shard's keys [prefix pieces, own rows] (stage_src),
then the kernels attend each shard to its prefix plus itself. Backward:
the kernels' dQ, dK, dV; the staging's gradients index-added back onto
local rows and the receive buffer; the receive buffer's gradients returned
to their owners point to point (the mirror of the forward messages), one
batch_isend_irecv.

CPU: the project's CPU kernels (fp32), the steps composed of autograd ops.
CUDA: the project's cuDNN path (bf16, worker/cuda/shard_attention.h through
the binding's CUDA hook), the step as one autograd node that overlaps the
whole shards' attention with the exchange on a side stream, as the GPU step
does (_CudaCpAttention); all_to_all on the same kernels over the head-parallel
rows (_all_to_all.py), a two_level group on them over its node part's
head-parallel rows plus the KV across nodes (_two_level.py); a mixed plan's
all-gather group point to point among its ranks, as on the CPU. The CUDA
path has not run on a GPU yet.
"""
import math
import time
from typing import Optional

import torch
import torch.distributed as dist

from flashcp._native import native
from flashcp.torch import _ops  # noqa: F401  (registers torch.ops.flashcp.*)
from flashcp.torch._context import SCHEMES, CpContext, ExchangeError, collective_device


def _p2p(ctx: CpContext, send, recv, what: str) -> None:
    """send/recv: lists of (group rank, tensor). Posts every send and receive
    as one group (dist.batch_isend_irecv: on NCCL one coalesced group call,
    the pattern that cannot deadlock and uses the group's communicator, not
    one per pair; on gloo the same ops one by one), then waits on each; a
    failure (at start or wait, each bounded by the group's timeout) raises
    ExchangeError naming the peer (every peer of the group call where the
    backend returns one request for all)."""
    if not send and not recv:
        return
    start = time.perf_counter()
    items = [(dist.isend, p, t) for p, t in send] + [(dist.irecv, p, t) for p, t in recv]
    ops = []
    for op, peer, t in items:
        o = dist.P2POp(op, t, ctx.global_ranks[peer], ctx.group)
        o.op = _posting(o.op, peer)  # a failure to post names its peer
        ops.append(o)
    peers = [peer for _, peer, _ in items]
    try:
        works = dist.batch_isend_irecv(ops)
    except _PostFailed as e:
        raise ExchangeError(f"rank {ctx.rank}: {what} with rank {e.peer} failed: "
                            f"{e.__cause__}") from e.__cause__
    # One request per op (gloo), or the coalesced group's (NCCL): one for all.
    named = zip(peers, works) if len(works) == len(ops) else \
        ((sorted(set(peers)), w) for w in works)
    for peer, work in named:
        try:
            work.wait()
        except RuntimeError as e:
            raise ExchangeError(f"rank {ctx.rank}: {what} with {_peers(peer)} failed: {e}") from e
    _count(ctx, start, sum(_nbytes(t) for _, t in send), sum(_nbytes(t) for _, t in recv))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _count(ctx: CpContext, start: float, sent: int, received: int) -> None:
    """Adds one finished collective (begun at perf_counter() = start) to ctx.stats."""
    ctx.stats.comm_seconds += time.perf_counter() - start
    ctx.stats.bytes_sent += sent
    ctx.stats.bytes_received += received


class _PostFailed(Exception):
    def __init__(self, peer: int):
        super().__init__(peer)
        self.peer = peer


def _posting(op, peer: int):
    """op (dist.isend / dist.irecv as batch_isend_irecv calls it), raising
    _PostFailed(peer) from the backend's error."""
    send = op is dist.isend

    def post(*args, **kwargs):
        # batch_isend_irecv names the peer group_dst only for dist.isend
        # itself (an identity test), group_src for any other callable.
        if send and "group_src" in kwargs:
            kwargs["group_dst"] = kwargs.pop("group_src")
        try:
            return op(*args, **kwargs)
        except RuntimeError as e:
            raise _PostFailed(peer) from e
    return post


def _peers(p) -> str:
    if isinstance(p, int):
        return f"rank {p}"
    return f"rank{'s' if len(p) > 1 else ''} {', '.join(map(str, p))}"


_PROBE_TAG = 0x5CF1  # the failure probe's messages, apart from the exchange's (tag 0)


def _gather_failed(ctx: CpContext, what: str, e: Exception) -> ExchangeError:
    # A failed collective does not say which peer failed (gloo names an
    # address). Probe every peer point to point (one element each way, every
    # wait bounded by the group's timeout): the peers whose transfer fails
    # are named. Ranks that failed the same collective probe each other too.
    # Each peer's send and receive go as one group (batch_isend_irecv), as
    # the exchange's do: on NCCL an ungrouped send posted before its receive
    # can wait forever on a peer doing the same.
    failed = []
    # On the group's device: NCCL moves CUDA tensors only (a CPU probe would fail every peer).
    dev = collective_device(ctx.group)
    one = torch.zeros(1, device=dev)
    peers = [p for p in range(ctx.size) if p != ctx.rank]
    for p in peers:
        peer = ctx.global_ranks[p]
        try:
            works = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, one, peer, ctx.group, _PROBE_TAG),
                dist.P2POp(dist.irecv, torch.zeros(1, device=dev), peer, ctx.group, _PROBE_TAG)])
            for w in works:
                w.wait()
        except RuntimeError:
            failed.append(p)
    named = (f"; no answer from rank{'s' if len(failed) > 1 else ''} "
             f"{', '.join(map(str, failed))}") if failed else ""
    return ExchangeError(f"rank {ctx.rank}: {what} over the group of {ctx.size} failed"
                         f"{named}: {e}")


def _exchange_forward(pack: torch.Tensor, ctx: CpContext, lay) -> torch.Tensor:
    """pack [P, W] -> the receive buffer [R, W]: exactly the layout's messages."""
    if pack.is_cuda and ctx.host_staged:
        return _exchange_forward(pack.cpu(), ctx, lay).to(pack.device)
    w = tuple(pack.shape[1:])
    recv = pack.new_zeros((lay.recv_rows,) + w)
    if ctx.size == 1 or not lay.calls_exchange:
        return recv  # nothing travels (one rank, or empty all-gather blocks)
    if lay.all_gather:
        start = time.perf_counter()
        try:
            dist.all_gather_into_tensor(recv, pack.contiguous(), group=ctx.group)
        except RuntimeError as e:
            raise _gather_failed(ctx, "forward KV all-gather", e) from e
        block = _nbytes(pack) * (ctx.size - 1)  # this rank's block to, and one from, each peer
        _count(ctx, start, block, block)
    else:
        send = [(p, pack[first:first + rows]) for p, first, rows in lay.sends]
        rcv = [(p, recv[first:first + rows]) for p, first, rows in lay.recvs]
        _p2p(ctx, send, rcv, "forward KV exchange")
    return recv


def _exchange_backward(grad_recv: torch.Tensor, ctx: CpContext, lay, pack_rows: int) -> torch.Tensor:
    """The gradients of the receive buffer -> those of the pack buffer
    [pack_rows, W]. Every scheme point to point (cp_layout.h): the gradients
    of what came from each peer go back to it; what comes back for sends[i]
    is added onto the pack rows it carried, peer by peer."""
    if grad_recv.is_cuda and ctx.host_staged:
        return _exchange_backward(grad_recv.cpu(), ctx, lay, pack_rows).to(grad_recv.device)
    g = grad_recv.contiguous()
    w = tuple(g.shape[1:])
    grad_pack = g.new_zeros((pack_rows,) + w)
    if ctx.size == 1 or not lay.calls_exchange:
        return grad_pack
    back = g.new_empty((lay.back_rows,) + w)
    send = [(p, g[first:first + r]) for p, first, r in lay.recvs]
    rcv = [(p, back[b:b + r]) for (p, _, r), b in zip(lay.sends, lay.back_first)]
    _p2p(ctx, send, rcv, "backward dK/dV return")
    for (_, first, r), b in zip(lay.sends, lay.back_first):
        grad_pack[first:first + r] += back[b:b + r]
    return grad_pack


class _Exchange(torch.autograd.Function):
    """pack [P, W] -> recv [R, W] (forward KV), and the mirror backward."""

    @staticmethod
    def forward(fctx, pack, ctx: CpContext, lay):
        fctx.ctx, fctx.lay, fctx.pack_rows = ctx, lay, pack.shape[0]
        return _exchange_forward(pack, ctx, lay)

    @staticmethod
    def backward(fctx, grad_recv):
        return _exchange_backward(grad_recv, fctx.ctx, fctx.lay, fctx.pack_rows), None, None


class _LocalAttention(torch.autograd.Function):
    """The CPU kernels over whole shards (keys in k, v) and prefixed shards
    (keys in k_stage, v_stage); Q and KV heads equal, fp32, contiguous."""

    @staticmethod
    def forward(fctx, q, k, v, ks, vs, kernel, stats):
        o = torch.zeros_like(q)
        lse = torch.zeros(q.shape[0], q.shape[1], dtype=torch.float32)
        start = time.perf_counter()
        kernel.forward(_buf(q), _buf(k), _buf(v), _buf(ks), _buf(vs), _buf(o), _buf(lse))
        stats.kernel_seconds += time.perf_counter() - start
        fctx.kernel, fctx.stats = kernel, stats
        fctx.save_for_backward(q, k, v, ks, vs, o, lse)
        return o

    @staticmethod
    def backward(fctx, dout):
        q, k, v, ks, vs, o, lse = fctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
        start = time.perf_counter()
        fctx.kernel.backward(_buf(q), _buf(k), _buf(v), _buf(ks), _buf(vs), _buf(o), _buf(lse),
                             _buf(dout), _buf(dq), _buf(dk), _buf(dv), _buf(dks), _buf(dvs))
        fctx.stats.kernel_seconds += time.perf_counter() - start
        return dq, dk, dv, dks, dvs, None, None


_NONE = (0, 0)  # a buffer the native call does not read (a shard group that does not run)


class _CudaCpAttention(torch.autograd.Function):
    """The CUDA step as one autograd node, ordered as worker/cuda/gpu_cp_step.cc:
    the whole shards (no remote KV) attend on a side stream while the KV
    exchange runs on the current stream; then the prefixed shards attend on
    their staged KV. Backward: the prefixed shards first (their staged
    gradients are what travels), the whole shards on the side stream while
    the gradients return; gradients summed in fp32, rounded to bf16 once.
    bf16 CUDA tensors, contiguous, KV heads as they are (GQA inside cuDNN).
    The two groups write their own o, lse, dq buffers; their rows are merged
    by index (whole rows from the whole group), so neither depends on what
    the other kernel leaves in rows it does not own."""

    @staticmethod
    def forward(fctx, q, k, v, ctx: CpContext, lay, kernel):
        with torch.cuda.device(q.device):
            return _CudaCpAttention._forward(fctx, q, k, v, ctx, lay, kernel)

    @staticmethod
    def backward(fctx, dout):
        with torch.cuda.device(dout.device):
            return _CudaCpAttention._backward(fctx, dout)

    @staticmethod
    def _forward(fctx, q, k, v, ctx: CpContext, lay, kernel):
        mod = native()
        dev = q.device
        cur = torch.cuda.current_stream(dev)
        side = ctx.side_stream(dev)
        rows, hq, hkv = q.shape[0], q.shape[1], k.shape[1]
        pack_index, stage_index = lay.indices(dev)
        whole_rows = lay.whole_rows_on(dev)
        o_w, o_p = torch.zeros_like(q), torch.zeros_like(q)
        lse_w = torch.zeros(rows, hq, dtype=torch.float32, device=dev)
        lse_p = torch.zeros_like(lse_w)
        side.wait_stream(cur)  # q, k, v and the zero-filled outputs
        try:
            # 1. Whole shards, on the side stream: they overlap the exchange.
            kernel.forward(_buf(q), _buf(k), _buf(v), _NONE, _NONE, _buf(o_w), _buf(lse_w),
                           side.cuda_stream, mod.CUDA_WHOLE_SHARDS)
            # 2. The exchange and the staging, on the current stream.
            kv = torch.cat([k, v], dim=1)
            src = torch.cat([kv, kv.new_zeros((1,) + tuple(kv.shape[1:]))]) if lay.pads else kv
            pack = src.index_select(0, pack_index)
            recv = _exchange_forward(pack, ctx, lay)
            stage = torch.cat([kv, recv]).index_select(0, stage_index)
            ks, vs = stage[:, :hkv].contiguous(), stage[:, hkv:].contiguous()
            # 3. Prefixed shards.
            kernel.forward(_buf(q), _NONE, _NONE, _buf(ks), _buf(vs), _buf(o_p), _buf(lse_p),
                           cur.cuda_stream, mod.CUDA_PREFIXED_SHARDS)
        finally:
            cur.wait_stream(side)  # nothing here is freed while the side stream uses it
        fctx.ctx, fctx.lay, fctx.kernel, fctx.pack_rows = ctx, lay, kernel, pack.shape[0]
        fctx.save_for_backward(q, k, v, ks, vs, o_w, lse_w, o_p, lse_p)
        return o_p.index_copy(0, whole_rows, o_w.index_select(0, whole_rows))

    @staticmethod
    def _backward(fctx, dout):
        mod = native()
        q, k, v, ks, vs, o_w, lse_w, o_p, lse_p = fctx.saved_tensors
        ctx, lay, kernel = fctx.ctx, fctx.lay, fctx.kernel
        dev = q.device
        cur = torch.cuda.current_stream(dev)
        side = ctx.side_stream(dev)
        rows, hkv = q.shape[0], k.shape[1]
        pack_index, stage_index = lay.indices(dev)
        whole_rows = lay.whole_rows_on(dev)
        dout = dout.to(q.dtype).contiguous()
        dq_p, dq_w = torch.zeros_like(q), torch.zeros_like(q)
        dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
        dk_w, dv_w = torch.zeros_like(k), torch.zeros_like(v)
        # 1. Prefixed shards: their staged gradients are what must travel.
        kernel.backward(_buf(q), _NONE, _NONE, _buf(ks), _buf(vs), _buf(o_p), _buf(lse_p),
                        _buf(dout), _buf(dq_p), _NONE, _NONE, _buf(dks), _buf(dvs),
                        cur.cuda_stream, mod.CUDA_PREFIXED_SHARDS)
        side.wait_stream(cur)  # dout and the zero-filled gradients
        try:
            # 2. Whole shards on the side stream, overlapping the return.
            kernel.backward(_buf(q), _buf(k), _buf(v), _NONE, _NONE, _buf(o_w), _buf(lse_w),
                            _buf(dout), _buf(dq_w), _buf(dk_w), _buf(dv_w), _NONE, _NONE,
                            side.cuda_stream, mod.CUDA_WHOLE_SHARDS)
            # 3. Staged rows' gradients onto local rows and the receive
            # buffer (fp32), the receive buffer's back to its owners (bf16).
            g = torch.zeros((rows + lay.recv_rows, 2 * hkv, q.shape[2]), dtype=torch.float32,
                            device=dev)
            g.index_add_(0, stage_index, torch.cat([dks, dvs], dim=1).float())
            grad_pack = _exchange_backward(g[rows:].to(q.dtype), ctx, lay, fctx.pack_rows)
            real = pack_index < rows  # the rest are an all-gather block's padding rows
            g_local = g[:rows]
            g_local.index_add_(0, pack_index[real], grad_pack[real].float())
        finally:
            cur.wait_stream(side)
        g_local[:, :hkv].index_add_(0, whole_rows, dk_w.index_select(0, whole_rows).float())
        g_local[:, hkv:].index_add_(0, whole_rows, dv_w.index_select(0, whole_rows).float())
        dq = dq_p.index_copy(0, whole_rows, dq_w.index_select(0, whole_rows))
        return dq, g_local[:, :hkv].to(q.dtype), g_local[:, hkv:].to(q.dtype), None, None, None


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
    shards, all-gathered), "full_kv" (the baseline), "all_to_all"
    (Ulysses within each rank group of the plan: heads split over the
    group, its documents attended whole, _all_to_all.py; a group
    whose size does not divide Hq raises RuntimeError FAILED_PRECONDITION
    naming query_heads), or a mixed plan: a sequence of (ranks, scheme),
    one per rank group of the plan (the ranks linked by shared documents),
    each "targeted", "allgather", "full_kv", "all_to_all" or "two_level",
    e.g. what flashcp's choose_schemes chose (the response's groups); each
    rank runs its group's (an all-gather group point to point among its
    ranks, not under torch.compile; a two_level group, _two_level.py, with
    CpContext(ranks_per_node=...) as the plan request's:
    RuntimeError FAILED_PRECONDITION naming ranks_per_node where the group
    does not span nodes in equal parts, or query_heads where a node part's
    size does not divide Hq).
    softmax_scale:
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
    if hkv < 1:
        raise ValueError(f"heads: k and v have {hkv} heads; need at least 1")
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
    group = None  # an all-gather group of a mixed plan: its ranks
    if not isinstance(scheme, str):
        # A mixed plan: ((ranks, scheme), ...), one entry per rank group of
        # the plan; this rank runs its group's scheme (_all_to_all.py).
        from flashcp.torch._all_to_all import group_scheme
        scheme, ranks = group_scheme(ctx, scheme)
        if scheme == "two_level":
            if ctx.block_size:
                raise NotImplementedError(
                    "scheme: two_level under attention_mask block_diffusion is not built; use "
                    "targeted")
            from flashcp.torch._two_level import attention_two_level
            return attention_two_level(q, k, v, ctx, scale, ranks)
        if scheme in ("allgather", "full_kv") and len(ranks) < ctx.size:
            group = ranks
            if torch.compiler.is_compiling():
                raise NotImplementedError(
                    f"scheme: {scheme} for ranks {list(ranks)} in a mixed plan does not run "
                    "compiled; under torch.compile use targeted")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: {scheme!r}; expected one of {', '.join(SCHEMES)}")
    on_cuda = q.device.type == "cuda"
    if scheme == "all_to_all":
        if ctx.block_size:
            raise NotImplementedError(
                "scheme: all_to_all under attention_mask block_diffusion is not built (the "
                "plan's rank groups split a document's noisy and clean copies); use targeted")
        from flashcp.torch._all_to_all import attention_all_to_all
        return attention_all_to_all(q, k, v, ctx, scale)
    if torch.compiler.is_compiling():
        # torch.compile: the custom op (_ops.py; CPU and CUDA kernels),
        # opaque to the tracer, so attention stays in the graph; the same
        # arithmetic as below.
        o, _ = torch.ops.flashcp.cp_attention(q, k, v, ctx.op_handle, scheme, scale)
        return o.to(q.dtype)
    lay = ctx.layout(scheme, group)
    if on_cuda:
        with torch.cuda.device(q.device):
            kernel = ctx.cuda_kernel(scheme, hq, hkv, d, scale, q.device, group)
    else:
        kernel = ctx.kernel(scheme, hq, d, scale, group)
    if on_cuda:
        return _CudaCpAttention.apply(q, k, v, ctx, lay, kernel)
    dtype = q.dtype
    pack_index, stage_index = lay.indices(q.device)

    # [K | V] per row, as the layout counts rows (one row: all KV heads).
    kv = torch.cat([k, v], dim=1)
    src = torch.cat([kv, kv.new_zeros((1,) + tuple(kv.shape[1:]))]) if lay.pads else kv
    pack = src.index_select(0, pack_index)
    recv = _Exchange.apply(pack, ctx, lay)
    stage = torch.cat([kv, recv]).index_select(0, stage_index)
    ks, vs = stage[:, :hkv], stage[:, hkv:]
    kl, vl = k, v
    if hq != hkv:
        g = hq // hkv
        kl, vl = kl.repeat_interleave(g, dim=1), vl.repeat_interleave(g, dim=1)
        ks, vs = ks.repeat_interleave(g, dim=1), vs.repeat_interleave(g, dim=1)
    f32 = torch.float32
    o = _LocalAttention.apply(q.to(f32).contiguous(), kl.to(f32).contiguous(),
                              vl.to(f32).contiguous(), ks.to(f32).contiguous(),
                              vs.to(f32).contiguous(), kernel, ctx.stats)
    ctx.stats.calls += 1
    return o.to(dtype)
