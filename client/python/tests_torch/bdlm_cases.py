"""What each rank runs in test_bdlm.py (harness.run): flashcp.torch under the
block-diffusion mask (docs/bdlm.md), and the dense references it is held to."""
import torch
import torch.nn.functional as F

import flashcp.torch as ft


def bd_mask(doc_lens, b):
    """[2C, 2C] bool over [noisy ; clean], written from the issue's table:
    same document only; noisy query block j sees noisy keys of block j and
    clean keys of blocks < j; clean query block j sees clean keys of blocks
    <= j, never a noisy key."""
    doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
    pos = torch.cat([torch.arange(n) for n in doc_lens])
    doc2, blk2 = torch.cat([doc, doc]), torch.cat([pos // b, pos // b])
    noisy = torch.cat([torch.ones(len(doc), dtype=torch.bool), torch.zeros(len(doc), dtype=torch.bool)])
    same = doc2[:, None] == doc2[None, :]
    qn, kn = noisy[:, None], noisy[None, :]
    qb, kb = blk2[:, None], blk2[None, :]
    see = (qn & kn & (kb == qb)) | (qn & ~kn & (kb < qb)) | (~qn & ~kn & (kb <= qb))
    return same & see


def inputs(doc_lens, heads, d, seed):
    rows = 2 * sum(doc_lens)
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, heads, d, generator=g) for _ in range(4)]  # q, k, v, dout


def dense(q, k, v, dout, mask, dtype):
    """Masked softmax attention in `dtype` (torch SDPA's math) and its grads."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                       attn_mask=mask).transpose(0, 1)
    o.backward(dout.to(dtype))
    return [o.detach(), q.grad, k.grad, v.grad]


def attention_case(rank, n, spec):
    """This rank's O, dQ, dK, dV under each scheme (local rows, global order
    via ctx.global_rows), plus what the context says of its rows."""
    lens, b, plan = spec["doc_lens"], spec["block_size"], spec["plan"]
    ctx = ft.CpContext(plan, rank, doc_lens=lens)
    q, k, v, dout = inputs(lens, spec["heads"], spec["d"], spec["seed"])
    # Plain lists: tensors would travel as shared memory the rank frees on exit.
    out = {"global_rows": ctx.global_rows.tolist(), "is_noisy": ctx.is_noisy.tolist(),
           "block_index": ctx.block_index.tolist(), "total_tokens": ctx.total_tokens}
    # undispatch gives back the 2C rows [noisy ; clean] in the global order.
    out["roundtrip"] = bool(torch.equal(ft.undispatch(ft.dispatch(q, ctx), ctx), q))
    for scheme in ("targeted", "allgather", "full_kv"):
        ql, kl, vl = (ft.dispatch(t, ctx).requires_grad_() for t in (q, k, v))
        o = ft.attention(ql, kl, vl, ctx, scheme=scheme)
        o.backward(ft.dispatch(dout, ctx))
        out[scheme] = [t.detach().tolist() for t in (o, ql.grad, kl.grad, vl.grad)]
    try:
        ft.dispatch(torch.zeros(sum(lens), 2), ctx)  # C rows, not 2C
        out["short_input"] = ""
    except ValueError as e:
        out["short_input"] = str(e)
    return out


def attention_cases(rank, n, specs):
    return {key: attention_case(rank, n, spec) for key, spec in specs.items()}


def cuda_attention_cases(rank, n, specs):
    """test_cuda.py: per case, the CUDA path (bf16, the masked kernels through
    the binding's CUDA hook) against the CPU path (fp32 on the same bf16
    values) on this rank's rows: max abs error and the CPU result's max abs,
    for O, dQ, dK, dV."""
    out = {}
    for key, spec in specs.items():
        lens, plan, scheme = spec["doc_lens"], spec["plan"], spec["scheme"]
        ctx = ft.CpContext(plan, rank, doc_lens=lens)
        q, k, v, dout = (t.bfloat16().float() for t in inputs(lens, spec["heads"], spec["d"],
                                                                spec["seed"]))
        res = {}
        for dev, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
            ql, kl, vl = (ft.dispatch(t, ctx).to(dev, dtype).requires_grad_() for t in (q, k, v))
            o = ft.attention(ql, kl, vl, ctx, scheme=scheme)
            o.backward(ft.dispatch(dout, ctx).to(dev, dtype))
            res[dev] = [t.detach().float().cpu() for t in (o, ql.grad, kl.grad, vl.grad)]
        out[key] = {"err": [float((a - b).abs().max()) for a, b in zip(res["cuda"], res["cpu"])],
                    "ref": [float(b.abs().max()) for b in res["cpu"]]}
    return out
