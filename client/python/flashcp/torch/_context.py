"""CpContext: one rank's view of a plan, and dispatch / undispatch."""
import dataclasses
import datetime
import itertools
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from flashcp._native import native
from flashcp._plan import PlanView, plan_view

SCHEMES = ("targeted", "allgather", "full_kv", "all_to_all")

# The live contexts by id, for the custom op (flashcp/torch/_ops.py), whose
# arguments can only be tensors and plain values: a context passes itself as
# its op_handle, a one-element int64 tensor holding its id. A tensor, not an
# int, so that a compiled graph takes each step's new context as an input
# instead of guarding on (and recompiling for) its id.
_CONTEXTS: "weakref.WeakValueDictionary[int, CpContext]" = weakref.WeakValueDictionary()
_CONTEXT_IDS = itertools.count(1)


def context_of(handle: torch.Tensor) -> "CpContext":
    """The CpContext whose op_handle is `handle`; LookupError once it is gone."""
    key = int(handle.reshape(-1)[0])
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        raise LookupError(f"flashcp: the CpContext of op_handle {key} no longer exists (keep the "
                          "context alive until its step's backward has run)")
    return ctx


@dataclasses.dataclass
class AttentionStats:
    """What the attention calls on one CpContext measured on this rank (the
    CPU path; the CUDA path does not count yet). kernel_seconds: in the CPU
    kernels, forward and backward (the rank's attention compute, what the
    group's measured imbalance compares); comm_seconds: in the exchange's
    collectives, waiting for peers included; bytes_sent / bytes_received:
    exchange payload, forward K|V and backward dK|dV; calls: forward calls.
    Wall times (time.perf_counter)."""
    kernel_seconds: float = 0.0
    comm_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    calls: int = 0


class ExchangeError(RuntimeError):
    """A collective of the CP exchange failed (a peer died or timed out); the
    message names this rank, the step and the peer where it is known."""


class PlanMismatchError(RuntimeError):
    """The ranks of a CP group hold different plans for one step (CpContext
    compares plan_hash across the group at construction): raised on every
    rank, with the same account of who holds what. hashes: every group
    rank's plan_hash, by rank; differing: the ranks whose plan is not the
    one most ranks hold (on a tie, the one rank 0 holds)."""

    def __init__(self, rank: int, hashes: List[str]):
        self.rank = rank
        self.hashes = list(hashes)
        ranks_of: Dict[str, List[int]] = {}
        for r, h in enumerate(self.hashes):
            ranks_of.setdefault(h, []).append(r)
        # The reference plan: most ranks, then the one with the lowest rank.
        ref = max(ranks_of, key=lambda h: (len(ranks_of[h]), -ranks_of[h][0]))
        self.reference = ref
        self.differing = [r for r, h in enumerate(self.hashes) if h != ref]
        others = "; ".join(f"{_ranks(rs)} plan_hash {h}" for h, rs in ranks_of.items()
                           if h != ref)
        super().__init__(
            f"rank {rank}: CpContext: the group's ranks hold different plans for this step: "
            f"{others}; {_ranks(ranks_of[ref])} plan_hash {ref}. Every rank must run the same "
            "plan of the same batch: plan once and share it (flashcp.torch.plan_on_first_rank), "
            "or give every rank the same planner version and batch")


def _ranks(rs: Sequence[int]) -> str:
    return f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"


def collective_device(group) -> torch.device:
    """Where a small tensor of a collective on `group` lives: the current
    CUDA device for an NCCL group (NCCL moves device memory only), else the
    CPU (gloo; a mixed "cpu:gloo,cuda:nccl" group takes CPU tensors)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _hash_to_int64(h: str) -> int:
    u = int(h, 16)
    return u - (1 << 64) if u >= 1 << 63 else u


def _int64_to_hash(x: int) -> str:
    return f"{x & ((1 << 64) - 1):016x}"


def _int64(data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(bytearray(data), dtype=torch.int64)


class SchemeLayout:
    """The native layout of one rank under one scheme (worker/cp_layout.h's
    CpRankLayout), with its row lists as index tensors: pack_index (local
    rows to send, in message order; a gather block's padding rows point at
    row C/N, which the caller makes a zero row; `pads` says whether any do)
    and stage_index (rows of cat([local K|V rows, received rows]) staged for
    the prefixed shards)."""

    def __init__(self, lay, rows: int):
        self.native = lay
        # Forward: one all_gather_into_tensor of equal blocks, or the point
        # to point messages; either way exactly sends/recvs travel.
        self.all_gather = lay.all_gather
        self.calls_exchange = lay.calls_exchange  # the same on every rank
        self.block_rows = lay.block_rows
        self.recv_rows = lay.recv_rows
        self.sends = lay.sends  # (peer, first row, rows) in the pack buffer, peer ascending
        self.recvs = lay.recvs  # (peer, first row, rows) in the receive buffer
        # Backward: the gradients of sends[i] come back into rows
        # [back_first[i], + rows) of a buffer of back_rows rows.
        self.back_first = lay.back_first
        self.back_rows = lay.back_rows
        raw = _int64(lay.pack_rows)
        no_row = raw == torch.iinfo(torch.int64).min
        self.pads = bool(no_row.any())
        self.pack_index = torch.where(no_row, torch.full_like(raw, rows), raw)
        st = _int64(lay.stage_src)  # >= 0: local row; < 0: received row -1 - x
        self.stage_index = torch.where(st >= 0, st, rows + (-1 - st))
        # Local rows of the whole shards (a document's first shard: no remote KV).
        whole = [torch.arange(first, first + n) for first, start, n, _ in lay.segments()
                 if start == 0]
        self.whole_rows = torch.cat(whole) if whole else torch.empty(0, dtype=torch.int64)
        self._on: Dict[Any, Tuple[torch.Tensor, torch.Tensor]] = {}
        self._whole_on: Dict[Any, torch.Tensor] = {}

    def indices(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(pack_index, stage_index) on `device` (the CPU tensors on CPU;
        copies made once per CUDA device)."""
        if device.type == "cpu":
            return self.pack_index, self.stage_index
        got = self._on.get(device)
        if got is None:
            got = (self.pack_index.to(device), self.stage_index.to(device))
            self._on[device] = got
        return got

    def whole_rows_on(self, device: torch.device) -> torch.Tensor:
        """whole_rows on `device` (copied once per device)."""
        got = self._whole_on.get(device)
        if got is None:
            got = self.whole_rows.to(device)
            self._whole_on[device] = got
        return got


class CpContext:
    """One rank of a CP group running a plan.

    plan: a PlanResponse (flashcp.plan or the service), its JSON
    (flashcp-plan's line, str or dict) or a PlanView. rank: this process's rank in `group`, which
    must have exactly plan.cp_size ranks (None: the default group). doc_lens,
    if given, must be the plan's documents (a plan for another batch is an
    error here, not a wrong answer later). threads: CPU kernel threads
    (default torch.get_num_threads()).

    Attributes for the model: position_ids [C/N] (int64, position of each
    local token within its document; 0 on the padding row), cu_seqlens_q and
    cu_seqlens_k (int32, the local shards in local order: query lengths and
    key lengths = prefix + own), max_seqlen_q, max_seqlen_k, local_rows
    (C/N), real_rows (this rank's real tokens), total_tokens (real tokens of
    the batch), padding, plan_hash (this plan's, core/plan_hash.h).

    Block diffusion (a plan with attention_mask "block_diffusion",
    docs/bdlm.md): the global sequence is the 2C rows [noisy ; clean]
    (total_tokens is 2C; dispatch refuses any other row count, naming both);
    block_size is b, and per local row is_noisy (bool) and block_index
    (position // b, int64) say what the row is; both None under the causal
    mask. cu_seqlens_k and max_seqlen_k describe the causal mask only.

    Before anything else runs on the group, the ranks compare plan_hash (one
    all_gather of 8 bytes a rank, after every local check): where they hold
    different plans, every rank raises PlanMismatchError naming the ranks
    whose plan differs and the hashes. check_plan=False skips that collective
    (for a caller that has already made sure, e.g. plan_on_first_rank).

    ranks_per_node: the group's topology (rank r on node r // ranks_per_node;
    0: one node), as the plan request's; a mixed plan's "two_level" groups
    need it (the all-to-all within each node, KV across nodes).
    """

    def __init__(self, plan: Any, rank: int, group: Optional[Any] = None, *,
                 doc_lens: Optional[Sequence[int]] = None, threads: Optional[int] = None,
                 check_plan: bool = True, ranks_per_node: int = 0):
        self.plan: PlanView = plan_view(plan)
        n = self.plan.cp_size
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("CpContext: torch.distributed is not initialized "
                             "(init_process_group first)")
        self.group = group if group is not None else dist.group.WORLD
        size = dist.get_world_size(self.group)
        if size != n:
            raise ValueError(f"CpContext: the group has {size} ranks but the plan is for "
                             f"cp_size {n}")
        if not isinstance(rank, int) or not 0 <= rank < n:
            raise ValueError(f"CpContext: rank {rank!r} outside [0, {n})")
        mine = dist.get_rank(self.group)
        if mine != rank:
            raise ValueError(f"CpContext: rank {rank} given, but this process is rank {mine} "
                             "of the group")
        # Under block diffusion the plan lists 2n documents (n noisy copies,
        # then the n clean): the batch's n documents name it as well.
        plan_docs = {self.plan.doc_lens}
        if self.plan.block_size:
            plan_docs.add(self.plan.doc_lens[:len(self.plan.doc_lens) // 2])
        if doc_lens is not None and tuple(int(x) for x in doc_lens) not in plan_docs:
            raise ValueError(f"CpContext: the plan is for documents {_short(self.plan.doc_lens)}, "
                             f"the batch has {_short(doc_lens)}")
        if not isinstance(ranks_per_node, int) or ranks_per_node < 0:
            raise ValueError(f"CpContext: ranks_per_node {ranks_per_node!r}; expected an int "
                             ">= 0 (0: one node)")
        self.rank = rank
        self.size = n
        self.ranks_per_node = ranks_per_node
        self.threads = int(threads) if threads else torch.get_num_threads()
        self.global_ranks = [dist.get_global_rank(self.group, r) if self.group is not
                             dist.group.WORLD else r for r in range(n)]
        self._layouts: Dict[Any, Any] = {}
        self._kernels: Dict[Tuple, Any] = {}
        self._a2a: Dict[Tuple, Any] = {}  # (Hq, Hkv, D) -> _all_to_all.A2aPlan
        self._side_streams: Dict[Any, Any] = {}  # CUDA device -> side stream
        # gloo moves CPU tensors only: the exchange of CUDA tensors over a gloo
        # group goes through host copies (NCCL takes them as they are).
        self.host_staged = (n > 1 and dist.get_backend(self.group) == "gloo")
        self.block_size = int(self.plan.block_size)  # 0: the causal document mask
        lay = native().RankLayout(list(self.plan.doc_lens), n, self.plan.padding,
                                  list(self.plan.shards), rank, "targeted",
                                  block_size=self.block_size)  # core::ValidatePlan
        self.local_rows = lay.local_rows
        self.total_tokens = lay.total_tokens
        self.padding = self.plan.padding
        self.global_rows = _int64(lay.global_rows(rank))
        self.all_global_rows = torch.cat([_int64(lay.global_rows(r)) for r in range(n)])
        segs = lay.segments()  # (first local row, start in document, len, doc)
        self.real_rows = sum(s[2] for s in segs)
        self.position_ids = _int64(lay.positions())
        # Block diffusion: per local row, whether it is a noisy token and its
        # block (position // block_size); False and 0 on the padding row.
        # None under the causal document mask.
        self.is_noisy: Optional[torch.Tensor] = None
        self.block_index: Optional[torch.Tensor] = None
        if self.block_size:
            half = len(self.plan.doc_lens) // 2  # plan documents [0, half) are noisy copies
            self.is_noisy = torch.zeros(self.local_rows, dtype=torch.bool)
            for first, _, length, doc in segs:
                self.is_noisy[first:first + length] = doc < half
            self.block_index = torch.div(self.position_ids, self.block_size,
                                         rounding_mode="floor")
        q = [0]
        k = [0]
        for _, start, length, _ in segs:
            q.append(q[-1] + length)
            k.append(k[-1] + start + length)
        self.cu_seqlens_q = torch.tensor(q, dtype=torch.int32)
        self.cu_seqlens_k = torch.tensor(k, dtype=torch.int32)
        self.max_seqlen_q = max((s[2] for s in segs), default=0)
        self.max_seqlen_k = max((s[1] + s[2] for s in segs), default=0)
        # Global rows whose next token is in the same document.
        ends = torch.tensor(self.plan.doc_lens, dtype=torch.int64).cumsum(0) - 1
        self._last_of_doc = torch.zeros(self.total_tokens, dtype=torch.bool)
        self._last_of_doc[ends] = True
        self.plan_hash = self.plan.plan_hash
        self.stats = AttentionStats()  # flashcp.torch.step_metrics reads and resets it
        op_id = next(_CONTEXT_IDS)
        _CONTEXTS[op_id] = self
        self.op_handle = torch.tensor([op_id], dtype=torch.int64)
        if check_plan and n > 1:
            self._agree_on_plan()

    def _agree_on_plan(self) -> None:
        """All-gathers plan_hash over the group; PlanMismatchError on every
        rank where they differ (each rank sees every hash, so all raise the
        same account), ExchangeError where the collective itself fails."""
        dev = collective_device(self.group)
        mine = torch.tensor([_hash_to_int64(self.plan_hash)], dtype=torch.int64, device=dev)
        every = torch.empty(self.size, dtype=torch.int64, device=dev)
        try:
            dist.all_gather_into_tensor(every, mine, group=self.group)
        except RuntimeError as e:
            raise ExchangeError(f"rank {self.rank}: CpContext's plan check (an all-gather of "
                                f"plan_hash over the group of {self.size}) failed: {e}") from e
        hashes = [_int64_to_hash(x) for x in every.tolist()]
        if any(h != self.plan_hash for h in hashes):
            raise PlanMismatchError(self.rank, hashes)

    # -- the layout (C++) ------------------------------------------------------
    def layout(self, scheme: str, group: Optional[Sequence[int]] = None) -> SchemeLayout:
        """This rank's layout under `scheme` (cached); with `group` (a mixed
        plan's rank group holding this rank), `scheme` run within the group
        only (worker/cp_layout.h: an all-gather point to point among its ranks)."""
        if scheme not in SCHEMES:
            raise ValueError(f"scheme: {scheme!r}; expected one of {', '.join(SCHEMES)}")
        key = scheme if group is None else (scheme, tuple(group))
        lay = self._layouts.get(key)
        if lay is None:
            lay = SchemeLayout(native().RankLayout(list(self.plan.doc_lens), self.size,
                                                   self.plan.padding, list(self.plan.shards),
                                                   self.rank, scheme,
                                                   block_size=self.block_size,
                                                   group=list(group or ())), self.local_rows)
            self._layouts[key] = lay
        return lay

    def two_level_layout(self, group: Sequence[int]) -> SchemeLayout:
        """This rank's layout under the two-level scheme over `group` (a
        mixed plan's rank group holding this rank; worker/two_level_layout.h),
        cached: the a2a_* fields over this rank's node part, the KV-row
        fields the exchange across nodes in head-parallel rows (stage_index
        over cat([head-parallel rows, received rows])). RuntimeError
        FAILED_PRECONDITION naming ranks_per_node where the group does not
        span nodes in equal parts."""
        key = ("two_level", tuple(group))
        lay = self._layouts.get(key)
        if lay is None:
            native_lay = native().RankLayout(list(self.plan.doc_lens), self.size,
                                             self.plan.padding, list(self.plan.shards),
                                             self.rank, "two_level", block_size=self.block_size,
                                             group=list(group),
                                             ranks_per_node=self.ranks_per_node)
            lay = SchemeLayout(native_lay, native_lay.a2a_rows)
            # Whole rows are head-parallel rows here (the whole batches), not local ones.
            whole = [torch.arange(start, start + n) for start, n in native_lay.whole_batches]
            lay.whole_rows = torch.cat(whole) if whole else torch.empty(0, dtype=torch.int64)
            self._layouts[key] = lay
        return lay

    def two_level_cuda_kernel(self, group: Sequence[int], heads_q: int, heads_kv: int,
                              head_dim: int, scale: float, device: torch.device):
        """cuda_kernel's of two_level_layout(group): the cuDNN shard kernels
        over the head-parallel rows (whole and prefixed batches; heads_q,
        heads_kv this position's) on the process's long-lived cache of
        `device` (cached; call with `device` current)."""
        key = ("cuda", device, "two_level", heads_q, heads_kv, head_dim, float(scale),
               tuple(group))
        k = self._kernels.get(key)
        if k is None:
            from flashcp.torch._cuda_check import check_native_cuda_runtime
            from flashcp.torch._cuda_cache import shard_kernel
            check_native_cuda_runtime(native().__file__)  # one CUDA runtime per process
            k = shard_kernel(self.two_level_layout(group).native, heads_q, heads_kv, head_dim,
                             float(scale), device)
            self._kernels[key] = k
        return k

    def kernel(self, scheme: str, heads: int, head_dim: int, scale: float,
               group: Optional[Sequence[int]] = None):
        """The native CPU attention of this rank's shards (cached)."""
        key = (scheme, heads, head_dim, float(scale), None if group is None else tuple(group))
        k = self._kernels.get(key)
        if k is None:
            k = native().CpuAttention(self.layout(scheme, group).native, heads, head_dim,
                                      float(scale), self.threads)
            self._kernels[key] = k
        return k

    def cuda_kernel(self, scheme: str, heads_q: int, heads_kv: int, head_dim: int,
                    scale: float, device: torch.device,
                    group: Optional[Sequence[int]] = None):
        """The CUDA attention (cuDNN, bf16) of this rank's shards on `device`
        (cached; call with `device` current); `group` as layout()'s. Causal
        layouts, all_to_all's included (its whole shards are the group's
        documents on the head-parallel rows; heads_q, heads_kv this
        position's), run on the process's long-lived cache of `device` and
        shape (_cuda_cache.py: cuDNN handle and graphs kept across steps,
        workspace from torch's allocator); block-diffusion layouts on a
        per-context native CudaAttention."""
        key = ("cuda", device, scheme, heads_q, heads_kv, head_dim, float(scale),
               None if group is None else tuple(group))
        k = self._kernels.get(key)
        if k is None:
            from flashcp.torch._cuda_check import check_native_cuda_runtime
            check_native_cuda_runtime(native().__file__)  # one CUDA runtime per process
            lay = self.layout(scheme, group).native
            if self.block_size:
                k = native().CudaAttention(lay, heads_q, heads_kv, head_dim, float(scale),
                                           torch.cuda.current_stream(device).cuda_stream)
            else:
                from flashcp.torch._cuda_cache import shard_kernel
                k = shard_kernel(lay, heads_q, heads_kv, head_dim, float(scale), device)
            self._kernels[key] = k
        return k

    def side_stream(self, device: torch.device) -> "torch.cuda.Stream":
        """The CUDA stream on `device` that the whole shards' attention runs
        on while the exchange runs on the current stream (made once per
        device)."""
        s = self._side_streams.get(device)
        if s is None:
            s = torch.cuda.Stream(device=device)
            self._side_streams[device] = s
        return s

    # -- helpers for the model ---------------------------------------------------
    def labels(self, input_ids: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """This rank's next-token labels [C/N] from the global input_ids
        ([total] or [total + padding]): the next token of the same document,
        ignore_index at each document's last token and on the padding row."""
        ids = self._check_global(input_ids, "input_ids")[: self.total_tokens]
        nxt = torch.full_like(ids, ignore_index)
        nxt[:-1] = ids[1:]
        nxt[self._last_of_doc.to(ids.device)] = ignore_index
        return dispatch(nxt, self, pad_value=ignore_index)

    def _check_global(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        c = self.total_tokens + self.padding
        if self.block_size and (x.dim() < 1 or x.shape[0] not in (self.total_tokens, c)):
            raise ValueError(f"{name}: {x.shape[0] if x.dim() else 0} rows; a block_diffusion "
                             f"step's input is [noisy ; clean], 2C = {self.total_tokens} rows "
                             f"(C = {self.total_tokens // 2}), or {c} with the padding")
        if x.dim() < 1 or x.shape[0] not in (self.total_tokens, c):
            raise ValueError(f"{name}: {tuple(x.shape)}; the plan is for {self.total_tokens} "
                             f"tokens (+{self.padding} padding): the first dimension must be "
                             f"{self.total_tokens} or {c}")
        return x


def dispatch(x: torch.Tensor, ctx: CpContext, *, pad_value: Any = 0) -> torch.Tensor:
    """This rank's rows [C/N, ...] of a packed global tensor, in the plan's
    local order. x: [total, ...] (the padding row, if this rank has one, is
    pad_value) or [total + padding, ...] (padding rows taken from x).
    Differentiable (an index_select)."""
    x = ctx._check_global(x, "x")
    rows = ctx.global_rows.to(x.device)
    if x.shape[0] == ctx.total_tokens and ctx.padding:
        pad = torch.full((ctx.padding,) + tuple(x.shape[1:]), pad_value, dtype=x.dtype,
                         device=x.device)
        x = torch.cat([x, pad])
    return x.index_select(0, rows)


def undispatch(x_local: torch.Tensor, ctx: CpContext) -> torch.Tensor:
    """The inverse of dispatch, on every rank: [C/N, ...] from each rank ->
    [total, ...] in the global order, padding dropped. A collective on
    ctx.group (all ranks call it); not differentiable (for evaluation and
    logging)."""
    if not isinstance(x_local, torch.Tensor):
        raise TypeError(f"x_local: expected a torch.Tensor, got {type(x_local).__name__}")
    if x_local.dim() < 1 or x_local.shape[0] != ctx.local_rows:
        raise ValueError(f"x_local: {tuple(x_local.shape)}; expected {ctx.local_rows} rows "
                         "(C/N) first")
    x = x_local.detach().contiguous()
    gathered = torch.empty((ctx.size * ctx.local_rows,) + tuple(x.shape[1:]), dtype=x.dtype,
                           device=x.device)
    try:
        dist.all_gather_into_tensor(gathered, x, group=ctx.group)
    except RuntimeError as e:
        raise ExchangeError(f"rank {ctx.rank}: undispatch all-gather over the group of "
                            f"{ctx.size} failed: {e}") from e
    rows = ctx.all_global_rows.to(x.device)
    real = rows < ctx.total_tokens
    out = torch.empty((ctx.total_tokens,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    out[rows[real]] = gathered[real]
    return out


def _short(v: Sequence[int], n: int = 8) -> str:
    v = list(v)
    return str(v) if len(v) <= n else f"[{', '.join(map(str, v[:n]))}, ... ({len(v)} documents)]"
