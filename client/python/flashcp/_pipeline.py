"""flashcp.plan_pipeline: DPP-style pipeline-parallel plans of a batch's
documents, in process (core/pipeline.h through the native binding, with the
planner's greedy checkpointing: the checkpoint ILP links CBC, which the
extension does not). docs/pipeline.md has the model and what it claims."""
import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from flashcp._native import native
from flashcp._plan import PlanError


def plan_pipeline(doc_lens: Iterable[int], pp_size: int = 4, strategy: str = "dpp", *,
                  sp_size: int = 0, memory_budget_gib: float = 0.0, layers: int = 0,
                  hidden: int = 0, kv_hidden: int = 0, ffn_hidden: int = 0, vocab: int = 0,
                  profile: str = "", slice_count: int = 0,
                  ckpt_time_limit_seconds: float = 5.0,
                  coefficients: Optional[Mapping[str, float]] = None) -> Dict[str, Any]:
    """Plans `doc_lens` (tokens per document) for `pp_size` pipeline stages.
    Zero values mean the documented defaults (LLaMA-2-7B shape, d_s = 1,
    80 GiB per GPU, the "analytic" profile). `coefficients` overrides the
    profile's by PipelineProfile field name ("fwd_pair_s": seconds). Returns the plan as a dict with
    flashcp-plan --pipeline's fields: chunks ({kind, slices: [{doc, start,
    len}]}), pipelines ({forward, backward}), ckpt[stage][chunk], slice_count,
    ckpt_solver, ckpt_gap, ckpt_optimal, prediction {iteration_s,
    bubble_share, recompute_s, stage_peak_bytes}, planning_seconds.
    Checkpointing in process is the greedy one (ckpt_solver "greedy" for the
    DPP strategies; the baselines' "none", "full", "uniform"); the checkpoint
    ILP (ckpt_solver "ilp") runs in the planner service's PlanPipeline and
    in flashcp-plan --pipeline, which link CBC; ckpt_time_limit_seconds, its
    time limit there, is accepted here for compatibility and has no effect.
    Raises PlanError: INVALID_ARGUMENT naming the field, FAILED_PRECONDITION
    when no plan fits the memory budget (saying by how much)."""
    del ckpt_time_limit_seconds  # no checkpoint ILP in process
    try:
        out = native().plan_pipeline(
            [int(d) for d in doc_lens], int(pp_size), str(strategy), int(sp_size),
            float(memory_budget_gib) * (1 << 30), int(layers), int(hidden), int(kv_hidden),
            int(ffn_hidden), int(vocab), str(profile), int(slice_count),
            {str(k): float(v) for k, v in (coefficients or {}).items()})
    except ValueError as e:
        raise PlanError("INVALID_ARGUMENT", str(e)) from None
    except RuntimeError as e:
        code, _, message = str(e).partition(": ")
        raise PlanError(code.upper().replace(" ", "_"), message) from None
    return json.loads(out)


def pipeline_stage_order(plan: Dict[str, Any], pp_size: int) -> List[List[Tuple[int, bool]]]:
    """Per stage, the op order of `plan` (a plan_pipeline dict) as (chunk,
    backward) pairs: each pipeline's 1F1B order (core::PipelineStageOrder,
    the one the simulator replays), pipelines back to back."""
    orders: List[List[Tuple[int, bool]]] = [[] for _ in range(pp_size)]
    for group in plan["pipelines"]:
        for p, ops in enumerate(native().pipeline_stage_order(
                int(pp_size), list(group["forward"]), list(group["backward"]))):
            orders[p].extend((int(k), bool(b)) for k, b in ops)
    return orders
