"""attention(..., scheme="all_to_all"): the all-to-all (Ulysses) scheme.

Within this rank's group of the plan (the ranks linked by the documents they
share; worker/a2a_layout.h, through the native layout), every position
sends its real tokens' Q, K, V rows of each other position's heads, receives
the group's other tokens of its own heads (core::AllToAllGroupHeads: Hq / K
query heads, the KV heads those read, replicated where K > Hkv), attends the
group's documents whole on the CPU kernels, and returns the output rows to
their owners. Backward mirrors it: dO out as Q went, dQ, dK, dV back as O
came (a replicated KV head's gradients summed by its owner, in fp32). Each
exchange is one batch_isend_irecv with the group's other ranks (one message
per peer and direction), so the bytes are core::AnalyzePlan's
bytes["all_to_all"] exactly (the CPU engine's a2a_step.h moves the same).
The padding row never travels; its output and gradients are 0.
"""
from typing import Any, List, Sequence, Tuple

import torch

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

    @property
    def mine(self) -> int:
        return self.tokens[self.pos]

    def peers(self):
        return [i for i in range(len(self.group)) if i != self.pos]

    def own_rows(self, p: int) -> torch.Tensor:
        """Head-parallel rows of position p's tokens, in its local order."""
        return self.doc_row[self.first[p]:self.first[p] + self.tokens[p]]


def _exchange(ctx: CpContext, a: A2aPlan, send, recv, what: str) -> None:
    from flashcp.torch._attention import _p2p
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
        heads = q.new_empty((a.rows, w, a.d)).index_copy_(0, a.doc_row, gathered)
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
        g = torch.cat([dqh, dkh, dvh], dim=1).index_select(0, a.doc_row)  # gathered order
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
        dk = torch.zeros((a.local_rows, a.hkv, a.d), dtype=torch.float32)
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
        g = oh.index_select(0, a.doc_row)  # gathered order
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
        return do.new_empty((a.rows, nq, a.d)).index_copy_(0, a.doc_row, gathered), None, None


@torch.compiler.disable  # torch.compile: runs eagerly (a graph break), not traced
def attention_all_to_all(q, k, v, ctx: CpContext, scale: float) -> torch.Tensor:
    """attention() under all_to_all on CPU tensors (checked by the caller)."""
    from flashcp.torch._attention import _LocalAttention
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    a = ctx._a2a.get((hq, hkv, d))
    if a is None:
        a = ctx._a2a[(hq, hkv, d)] = A2aPlan(ctx, hq, hkv, d)
    nq = a.heads[a.pos][1]
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
