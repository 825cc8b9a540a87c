"""Stock transformers models (Llama; Qwen2: GQA 4:1, q/k/v bias, RoPE) built
from small random-init configs (nothing downloaded), and what one rank of a
CP group computes with flashcp.torch.hf. Importable by the ranks (harness)."""
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 96


def config(arch: str):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=512, attention_dropout=0.0,
                  tie_word_embeddings=False,
                  # Larger than the default 0.02: peaked attention, gradients far from 0,
                  # so that a wrong mask or a lost exchange shows in the comparison.
                  initializer_range=0.3)
    if arch == "llama":
        return LlamaForCausalLM, LlamaConfig(num_key_value_heads=2, **common)
    if arch == "qwen2":
        return Qwen2ForCausalLM, Qwen2Config(num_key_value_heads=1, use_sliding_window=False,
                                             **common)
    raise ValueError(arch)


def model(arch: str, seed: int, attn: str):
    cls, cfg = config(arch)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    return cls(cfg).float()


def documents(seed: int, lens):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lens]


def reference(arch: str, seed: int, docs, count_docs=None):
    """No CP: the stock model with eager attention, one document at a time
    (the document mask by construction), loss = sum over every labelled
    token / their count (count_docs: the documents the mean is over, default
    docs). Returns (loss, {name: grad})."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend (seconds on a loaded VM)
    try:
        return _reference(arch, seed, docs, count_docs)
    finally:
        torch.set_num_threads(threads)


def _reference(arch, seed, docs, count_docs):
    m = model(arch, seed, "eager")
    count = sum(len(d) - 1 for d in (count_docs if count_docs is not None else docs))
    total = 0.0
    for d in docs:
        ids = torch.tensor([d])
        out = m(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(count),
                use_cache=False)
        out.loss.backward()
        total += out.loss.item()
    return total, {k: p.grad.clone() for k, p in m.named_parameters()}


def cp_rank(rank, n, archs, seed, docs, scheme):
    """Per arch: this CP group's loss (summed over ranks), the gradients
    summed over ranks (rank 0 returns them) and the exchange's bytes."""
    import flashcp.torch.hf as fhf
    out = {}
    for arch in archs:
        m = model(arch, seed, fhf.ATTN_IMPLEMENTATION)
        batch = fhf.cp_batch(docs, scheme=scheme, plan_fields=dict(min_shard_tokens=8))
        res = m(**batch)
        res.loss.backward()
        loss = res.loss.detach().clone()
        dist.all_reduce(loss)
        grads = {}
        for k, p in m.named_parameters():
            dist.all_reduce(p.grad)
            grads[k] = p.grad.numpy().copy()  # by value (a tensor would go by shared fd)
        moved = torch.tensor([batch[fhf.CONTEXT_KWARG].stats.bytes_sent])
        dist.all_reduce(moved)
        out[arch] = (loss.item(), grads if rank == 0 else None, int(moved),
                     int(batch["num_items_in_batch"]), tuple(batch["input_ids"].shape))
    return out


def refusals(rank, n):
    """What flashcp_attention_forward says to each input it refuses (one rank)."""
    import flashcp
    import flashcp.torch as ft
    import flashcp.torch.hf as fhf
    ctx = ft.CpContext(flashcp.plan([8], 1), 0)
    q = torch.zeros(1, 4, 8, 16)
    kv = torch.zeros(1, 2, 8, 16)
    cases = {"no context": dict(),
             "mask": dict(attention_mask=torch.ones(1, 1, 8, 8, dtype=torch.bool)),
             "dropout": dict(dropout=0.1),
             "window": dict(sliding_window=4),
             "batch": dict(q=torch.zeros(2, 4, 8, 16))}
    out = {}
    for name, kw in cases.items():
        args = {"attention_mask": None, **kw}
        qq = args.pop("q", q)
        if name != "no context":
            args[fhf.CONTEXT_KWARG] = ctx
        try:
            fhf.flashcp_attention_forward(None, qq, kv, kv, **args)
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    o, w = fhf.flashcp_attention_forward(None, q, kv, kv, None, **{fhf.CONTEXT_KWARG: ctx})
    out["ok"] = (tuple(o.shape), w)
    return out
