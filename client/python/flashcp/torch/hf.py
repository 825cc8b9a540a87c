"""Hugging Face transformers adapter: FlashCP attention inside a stock model.

    import flashcp.torch.hf as fhf
    model = LlamaForCausalLM(config)                   # or Qwen2, any model whose
    model.set_attn_implementation(fhf.ATTN_IMPLEMENTATION)  # attention goes through
                                                       # transformers' AttentionInterface
    batch = fhf.cp_batch(documents, group)             # pack, plan (rank 0), dispatch
    out = model(**batch)                               # out.loss: this rank's share
    out.loss.backward()                                # then sum gradients over the group
                                                       # (flashcp.torch.dp_cp: DP x CP)

How a packed CP batch maps onto a model written for [batch, seq] inputs: one
packed sequence (batch 1) of this rank's C/N tokens in the plan's local
order; position_ids are positions within each document (RoPE sees what it
would see without CP); the attention function ignores the model's mask
(none is built: "flashcp" has no mask function, so transformers skips it)
and runs flashcp.torch.attention, the plan's document-causal mask; labels
are already the next tokens (shift_labels, -100 at each document's end and on
padding), and num_items_in_batch is the whole group's (and data-parallel
replicas') count of labelled tokens, so each rank's loss is its share of one
mean and the group's gradients add up to the no-CP gradient.

The CpContext reaches the attention function as the model's keyword argument
`flashcp_context` (transformers passes unknown keyword arguments of a
model's forward down to its attention function). Requires transformers with
AttentionInterface (4.48 or later; the project pins 4.57.6).
"""
from typing import Any, Dict, Optional, Sequence

import torch
import torch.distributed as dist

import flashcp
from flashcp.torch._attention import attention
from flashcp.torch._context import CpContext, collective_device, dispatch
from flashcp.torch._group_plan import plan_on_first_rank

try:
    from transformers import AttentionInterface
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("flashcp.torch.hf needs transformers 4.48 or later (AttentionInterface); "
                      f"import failed: {e}") from e

ATTN_IMPLEMENTATION = "flashcp"
CONTEXT_KWARG = "flashcp_context"
SCHEME_KWARG = "flashcp_scheme"


def flashcp_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                              scaling: Optional[float] = None, dropout: float = 0.0,
                              **kwargs: Any):
    """transformers' attention-function contract: query [1, Hq, C/N, D],
    key and value [1, Hkv, C/N, D] (RoPE applied); returns
    (attn_output [1, C/N, Hq, D], None). The document-causal mask is the
    plan's; a mask from the model, dropout, a sliding window or a batch of
    more than one packed sequence are refused (ValueError), not ignored."""
    ctx = kwargs.get(CONTEXT_KWARG)
    if not isinstance(ctx, CpContext):
        raise ValueError(f"flashcp attention: call the model with {CONTEXT_KWARG}=<CpContext> "
                         f"(flashcp.torch.hf.cp_batch puts it in the batch); got "
                         f"{type(ctx).__name__}")
    if query.dim() != 4 or query.shape[0] != 1:
        raise ValueError(f"flashcp attention: query {tuple(query.shape)}; expected one packed "
                         "sequence [1, heads, C/N, head_dim] (batch size 1)")
    if attention_mask is not None:
        raise ValueError("flashcp attention: the model was given an attention mask; the plan's "
                         "document-causal mask is the mask (pass no attention_mask)")
    if dropout:
        raise ValueError(f"flashcp attention: attention dropout {dropout} is not supported "
                         "(set the config's attention_dropout to 0)")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"flashcp attention: sliding window {kwargs['sliding_window']} is not "
                         "supported (full document-causal attention only)")
    q = query[0].transpose(0, 1).contiguous()
    k = key[0].transpose(0, 1).contiguous()
    v = value[0].transpose(0, 1).contiguous()
    o = attention(q, k, v, ctx, kwargs.get(SCHEME_KWARG) or "targeted", softmax_scale=scaling)
    return o.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, flashcp_attention_forward)


def cp_batch(documents: Sequence[Sequence[int]], group: Optional[Any] = None, *,
             strategy: str = "", client: Optional[flashcp.Client] = None,
             scheme: str = "targeted", count_group: Optional[Any] = None,
             ignore_index: int = -100, plan_fields: Optional[Dict[str, Any]] = None,
             device: Optional[torch.device] = None) -> Dict[str, Any]:
    """The keyword arguments of a CausalLM's forward for this rank's share of
    one packed CP batch. A collective on `group` (and count_group): every
    rank calls it.

    documents: the batch's documents (token id sequences), the same on
    every rank of the group (rank 0's are planned; the others are checked
    against the plan). The group's rank 0 plans (client: the planner service;
    None: in process) and broadcasts the plan (plan_on_first_rank).
    count_group: the group over which num_items_in_batch is summed (None:
    `group`; in DP x CP, the whole DP x CP group, since the loss is one mean
    over every replica's tokens).

    Returns input_ids, position_ids, labels and shift_labels [1, C/N]
    (labels equal to shift_labels: the model computes a loss when labels is
    set, and takes shift_labels as the already shifted targets),
    num_items_in_batch (int64 scalar tensor), use_cache False,
    flashcp_context (the CpContext), flashcp_scheme. The tensors are on
    `device` (default: the CPU).
    """
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    lens = [len(d) for d in documents]
    plan = plan_on_first_rank(lens, group, strategy, client=client, **(plan_fields or {}))
    ctx = CpContext(plan, rank, group, doc_lens=lens, check_plan=False)
    ids = torch.tensor([t for d in documents for t in d], dtype=torch.int64)
    labels = ctx.labels(ids, ignore_index)
    counted = count_group if count_group is not None else group
    count = (labels != ignore_index).sum().to(collective_device(counted))
    dist.all_reduce(count, group=counted)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    labels = labels.unsqueeze(0).to(dev)
    return {"input_ids": dispatch(ids, ctx).unsqueeze(0).to(dev),
            "position_ids": ctx.position_ids.unsqueeze(0).to(dev),
            "labels": labels, "shift_labels": labels,
            "num_items_in_batch": count.to(dev), "use_cache": False,
            CONTEXT_KWARG: ctx, SCHEME_KWARG: scheme}


class CpCollator:
    """A DataLoader collate_fn: a list of examples (token id sequences, or
    dicts with "input_ids") -> cp_batch of them as one packed batch. It runs
    collectives on the group, so the DataLoader must collate in the training
    process (num_workers=0), the same examples on every rank of the group."""

    def __init__(self, group: Optional[Any] = None, **cp_batch_kwargs: Any):
        self.group = group
        self.kwargs = cp_batch_kwargs

    def __call__(self, examples: Sequence[Any]) -> Dict[str, Any]:
        docs = [list(e["input_ids"]) if isinstance(e, dict) else list(e) for e in examples]
        return cp_batch(docs, self.group, **self.kwargs)


__all__ = ["ATTN_IMPLEMENTATION", "CONTEXT_KWARG", "SCHEME_KWARG", "CpCollator", "cp_batch",
           "flashcp_attention_forward"]
