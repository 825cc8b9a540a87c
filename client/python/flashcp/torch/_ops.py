"""attention() as torch.library custom ops, for torch.compile (CPU and CUDA).

torch.compile cannot trace the exchange (torch.distributed calls on the
plan's layout) or the native kernels. The ops below are opaque to it: a fake
implementation gives their output shapes, register_autograd their backward,
so a compiled model keeps attention inside its graph (no graph break).
attention() calls them while torch.compile traces; eager calls keep the
autograd composition of _attention.py, which is the same arithmetic.

The context crosses as its op_handle (a one-element int64 tensor,
_context.context_of): an op's arguments are tensors and plain values.

flashcp::cp_attention(q, k, v, handle, scheme, scale) -> (o, lse):
o [C/N, Hq, D] (fp32 on the CPU, q's bf16 on CUDA), lse [C/N, Hq] fp32
(what the kernels' backward needs).
flashcp::cp_attention_backward(dout, q, k, v, o, lse, handle, scheme, scale)
-> (dq, dk, dv) in the inputs' dtypes. The backward stages the prefix KV
again (the forward exchange once more: the staged rows are not an output,
their count depends on the plan, and a compiled graph would specialize on
it), then runs the kernels' backward, returns the staged rows' gradients to
their owners (the backward exchange) and adds them onto the local K, V.

The CUDA kernels (register_kernel("cuda")) run _CudaCpAttention's forward
and backward (_attention.py: the streams, the cuDNN calls) with _Saved in
place of its autograd context. Its two shard groups write disjoint rows of
o and lse (worker/cuda/shard_attention.h), so the op returns them merged by
row, and the backward hands the merged o and lse to both groups (each reads
only its own rows, as test_cuda.py's both-groups call does).
"""
import time
from typing import Tuple

import torch

from flashcp.torch._context import context_of

_F32 = torch.float32


def _staged(k: torch.Tensor, v: torch.Tensor, ctx, lay):
    """(kv, ks, vs, pack_rows): k|v per row, and the staged prefix keys and
    values of this rank's prefixed shards (the forward exchange)."""
    from flashcp.torch._attention import _exchange_forward
    pack_index, stage_index = lay.indices(k.device)
    kv = torch.cat([k, v], dim=1)
    src = torch.cat([kv, kv.new_zeros((1,) + tuple(kv.shape[1:]))]) if lay.pads else kv
    pack = src.index_select(0, pack_index)
    recv = _exchange_forward(pack, ctx, lay)
    stage = torch.cat([kv, recv]).index_select(0, stage_index)
    hkv = k.shape[1]
    return kv, stage[:, :hkv], stage[:, hkv:], pack.shape[0]


def _heads(t: torch.Tensor, hq: int) -> torch.Tensor:
    """[rows, Hkv, D] -> fp32 contiguous [rows, Hq, D] (each KV head repeated
    for its Hq / Hkv query heads, as the CPU kernels take them)."""
    if t.shape[1] != hq:
        t = t.repeat_interleave(hq // t.shape[1], dim=1)
    return t.to(_F32).contiguous()


def _buf(t: torch.Tensor):
    return (t.data_ptr(), t.numel())


@torch.library.custom_op("flashcp::cp_attention", mutates_args=(), device_types="cpu")
def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: torch.Tensor,
                 scheme: str, scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    ctx = context_of(handle)
    lay = ctx.layout(scheme)
    hq, d = q.shape[1], q.shape[2]
    kernel = ctx.kernel(scheme, hq, d, scale)
    _, ks, vs, _ = _staged(k, v, ctx, lay)
    # Held in names: the kernels get raw addresses, which must outlive the call.
    args = (q.to(_F32).contiguous(), _heads(k, hq), _heads(v, hq), _heads(ks, hq),
            _heads(vs, hq))
    o = torch.zeros_like(args[0])
    lse = torch.zeros(q.shape[0], hq, dtype=_F32)
    start = time.perf_counter()
    kernel.forward(*(_buf(t) for t in args), _buf(o), _buf(lse))
    ctx.stats.kernel_seconds += time.perf_counter() - start
    ctx.stats.calls += 1
    return o, lse


@cp_attention.register_fake
def _cp_attention_fake(q, k, v, handle, scheme, scale):
    return (torch.empty_like(q, dtype=_F32 if q.device.type == "cpu" else q.dtype),
            q.new_empty((q.shape[0], q.shape[1]), dtype=_F32))


class _Saved:
    """_CudaCpAttention's autograd context (fctx) inside the CUDA kernels:
    what its _forward saves and its _backward reads."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def _cuda_kernel(ctx, scheme, q, k, scale):
    return ctx.cuda_kernel(scheme, q.shape[1], k.shape[1], q.shape[2], scale, q.device)


@cp_attention.register_kernel("cuda")
def _cp_attention_cuda(q, k, v, handle, scheme, scale):
    from flashcp.torch._attention import _CudaCpAttention
    ctx = context_of(handle)
    lay = ctx.layout(scheme)
    saved = _Saved()
    with torch.cuda.device(q.device):
        kernel = _cuda_kernel(ctx, scheme, q, k, scale)
        o = _CudaCpAttention._forward(saved, q, k, v, ctx, lay, kernel)
        *_, lse_w, _, lse_p = saved.saved_tensors  # (..., o_w, lse_w, o_p, lse_p)
        whole_rows = lay.whole_rows_on(q.device)
        return o, lse_p.index_copy(0, whole_rows, lse_w.index_select(0, whole_rows))


@torch.library.custom_op("flashcp::cp_attention_backward", mutates_args=(), device_types="cpu")
def cp_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                          handle: torch.Tensor, scheme: str,
                          scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from flashcp.torch._attention import _exchange_backward
    ctx = context_of(handle)
    lay = ctx.layout(scheme)
    rows, hq, d = q.shape
    hkv = k.shape[1]
    kernel = ctx.kernel(scheme, hq, d, scale)
    _, ks, vs, pack_rows = _staged(k, v, ctx, lay)
    q32, kl, vl, ks32, vs32 = (q.to(_F32).contiguous(), _heads(k, hq), _heads(v, hq),
                               _heads(ks, hq), _heads(vs, hq))
    dq, dkl, dvl = torch.zeros_like(q32), torch.zeros_like(kl), torch.zeros_like(vl)
    dks, dvs = torch.zeros_like(ks32), torch.zeros_like(vs32)
    o32, lse32, dout32 = o.contiguous(), lse.contiguous(), dout.to(_F32).contiguous()
    start = time.perf_counter()
    kernel.backward(_buf(q32), _buf(kl), _buf(vl), _buf(ks32), _buf(vs32), _buf(o32),
                    _buf(lse32), _buf(dout32), _buf(dq), _buf(dkl), _buf(dvl), _buf(dks),
                    _buf(dvs))
    ctx.stats.kernel_seconds += time.perf_counter() - start

    def kv_heads(t):  # the gradient of repeat_interleave: sum each KV head's copies
        return t.view(t.shape[0], hkv, hq // hkv, d).sum(2)

    # Staged rows' gradients onto local rows and the receive buffer; the
    # receive buffer's back to their owners, onto the rows they packed.
    pack_index, stage_index = lay.indices(q.device)
    g = torch.zeros((rows + lay.recv_rows, 2 * hkv, d), dtype=_F32)
    g.index_add_(0, stage_index, torch.cat([kv_heads(dks), kv_heads(dvs)], dim=1))
    # In K's dtype, as the eager path's exchange moves it.
    grad_pack = _exchange_backward(g[rows:].to(k.dtype), ctx, lay, pack_rows).to(_F32)
    real = pack_index < rows  # the rest are an all-gather block's padding rows
    g_local = g[:rows]
    g_local.index_add_(0, pack_index[real], grad_pack[real])
    dk = g_local[:, :hkv] + kv_heads(dkl)
    dv = g_local[:, hkv:] + kv_heads(dvl)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@cp_attention_backward.register_fake
def _cp_attention_backward_fake(dout, q, k, v, o, lse, handle, scheme, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@cp_attention_backward.register_kernel("cuda")
def _cp_attention_backward_cuda(dout, q, k, v, o, lse, handle, scheme, scale):
    from flashcp.torch._attention import _CudaCpAttention
    ctx = context_of(handle)
    lay = ctx.layout(scheme)
    saved = _Saved()
    with torch.cuda.device(q.device):
        saved.kernel = _cuda_kernel(ctx, scheme, q, k, scale)
        _, ks, vs, saved.pack_rows = _staged(k, v, ctx, lay)  # the staging, again
        saved.ctx, saved.lay = ctx, lay
        saved.save_for_backward(q, k, v, ks.contiguous(), vs.contiguous(), o, lse, o, lse)
        dq, dk, dv, *_ = _CudaCpAttention._backward(saved, dout)
    return dq, dk, dv


def _setup_context(ctx, inputs, output):
    q, k, v, handle, scheme, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, handle)
    ctx.scheme, ctx.scale = scheme, scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, o, lse, handle = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashcp.cp_attention_backward(dout, q, k, v, o, lse, handle,
                                                         ctx.scheme, ctx.scale)
    return dq, dk, dv, None, None, None


torch.library.register_autograd("flashcp::cp_attention", _backward,
                                setup_context=_setup_context)
