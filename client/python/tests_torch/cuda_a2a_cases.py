"""What each rank runs in test_cuda_all_to_all.py (harness.run): the
all_to_all scheme and mixed plans on CUDA tensors against the CPU path."""
import torch

import flashcp.torch as ft
from cases import global_inputs


def cuda_against_cpu_cases(rank, n, specs):
    """Per spec, attention() on cuda:0 (bf16) and on the CPU (fp32 on the
    same bf16 values), forward and backward, scheme spec["scheme"] (a name
    or a mixed plan): ("ok", max abs errors of O, dQ, dK, dV, the CPU
    result's max abs of each, {device: (bytes sent, bytes received)},
    whether this position's query heads read their KV heads in cuDNN's GQA
    order), or ("refused", {device: (type, message)}) where a device's call
    raised (both are expected to refuse alike)."""
    from flashcp.torch._all_to_all import A2aPlan
    out = {}
    for key, spec in specs.items():
        lens = spec["doc_lens"]
        hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
        ctx = ft.CpContext(spec["plan"], rank, doc_lens=lens)
        q, k, v, dout = (ft.dispatch(t, ctx) for t in
                         global_inputs(sum(lens), hq, hkv, d, spec["seed"], torch.bfloat16))
        runs, moved, refused = {}, {}, {}
        for dev, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
            ql, kl, vl = (t.to(dev, dtype).requires_grad_() for t in (q, k, v))
            sent, received = ctx.stats.bytes_sent, ctx.stats.bytes_received
            try:
                o = ft.attention(ql, kl, vl, ctx, scheme=spec["scheme"])
            except RuntimeError as e:  # raised before any collective, on both devices
                refused[dev] = (type(e).__name__, str(e))
                continue
            o.backward(dout.to(dev, dtype))
            if dev == "cuda":
                torch.cuda.synchronize()
            runs[dev] = [t.detach().float().cpu() for t in (o, ql.grad, kl.grad, vl.grad)]
            moved[dev] = (ctx.stats.bytes_sent - sent, ctx.stats.bytes_received - received)
        if refused:
            out[key] = ("refused", refused)
            continue
        err = [float((a - b).abs().max()) for a, b in zip(runs["cuda"], runs["cpu"])]
        ref = [float(b.abs().max()) for b in runs["cpu"]]
        gqa = A2aPlan(ctx, hq, hkv, d).gqa_order if spec["scheme"] == "all_to_all" else None
        out[key] = ("ok", err, ref, moved, gqa)
    return out
