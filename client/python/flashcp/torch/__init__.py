"""Context parallelism with FlashCP plans inside a PyTorch training step.

    plan = flashcp.torch.plan_on_first_rank(doc_lens, group)  # rank 0 plans, all get it
    ctx = flashcp.torch.CpContext(plan, rank, group)   # plan: PlanResponse / JSON;
                                                       # the group checks it runs one plan
    ids = flashcp.torch.dispatch(input_ids, ctx)       # [C] -> this rank's [C/N]
    labels = ctx.labels(input_ids)                     # next tokens, -100 at doc ends
    pos = ctx.position_ids                             # positions within documents
    ...
    o = flashcp.torch.attention(q, k, v, ctx)          # [C/N, Hq, D], autograd op
    ...
    full = flashcp.torch.undispatch(x_local, ctx)      # every rank: [total, ...]

The exchange layout is the C++ one (worker/cp_layout.h, the GPU step's),
through the native module; the exchange runs on the caller's process group
with torch.distributed collectives; the local attention on CPU is the
project's kernels (worker/attention_cpu.h), fp32 (bf16 inputs are computed
in fp32 and returned in bf16); on CUDA it is the project's cuDNN path
(worker/cuda/shard_attention.h), bf16 only.
"""
from flashcp.torch._attention import attention
from flashcp.torch._context import (AttentionStats, CpContext, ExchangeError,
                                    PlanMismatchError, dispatch, undispatch)
from flashcp.torch._cuda_cache import graph_stats as cuda_graph_stats
from flashcp.torch._group_plan import plan_on_first_rank
from flashcp.torch._metrics import StepMetrics, step_metrics, step_times

__all__ = ["AttentionStats", "CpContext", "ExchangeError", "PlanMismatchError", "StepMetrics",
           "attention", "cuda_graph_stats", "dispatch", "plan_on_first_rank", "step_metrics",
           "step_times", "undispatch"]
