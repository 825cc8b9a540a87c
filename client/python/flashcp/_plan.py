"""The in-process planner and the one plain view of a plan that the PyTorch
integration reads, whatever the plan came from."""
import dataclasses
import json
import math
import warnings
from typing import Any, Iterable, List, Optional, Tuple

from flashcp._native import native
from google.protobuf import json_format

from flashcp_client import Client, planner_pb2
from flashcp_client.client import _int_arg


class PlanError(ValueError):
    """A plan request the core rejects: `code` is the status code's name
    (e.g. "INVALID_ARGUMENT"), the message names the field."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


_BOUNDS = ("max_docs", "max_tokens", "max_cp_size", "max_shard_ranks", "max_response_bytes")


def plan(doc_lens: Iterable[int], cp_size: int, strategy: str = "", *,
         target_imbalance: float = 0.0, min_shard_tokens: Optional[int] = None,
         heads: int = 0, head_dim: int = 0, dtype_bytes: int = 0,
         include_layout: bool = False, batch_id: int = 0, ranks_per_node: int = 0,
         cost_profile: str = "", cost: Any = None,
         rank_speed: Iterable[float] = (), attention_mask: str = "", block_size: int = 0,
         timeout: Optional[float] = None,
         max_docs: Optional[int] = None, max_tokens: Optional[int] = None,
         max_cp_size: Optional[int] = None, max_shard_ranks: Optional[int] = None,
         max_response_bytes: Optional[int] = None) -> planner_pb2.PlanResponse:
    """Plans one batch in this process with the service's own code (request
    validation, the plan's bounds, core::MakePlan, AnalyzePlan, the response
    conversion): the PlanResponse equals the service's for the same request,
    byte for byte, except metrics.planning_seconds (this process's time).
    Strategy "ilp" is the exception: the extension links no CBC, so it
    raises PlanError FAILED_PRECONDITION naming where it runs (a planner
    started with --allow_ilp, or flashcp-plan --strategy ilp).
    Zero values mean the defaults (planner.proto); min_shard_tokens None is
    the default 128, -1 turns the rule off; ranks_per_node, cost_profile (the
    named profiles: calibration lives in a planner), cost and rank_speed as
    Client.request. attention_mask="block_diffusion" with block_size=b plans
    a block diffusion step's 2C-token [noisy ; clean] sequence
    (docs/bdlm.md): the response's doc_lens lists the n noisy copies, then
    the n clean copies.

    Bounds: a default planner's (flashcp-planner's --max_docs, --max_tokens,
    --max_cp_size, --max_shard_ranks, --max_response_bytes defaults); each
    max_* argument given overrides its bound (PlanError RESOURCE_EXHAUSTED
    above one). timeout: seconds (> 0) planning may take, else TimeoutError;
    None: no limit. Ctrl-C (SIGINT) stops planning within about 20 ms of a
    check and raises KeyboardInterrupt.

    Raises TypeError for an argument of the wrong type (a bool or float
    count, a dict of lengths), PlanError naming the field otherwise."""
    bounds = native().service_bounds()
    given = {"max_docs": max_docs, "max_tokens": max_tokens, "max_cp_size": max_cp_size,
             "max_shard_ranks": max_shard_ranks, "max_response_bytes": max_response_bytes}
    for name in _BOUNDS:
        if given[name] is not None:
            bounds[name] = _int_arg(name, given[name])
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout: must be a number of seconds, got {timeout!r}")
        if not timeout > 0 or not math.isfinite(timeout):
            raise ValueError(f"timeout: must be finite and > 0 seconds, got {timeout!r}")
    req = Client.request(doc_lens, cp_size, strategy, target_imbalance=target_imbalance,
                         heads=heads, head_dim=head_dim, dtype_bytes=dtype_bytes,
                         include_layout=include_layout, batch_id=batch_id,
                         ranks_per_node=ranks_per_node, cost_profile=cost_profile, cost=cost,
                         rank_speed=rank_speed)
    if min_shard_tokens is not None:
        req.min_shard_tokens = _int_arg("min_shard_tokens", min_shard_tokens)
    if attention_mask:
        if not isinstance(attention_mask, str):
            raise TypeError(f"attention_mask: must be a str, got {attention_mask!r}")
        req.attention_mask = attention_mask
    if block_size:
        req.block_size = _int_arg("block_size", block_size)
    try:
        out = native().plan(req.SerializeToString(), timeout=float(timeout or 0.0), **bounds)
    except ValueError as e:
        raise PlanError("INVALID_ARGUMENT", str(e)) from None
    except RuntimeError as e:
        code, _, message = str(e).partition(": ")
        code = code.upper().replace(" ", "_")
        if code == "DEADLINE_EXCEEDED":
            raise TimeoutError(message) from None
        raise PlanError(code, message) from None
    return planner_pb2.PlanResponse.FromString(out)


@dataclasses.dataclass(frozen=True)
class PlanView:
    """A plan as plain data (core::Plan's fields): shards as (doc, start,
    len, rank), by rank ascending, in each rank's token order."""
    cp_size: int
    doc_lens: Tuple[int, ...]
    padding: int
    shards: Tuple[Tuple[int, int, int, int], ...]
    strategy: str = ""
    imbalance: float = 0.0        # metrics, where the plan carried them
    comm_saving: float = 0.0
    targeted_saving: float = 0.0
    # PlanResponse.planner_version ("" where not carried); not compared: the
    # same plan from two planner versions is the same plan.
    planner_version: str = dataclasses.field(default="", compare=False)
    # The mask (docs/bdlm.md): "" and 0 for the causal document mask; under
    # "block_diffusion" doc_lens lists the n noisy copies, then the n clean.
    attention_mask: str = ""
    block_size: int = 0

    @property
    def total_tokens(self) -> int:
        return sum(self.doc_lens)

    @property
    def plan_hash(self) -> str:
        """This plan's hash (core/plan_hash.h; the native module computes
        it from the view's own fields, whatever the plan came from): 16 hex
        digits, PlanResponse.plan_hash of the same plan."""
        return native().plan_hash(list(self.doc_lens), self.cp_size, self.padding,
                                  list(self.shards), block_size=self.block_size)


def response_from_json(p: Any) -> planner_pb2.PlanResponse:
    """A PlanResponse from its JSON (protobuf's JSON mapping with the proto
    field names): a flashcp-plan / flashcp-client line (str or bytes), the
    parsed dict, or json_format.MessageToJson's output. ValueError naming the
    bad field; unknown fields are refused."""
    if isinstance(p, (str, bytes)):
        p = json.loads(p)
    if not isinstance(p, dict):
        raise ValueError(f"plan: expected a JSON object, got {type(p).__name__}")
    try:
        return json_format.ParseDict(p, planner_pb2.PlanResponse())
    except json_format.ParseError as e:
        raise ValueError(f"plan: not a PlanResponse in JSON: {e}") from None


def _view_of_old_json(p: dict) -> PlanView:
    # flashcp-plan's JSON before it became PlanResponse's ("docs", metrics
    # "imbalance", ...); accepted for one release.
    warnings.warn("plan: flashcp-plan's old JSON (\"docs\", \"batch\") is deprecated; "
                  "it now writes PlanResponse in JSON (\"doc_lens\", \"batch_id\")",
                  DeprecationWarning, stacklevel=3)
    try:
        m = p.get("metrics", {})
        return PlanView(cp_size=int(p["cp_size"]), doc_lens=tuple(int(x) for x in p["docs"]),
                        padding=int(p["padding"]),
                        shards=tuple((int(s["doc"]), int(s["start"]), int(s["len"]),
                                      int(s["rank"])) for s in p["shards"]),
                        strategy=str(p.get("strategy", "")),
                        imbalance=float(m.get("imbalance", 0.0)),
                        comm_saving=float(m.get("comm_saving", 0.0)),
                        targeted_saving=float(m.get("targeted_saving", 0.0)))
    except (KeyError, TypeError) as e:
        raise ValueError(f"plan: not a flashcp-plan JSON object (missing or bad {e})") from None


def plan_hash(p: Any) -> str:
    """The plan_hash of any plan plan_view() reads, computed here from its
    doc_lens, cp_size, padding and shards (core::PlanHash, FNV-1a 64 of the
    canonical encoding in core/plan_hash.h): equal to the PlanResponse's
    plan_hash for the same plan, whichever planner made it."""
    return plan_view(p).plan_hash


def plan_view(p: Any) -> PlanView:
    """A PlanView from a PlanResponse (the service or flashcp.plan), its JSON
    (a flashcp-plan line: str, bytes or the parsed dict; response_from_json)
    or a PlanView. ValueError for anything else, a response that carries an
    error, or a plan without cp_size. The old flashcp-plan JSON ("docs") is
    still read, with a DeprecationWarning."""
    if isinstance(p, PlanView):
        return p
    if isinstance(p, (str, bytes)):
        p = json.loads(p)
    if isinstance(p, dict):
        if "docs" in p and "doc_lens" not in p:
            return _view_of_old_json(p)
        p = response_from_json(p)
    if isinstance(p, planner_pb2.PlanResponse):
        if p.HasField("error"):
            raise ValueError(f"plan: the response carries an error (code {p.error.code}): "
                             f"{p.error.message}")
        if p.cp_size < 1:
            raise ValueError(f"plan: cp_size must be at least 1, got {p.cp_size}")
        return PlanView(cp_size=p.cp_size, doc_lens=tuple(p.doc_lens), padding=p.padding,
                        shards=tuple((s.doc, s.start, s.len, s.rank) for s in p.shards),
                        strategy=p.strategy,
                        imbalance=p.metrics.imbalance_ratio,
                        comm_saving=p.metrics.comm_saving_ratio,
                        targeted_saving=p.metrics.targeted_saving_ratio,
                        planner_version=p.planner_version,
                        attention_mask=p.attention_mask, block_size=p.block_size)
    raise ValueError(f"plan: expected a PlanResponse, its JSON or a PlanView, got "
                     f"{type(p).__name__}")
