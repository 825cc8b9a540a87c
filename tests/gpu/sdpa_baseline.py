#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes flashcp-gpu-bench timed.

Reads the shapes file (--shapes, written by `flashcp-gpu-bench --mode=kernels
--shapes_out`), and for each shape and each backend (cuDNN, flash) times causal
attention forward and backward with CUDA events (median after warm-up) on
random bf16 inputs, with the FLOPs counted as flashcp counts them (SPEC.md:
4*H*D*pairs forward, 2.5x that backward), so the TFLOP/s compare directly.

Batches of equal documents run as one dense [B, H, L, D] call; packed batches
of unequal documents run as one nested (jagged) tensor call per backend, and
also through FlashAttention's varlen op directly (torch_flash_varlen). A backend that
refuses a shape is reported with its error, not skipped silently.
Prints one JSON object per line (also appended to --json_out).
"""
import argparse
import itertools
import json
import statistics
import sys


def pairs(docs):
    return sum(l * (l + 1) // 2 for l in docs)


def make_inputs(torch, docs, hq, hkv, d, gen):
    """Returns (leaves, (q, k, v), layout): leaves carry requires_grad; q, k, v
    are [B, H, L, D] views (dense, or jagged nested tensors)."""
    dev = "cuda"
    if len(set(docs)) == 1:
        b, l = len(docs), docs[0]
        def dense(h):
            return torch.randn(b, h, l, d, device=dev, dtype=torch.bfloat16, generator=gen,
                               requires_grad=True)
        leaves = [dense(hq), dense(hkv), dense(hkv)]
        return leaves, tuple(leaves), "dense"
    def jagged(h):
        parts = [torch.randn(l, h, d, device=dev, dtype=torch.bfloat16, generator=gen) for l in docs]
        return torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
    leaves = [jagged(hq), jagged(hkv), jagged(hkv)]
    return leaves, tuple(t.transpose(1, 2) for t in leaves), "jagged"


def time_fwd_bwd(torch, forward, backward, leaves, warmup, iters):
    """Median forward and backward times (ms, CUDA events) of `forward()` and
    `backward(its output)`, after `warmup` untimed rounds; gradients cleared
    between rounds."""
    fwd, bwd = [], []
    for i in range(warmup + iters):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        out = forward()
        e1.record()
        backward(out)
        e2.record()
        torch.cuda.synchronize()
        if i >= warmup:
            fwd.append(e0.elapsed_time(e1))
            bwd.append(e1.elapsed_time(e2))
        for t in leaves:
            t.grad = None
    return statistics.median(fwd), statistics.median(bwd)


def time_backend(torch, backend, docs, hq, hkv, d, warmup, iters, seed):
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    leaves, (q, k, v), layout = make_inputs(torch, docs, hq, hkv, d, gen)
    gqa = {"enable_gqa": True} if hq != hkv else {}
    dout = []  # made once, from the first output's shape

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    def backward(o):
        # The output's values as a dense tensor: a plain gradient fits any layout.
        out = o.transpose(1, 2).values() if layout == "jagged" else o
        if not dout:
            dout.append(torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen))
        out.backward(dout[0])

    with sdpa_kernel([backend]):
        f, b = time_fwd_bwd(torch, forward, backward, leaves, warmup, iters)
    return f, b, layout


def time_flash_varlen(torch, docs, hq, hkv, d, warmup, iters, seed):
    """FlashAttention's own varlen entry (cu_seqlens, packed [T, H, D]), the
    op that nested-tensor SDPA lowers to, called directly: packed batches
    without the nested-tensor layer. Differentiable through autograd."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    total = sum(docs)

    def leaf(h):
        return torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=gen,
                           requires_grad=True)
    q, k, v = leaf(hq), leaf(hkv), leaf(hkv)
    cu = torch.tensor([0] + list(itertools.accumulate(docs)), device="cuda", dtype=torch.int32)
    m = max(docs)
    dout = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    def forward():
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, m, m, 0.0, True, False)[0]

    f, b = time_fwd_bwd(torch, forward, lambda o: o.backward(dout), (q, k, v), warmup, iters)
    return f, b, "varlen"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--json_out", default="")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend
    spec = json.load(open(a.shapes))
    hq, hkv, d = spec["heads_q"], spec["heads_kv"], spec["head_dim"]
    out = open(a.json_out, "a") if a.json_out else None
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", file=sys.stderr)
    for s in spec["shapes"]:
        docs = s["docs"]
        flops_f = 4.0 * hq * d * pairs(docs)
        for name, backend in (("torch_cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("torch_flash", SDPBackend.FLASH_ATTENTION),
                              ("torch_flash_varlen", None)):
            if backend is None and len(set(docs)) == 1:
                continue  # equal documents: the dense calls above are the baseline
            rec = {"bench": "kernel", "impl": name, "shape": s["name"], "tokens": sum(docs),
                   "docs": len(docs), "heads_q": hq, "heads_kv": hkv}
            try:
                if backend is None:
                    f, b, layout = time_flash_varlen(torch, docs, hq, hkv, d, a.warmup, a.iters, a.seed)
                else:
                    f, b, layout = time_backend(torch, backend, docs, hq, hkv, d, a.warmup, a.iters,
                                                a.seed)
                rec.update(layout=layout, fwd_ms=round(f, 4), bwd_ms=round(b, 4),
                           fwd_tflops=round(flops_f / (f * 1e-3) / 1e12, 1),
                           bwd_tflops=round(2.5 * flops_f / (b * 1e-3) / 1e12, 1))
            except Exception as e:  # a refused shape is a result
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            line = json.dumps(rec)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()


if __name__ == "__main__":
    main()
