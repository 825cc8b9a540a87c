"""attention(..., scheme="all_to_all"): the all-to-all (Ulysses) scheme.

Within this rank's group of the plan (the ranks linked by the documents they
share; worker/a2a_layout.h, through the native layout), every position
sends its real tokens' Q, K, V rows of each other position's heads, receives
the group's other tokens of its own heads (core::AllToAllGroupHeads: Hq / K
query heads, the KV heads those read, replicated where K > Hkv), attends the
group's documents whole, and returns the output rows to their owners.
Backward mirrors it: dO out as Q went, dQ, dK, dV back as O came (a
replicated KV head's gradients summed by its owner, in fp32). Each exchange
is one batch_isend_irecv with the group's other ranks (one message per peer
and direction; on NCCL one grouped ncclSend/ncclRecv call), so the bytes are
core::AnalyzePlan's bytes["all_to_all"] exactly (the CPU engine's
a2a_step.h moves the same). The padding row never travels; its output and
gradients are 0.

CPU tensors: the local attention on the CPU kernels (fp32). CUDA tensors
(bf16): on the project's cuDNN path over the head-parallel rows (the
layout's whole shards: the group's documents; attention_on_kernels with
_context.cuda_kernel), KV heads as they are where this position's query
heads read them in cuDNN's GQA order, else expanded per query head. Over a
gloo group the CUDA exchange is host-staged (CpContext.host_staged), over
NCCL it moves device memory. The CUDA path has not run on a GPU yet
(docs/gpu.md); its composition runs on the CPU with a test double of the
kernels (test_all_to_all.py).
"""
import contextlib
from typing import Any, Callable, List, Sequence, Tuple

import torch

from flashcp._native import native
from flashcp.torch._context import CpContext, _int64

SCHEME = "all_to_all"


class A2aPlan:
    """This rank's all-to-all under (Hq, Hkv, D): the group and position,
    per position its real rows and first gathered row, the gathered ->
    head-parallel row permutation, and every position's heads."""

    def __init__(self, ctx: CpContext, hq: int, hkv: int, d: int, lay=None):
        # lay: a native layout (default: all_to_all's; the two-level scheme's
        # over this rank's node part, _two_level.py).
        lay = ctx.layout(SCHEME).native if lay is None else lay
        self.group: List[int] = list(lay.a2a_group)
        self.pos: int = lay.a2a_position
        self.tokens: List[int] = list(lay.a2a_tokens)
        self.first: List[int] = list(lay.a2a_first)
        self.rows: int = lay.a2a_rows
        self.local_rows = ctx.local_rows
        self.doc_row = _int64(lay.a2a_doc_row)  # gathered row -> head-parallel row
        # (first query head, count, first KV head, count) per position.
        self.heads: List[Tuple[int, int, int, int]] = lay.a2a_heads(hq, hkv, d)
        self.hq, self.hkv, self.d = hq, hkv, d
        q0, nq, k0, _ = self.heads[self.pos]
        g = hq // hkv
        # Per query head of this position: its KV head among this position's.
        self.kv_of = torch.tensor([(q0 + a) // g - k0 for a in range(nq)], dtype=torch.int64)
        nk = self.heads[self.pos][3]
        # cuDNN's GQA reads KV head a // (nq / nk) for query head a: where
        # kv_of is that, the CUDA kernels take the nk KV heads as they are.
        self.gqa_order = nq % nk == 0 and self.kv_of.tolist() == [a // (nq // nk)
                                                                   for a in range(nq)]
        self._on = {}  # device -> (doc_row, kv_of) there

    @property
    def mine(self) -> int:
        return self.tokens[self.pos]

    def peers(self):
        return [i for i in range(len(self.group)) if i != self.pos]

    def index(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(doc_row, kv_of) on `device` (copied once per CUDA device)."""
        if device.type == "cpu":
            return self.doc_row, self.kv_of
        got = self._on.get(device)
        if got is None:
            got = self._on[device] = (self.doc_row.to(device), self.kv_of.to(device))
        return got

    def own_rows(self, p: int) -> torch.Tensor:
        """Head-parallel rows of position p's tokens, in its local order."""
        return self.doc_row[self.first[p]:self.first[p] + self.tokens[p]]


def _exchange(ctx: CpContext, a: A2aPlan, send, recv, what: str) -> None:
    """send / recv: (position, tensor) lists, one grouped batch_isend_irecv.
    CUDA tensors over gloo travel through host copies; over NCCL as they
    are, empty messages left out (both ends know every message's size, so
    they leave out the same ones)."""
    from flashcp.torch._attention import _p2p
    if any(t.is_cuda for _, t in send + recv):
        if ctx.host_staged:
            host = [(i, torch.empty(t.shape, dtype=t.dtype)) for i, t in recv]
            _exchange(ctx, a, [(i, t.cpu()) for i, t in send], host, what)
            for (_, t), (_, h) in zip(recv, host):
                t.copy_(h)
            return
        send = [(i, t) for i, t in send if t.numel()]
        recv = [(i, t) for i, t in recv if t.numel()]
    _p2p(ctx, [(a.group[i], t) for i, t in send], [(a.group[i], t) for i, t in recv], what)


class _ToHeads(torch.autograd.Function):
    """q [C/N, Hq, D], k, v [C/N, Hkv, D] -> this position's heads of the
    group's tokens, head-parallel rows (document order): qh [S, hq_j, D],
    kh, vh [S, kv_j, D]. Backward: the gradients back to the owners."""

    @staticmethod
    def forward(fctx, q, k, v, ctx, a: A2aPlan):
        m = a.mine
        send = []
        for i in a.peers():
            q0, nq, k0, nk = a.heads[i]
            send.append((i, torch.cat([q[:m, q0:q0 + nq], k[:m, k0:k0 + nk],
                                       v[:m, k0:k0 + nk]], dim=1).contiguous()))
        q0, nq, k0, nk = a.heads[a.pos]
        w = nq + 2 * nk
        recv = [(p, q.new_empty((a.tokens[p], w, a.d))) for p in a.peers()]
        _exchange(ctx, a, send, recv, "all_to_all forward Q|K|V exchange")
        got = dict(recv)
        got[a.pos] = torch.cat([q[:m, q0:q0 + nq], k[:m, k0:k0 + nk], v[:m, k0:k0 + nk]], dim=1)
        gathered = torch.cat([got[p] for p in range(len(a.group))])
        heads = q.new_empty((a.rows, w, a.d)).index_copy_(0, a.index(q.device)[0], gathered)
        fctx.ctx, fctx.a = ctx, a
        return (heads[:, :nq].contiguous(), heads[:, nq:nq + nk].contiguous(),
                heads[:, nq + nk:].contiguous())

    @staticmethod
    def backward(fctx, dqh, dkh, dvh):
        ctx, a = fctx.ctx, fctx.a
        q0, nq, k0, nk = a.heads[a.pos]
        like = next(t for t in (dqh, dkh, dvh) if t is not None)
        dqh = dqh if dqh is not None else like.new_zeros((a.rows, nq, a.d))
        dkh = dkh if dkh is not None else like.new_zeros((a.rows, nk, a.d))
        dvh = dvh if dvh is not None else like.new_zeros((a.rows, nk, a.d))
        g = torch.cat([dqh, dkh, dvh], dim=1).index_select(0, a.index(like.device)[0])  # gathered order
        send = [(p, g[a.first[p]:a.first[p] + a.tokens[p]].contiguous()) for p in a.peers()]
        recv = []
        for i in a.peers():
            _, nqi, _, nki = a.heads[i]
            recv.append((i, g.new_empty((a.mine, nqi + 2 * nki, a.d))))
        _exchange(ctx, a, send, recv, "all_to_all backward dQ|dK|dV return")
        got = dict(recv)
        got[a.pos] = g[a.first[a.pos]:a.first[a.pos] + a.mine]
        m = a.mine
        dq = g.new_zeros((a.local_rows, a.hq, a.d))
        dk = torch.zeros((a.local_rows, a.hkv, a.d), dtype=torch.float32, device=g.device)
        dv = torch.zeros_like(dk)
        for i in range(len(a.group)):  # positions in order: a deterministic sum
            qi, nqi, ki, nki = a.heads[i]
            src = got[i]
            dq[:m, qi:qi + nqi] = src[:, :nqi]
            dk[:m, ki:ki + nki] += src[:, nqi:nqi + nki].float()
            dv[:m, ki:ki + nki] += src[:, nqi + nki:].float()
        return dq, dk.to(g.dtype), dv.to(g.dtype), None, None


class _ToTokens(torch.autograd.Function):
    """oh [S, hq_j, D] (head-parallel rows) -> o [C/N, Hq, D] on the owners.
    Backward: dO out to the positions as Q went."""

    @staticmethod
    def forward(fctx, oh, ctx, a: A2aPlan):
        g = oh.index_select(0, a.index(oh.device)[0])  # gathered order
        send = [(p, g[a.first[p]:a.first[p] + a.tokens[p]].contiguous()) for p in a.peers()]
        recv = [(i, g.new_empty((a.mine, a.heads[i][1], a.d))) for i in a.peers()]
        _exchange(ctx, a, send, recv, "all_to_all forward O return")
        got = dict(recv)
        got[a.pos] = g[a.first[a.pos]:a.first[a.pos] + a.mine]
        o = g.new_zeros((a.local_rows, a.hq, a.d))
        for i in range(len(a.group)):
            q0, nq, _, _ = a.heads[i]
            o[:a.mine, q0:q0 + nq] = got[i]
        fctx.ctx, fctx.a = ctx, a
        return o

    @staticmethod
    def backward(fctx, do):
        ctx, a = fctx.ctx, fctx.a
        m = a.mine
        q0, nq, _, _ = a.heads[a.pos]
        send = [(i, do[:m, a.heads[i][0]:a.heads[i][0] + a.heads[i][1]].contiguous())
                for i in a.peers()]
        recv = [(p, do.new_empty((a.tokens[p], nq, a.d))) for p in a.peers()]
        _exchange(ctx, a, send, recv, "all_to_all backward dO exchange")
        got = dict(recv)
        got[a.pos] = do[:m, q0:q0 + nq]
        gathered = torch.cat([got[p] for p in range(len(a.group))])
        return (do.new_empty((a.rows, nq, a.d)).index_copy_(0, a.index(do.device)[0], gathered),
                None, None)


def _stream(t: torch.Tensor) -> int:
    """The current stream of t's device as an int (a CPU test double's: 0)."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _on_device(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


class _KernelWholeAttention(torch.autograd.Function):
    """The device kernels over the head-parallel rows (the layout's whole
    shards: the group's documents), on the current stream. qh [S, nq, D],
    kh, vh [S, nk, D] contiguous, nk dividing nq (cuDNN's GQA: query head a
    reads KV head a // (nq / nk)); `kernel` as _context.cuda_kernel's."""

    @staticmethod
    def forward(fctx, qh, kh, vh, kernel):
        from flashcp.torch._attention import _NONE, _buf
        with _on_device(qh):
            o = torch.zeros_like(qh)
            lse = torch.zeros(qh.shape[0], qh.shape[1], dtype=torch.float32, device=qh.device)
            kernel.forward(_buf(qh), _buf(kh), _buf(vh), _NONE, _NONE, _buf(o), _buf(lse),
                           _stream(qh), native().CUDA_WHOLE_SHARDS)
        fctx.kernel = kernel
        fctx.save_for_backward(qh, kh, vh, o, lse)
        return o

    @staticmethod
    def backward(fctx, dout):
        from flashcp.torch._attention import _NONE, _buf
        qh, kh, vh, o, lse = fctx.saved_tensors
        with _on_device(qh):
            dout = dout.to(qh.dtype).contiguous()
            dq, dk, dv = torch.zeros_like(qh), torch.zeros_like(kh), torch.zeros_like(vh)
            fctx.kernel.backward(_buf(qh), _buf(kh), _buf(vh), _NONE, _NONE, _buf(o), _buf(lse),
                                 _buf(dout), _buf(dq), _buf(dk), _buf(dv), _NONE, _NONE,
                                 _stream(qh), native().CUDA_WHOLE_SHARDS)
        return dq, dk, dv, None


def attention_on_kernels(q, k, v, ctx: CpContext, a: A2aPlan,
                         kernel_of: Callable[[int, int], Any]) -> torch.Tensor:
    """The all-to-all with the local attention on device kernels:
    kernel_of(query heads, KV heads) gives this position's (the CUDA path:
    _context.cuda_kernel; a test double on the CPU). KV heads go in as they
    are where a.gqa_order holds, else one copy per query head."""
    qh, kh, vh = _ToHeads.apply(q, k, v, ctx, a)
    if not a.gqa_order:  # KV per query head
        kv_of = a.index(q.device)[1]
        kh, vh = kh.index_select(1, kv_of).contiguous(), vh.index_select(1, kv_of).contiguous()
    oh = _KernelWholeAttention.apply(qh, kh, vh, kernel_of(qh.shape[1], kh.shape[1]))
    ctx.stats.calls += 1
    return _ToTokens.apply(oh, ctx, a)


def a2a_plan(ctx: CpContext, hq: int, hkv: int, d: int) -> A2aPlan:
    """ctx's A2aPlan of (Hq, Hkv, D), made once."""
    a = ctx._a2a.get((hq, hkv, d))
    if a is None:
        a = ctx._a2a[(hq, hkv, d)] = A2aPlan(ctx, hq, hkv, d)
    return a


@torch.compiler.disable  # torch.compile: runs eagerly (a graph break), not traced
def attention_all_to_all(q, k, v, ctx: CpContext, scale: float) -> torch.Tensor:
    """attention() under all_to_all on CPU or CUDA tensors (checked by the
    caller: CUDA ones bf16)."""
    from flashcp.torch._attention import _LocalAttention
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    a = a2a_plan(ctx, hq, hkv, d)
    nq = a.heads[a.pos][1]
    if q.is_cuda:
        def kernel_of(heads_q: int, heads_kv: int):
            with torch.cuda.device(q.device):
                return ctx.cuda_kernel(SCHEME, heads_q, heads_kv, d, scale, q.device)
        return attention_on_kernels(q, k, v, ctx, a, kernel_of)
    kernel = ctx.kernel(SCHEME, nq, d, scale)  # CpuAttention over the S head-parallel rows
    qh, kh, vh = _ToHeads.apply(q, k, v, ctx, a)
    kx, vx = kh.index_select(1, a.kv_of), vh.index_select(1, a.kv_of)  # GQA: KV per query head
    f32 = torch.float32
    none = torch.zeros((0, nq, d), dtype=f32)  # no prefixed shards: documents are whole
    oh = _LocalAttention.apply(qh.to(f32).contiguous(), kx.to(f32).contiguous(),
                               vx.to(f32).contiguous(), none, none, kernel, ctx.stats)
    ctx.stats.calls += 1
    return _ToTokens.apply(oh.to(q.dtype), ctx, a)


def plan_rank_groups(ctx: CpContext) -> List[Tuple[int, ...]]:
    """The plan's rank groups (core::PlanRankGroups): ranks linked by the
    documents they share, each ascending, by first rank."""
    parent = list(range(ctx.size))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first = {}
    for doc, _, _, rank in ctx.plan.shards:
        if doc in first:
            a, b = find(first[doc]), find(rank)
            parent[max(a, b)] = min(a, b)
        else:
            first[doc] = rank
    groups = {}
    for r in range(ctx.size):
        groups.setdefault(find(r), []).append(r)
    return [tuple(g) for g in groups.values()]


_MIXED = ("targeted", "allgather", "full_kv", "all_to_all", "two_level")


def group_scheme(ctx: CpContext, groups: Sequence[Tuple[Sequence[int], str]]
                 ) -> Tuple[str, Tuple[int, ...]]:
    """This rank's scheme in a mixed plan and its group's ranks (ascending):
    `groups` must list each of the plan's rank groups once with one of
    targeted, allgather, full_kv, all_to_all, two_level (ValueError naming
    what differs; the response's groups give exactly these names). No
    scheme sends outside its group (an all-gather group's blocks travel
    point to point among its ranks: the layout of ctx.layout(scheme,
    group); a two_level group's across nodes within it), so the groups run
    side by side on ctx.group."""
    try:
        given = [(tuple(sorted(int(r) for r in ranks)), s) for ranks, s in groups]
    except (TypeError, ValueError):
        raise ValueError(f"scheme: {groups!r}; expected a scheme name or a sequence of "
                         "(ranks, scheme) pairs") from None
    for ranks, s in given:
        if s not in _MIXED:
            raise ValueError(f"scheme: {s!r} for ranks {list(ranks)}; expected one of "
                             f"{', '.join(_MIXED)}")
    want = sorted(plan_rank_groups(ctx))
    if sorted(r for r, _ in given) != want:
        raise ValueError(f"scheme: groups {sorted(r for r, _ in given)} are not the plan's rank "
                         f"groups {want} (ranks linked by shared documents)")
    return next((s, ranks) for ranks, s in given if ctx.rank in ranks)
