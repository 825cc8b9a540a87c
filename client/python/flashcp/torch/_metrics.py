"""step_metrics: what a training step's attention did on each rank, for a
callback and (where prometheus_client is installed) the metrics the
dashboards read (deploy/grafana/flashcp.json; the names and labels of
worker/metrics.cc, so a training process shows beside the workers)."""
import dataclasses
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from flashcp._native import native
from flashcp._plan import plan_view
from flashcp.torch._context import CpContext, ExchangeError, collective_device
from flashcp_client import planner_pb2


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """One rank's step. attention_seconds: its CPU kernels' time (forward +
    backward); comm_seconds: in the exchange's collectives; bytes_sent /
    bytes_received: exchange payload (both phases); measured_imbalance: max
    over mean of the group's attention_seconds; attention_time_ratio: this
    rank's over the mean; predicted_imbalance: the plan's (workload pairs,
    SPEC Eq. 3); predicted_bytes_sent: the plan's for this rank under
    `scheme` (both phases; 0 where the plan carried no metrics)."""
    rank: int
    cp_size: int
    strategy: str
    scheme: str
    plan_hash: str
    calls: int
    attention_seconds: float
    comm_seconds: float
    bytes_sent: int
    bytes_received: int
    measured_imbalance: float
    attention_time_ratio: float
    predicted_imbalance: float
    predicted_bytes_sent: int
    group_attention_seconds: Tuple[float, ...] = ()  # every rank's attention_seconds, by rank


def step_metrics(ctx: CpContext, scheme: str = "targeted", *,
                 callback: Optional[Callable[[StepMetrics], Any]] = None,
                 plan: Any = None, device: str = "cpu") -> StepMetrics:
    """This rank's StepMetrics of the attention calls on `ctx` since the last
    call (ctx.stats, then reset). A collective on ctx.group (all ranks call
    it): one all-gather of each rank's attention seconds. plan: the
    PlanResponse, for predicted_bytes_sent (its metrics.bytes of `scheme`).
    Calls callback(metrics); where prometheus_client is installed, adds the
    step to its default registry as flashcp_worker_attention_seconds_total,
    flashcp_worker_comm_duration_seconds, flashcp_worker_bytes_sent_total,
    flashcp_worker_bytes_received_total, flashcp_worker_steps_total (labels
    strategy, scheme, device), flashcp_worker_attention_time_ratio and
    flashcp_worker_predicted_imbalance_ratio (labels strategy, device)."""
    s = ctx.stats
    mine = s.kernel_seconds
    every = torch.zeros(ctx.size, dtype=torch.float64, device=collective_device(ctx.group))
    if ctx.size > 1:
        try:
            dist.all_gather_into_tensor(every, every.new_tensor([mine]), group=ctx.group)
        except RuntimeError as e:
            raise ExchangeError(f"rank {ctx.rank}: step_metrics' all-gather of attention "
                                f"seconds over the group of {ctx.size} failed: {e}") from e
    else:
        every[0] = mine
    times = every.tolist()
    mean = sum(times) / len(times)
    predicted_sent = 0
    if plan is not None:
        for b in plan.metrics.bytes:
            if b.scheme == scheme and len(b.sent_bytes) == ctx.size:
                predicted_sent = int(b.sent_bytes[ctx.rank])
    m = StepMetrics(
        rank=ctx.rank, cp_size=ctx.size, strategy=ctx.plan.strategy, scheme=scheme,
        plan_hash=ctx.plan_hash, calls=s.calls, attention_seconds=mine,
        comm_seconds=s.comm_seconds, bytes_sent=s.bytes_sent, bytes_received=s.bytes_received,
        measured_imbalance=max(times) / mean if mean > 0 else 1.0,
        attention_time_ratio=mine / mean if mean > 0 else 1.0,
        predicted_imbalance=ctx.plan.imbalance, predicted_bytes_sent=predicted_sent,
        group_attention_seconds=tuple(times))
    ctx.stats = type(s)()
    _export(m, device)
    if callback is not None:
        callback(m)
    return m


_lock = threading.Lock()
_families: Optional[Dict[str, Any]] = None  # prometheus_client metrics; {} where not installed


def _export(m: StepMetrics, device: str) -> None:
    global _families
    with _lock:
        if _families is None:
            _families = _make_families()
        if not _families:
            return
        run = dict(strategy=m.strategy, scheme=m.scheme, device=device)
        f = _families
        f["attention"].labels(**run).inc(m.attention_seconds)
        f["comm"].labels(**run).observe(m.comm_seconds)
        f["sent"].labels(**run).inc(m.bytes_sent)
        f["received"].labels(**run).inc(m.bytes_received)
        f["steps"].labels(**run).inc()
        f["ratio"].labels(strategy=m.strategy, device=device).set(m.attention_time_ratio)
        f["predicted"].labels(strategy=m.strategy, device=device).set(m.predicted_imbalance)


def _make_families() -> Dict[str, Any]:
    try:
        import prometheus_client as pc
    except ImportError:
        return {}
    run = ["strategy", "scheme", "device"]
    # worker/metrics.cc's duration buckets: 0.5 ms doubling to 65 s.
    buckets = [0.0005 * 2 ** i for i in range(18)]
    return {
        "attention": pc.Counter("flashcp_worker_attention_seconds",
                                "Attention compute seconds of this rank (CPU kernels, forward "
                                "+ backward)", run),
        "comm": pc.Histogram("flashcp_worker_comm_duration_seconds",
                             "Time inside KV and gradient collectives per step (waiting for "
                             "peers included)", run, buckets=buckets),
        "sent": pc.Counter("flashcp_worker_bytes_sent", "KV and gradient payload bytes this "
                           "rank sent", run),
        "received": pc.Counter("flashcp_worker_bytes_received", "KV and gradient payload bytes "
                               "this rank received", run),
        "steps": pc.Counter("flashcp_worker_steps", "Training steps completed", run),
        "ratio": pc.Gauge("flashcp_worker_attention_time_ratio", "This rank's attention "
                          "compute time over its group's mean, last step",
                          ["strategy", "device"]),
        "predicted": pc.Gauge("flashcp_worker_predicted_imbalance_ratio", "The planner's "
                              "imbalance ratio of the plan of the last step",
                              ["strategy", "device"]),
    }


def step_times(plan: Any, seconds: Sequence[float]) -> planner_pb2.StepTimes:
    """One step for Client.report_step_times: each rank's plan features
    (core::PlanRankFeatures through the native module: the planner's own
    definition) with its measured attention seconds (StepMetrics'
    group_attention_seconds, by rank). plan: any form plan_view reads.
    ValueError unless there is one time per rank."""
    view = plan_view(plan)
    if len(seconds) != view.cp_size:
        raise ValueError(f"seconds: {len(seconds)} times for a plan of cp_size {view.cp_size}; "
                         "want one per rank")
    features = native().plan_rank_features(list(view.doc_lens), view.cp_size, view.padding,
                                           list(view.shards))
    return planner_pb2.StepTimes(cp_size=view.cp_size, ranks=[
        planner_pb2.RankStepTime(whole_pairs=w, prefixed_pairs=p, sequences=s, tokens=t,
                                 seconds=float(sec))
        for (w, p, s, t), sec in zip(features, seconds)])
