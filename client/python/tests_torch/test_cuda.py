"""The CUDA path of attention() (bf16, the project's cuDNN kernels through the
binding's CUDA hook) against the CPU path: marked gpu, skipped where torch
sees no CUDA device (CI, the build machine). tests/gpu/device_check.sh runs
it on a lent GPU.

Tolerance: the CUDA side stores O, dQ, dK, dV in bf16 (8 mantissa bits) and
cuDNN rounds the probabilities to bf16 before P.V; the CPU side is fp32 on
the same bf16 inputs. Each max abs error must be within 2e-2 + 2e-2 * the
CPU result's max abs."""
import math

import pytest
import torch

import cases
import flashcp
import harness
from flashcp._native import native

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch.cuda.is_available() is False)")]

DOCS = [37, 1, 60, 5, 100, 1, 1, 29]  # one-token documents; 234 = padding 2 at N = 4


def _close(err, ref):
    return err <= 2e-2 + 2e-2 * ref


def test_native_cuda_shards_match_the_cpu_kernels_on_every_rank():
    """Both shard groups (whole, prefixed) on one process: the native CUDA and
    CPU attention of each rank of an N = 4 plan, on the same staged KV."""
    n, hq, hkv, d = 4, 4, 2, 64
    scale = 1.0 / math.sqrt(d)
    plan = flashcp.plan(DOCS, n, "flashcp", min_shard_tokens=8)
    p = flashcp.plan_view(plan)
    mod = native()
    assert mod.cuda_built, "this build has no CUDA backend"
    g = torch.Generator().manual_seed(5)
    prefixed = 0
    for rank in range(n):
        lay = mod.RankLayout(list(p.doc_lens), n, p.padding, list(p.shards), rank, "targeted")
        rows = lay.local_rows
        stream = torch.cuda.current_stream().cuda_stream
        cu = mod.CudaAttention(lay, hq, hkv, d, scale, stream)
        cpu = mod.CpuAttention(lay, hq, d, scale, 2)
        srows = cu.stage_rows
        prefixed += srows > 0
        x = {name: torch.randn(r, h, d, generator=g).bfloat16() for name, r, h in
             (("q", rows, hq), ("k", rows, hkv), ("v", rows, hkv), ("ks", srows, hkv),
              ("vs", srows, hkv), ("dout", rows, hq))}
        rep = {name: (t.float().repeat_interleave(hq // hkv, dim=1) if t.shape[1] == hkv
                      else t.float()).contiguous() for name, t in x.items()}
        buf = lambda t: (t.data_ptr(), t.numel())  # noqa: E731
        # CPU: fp32, KV heads repeated (the CPU kernels take equal heads).
        co, clse = torch.zeros(rows, hq, d), torch.zeros(rows, hq)
        cpu.forward(*(buf(rep[k]) for k in ("q", "k", "v", "ks", "vs")), buf(co), buf(clse))
        cg = [torch.zeros_like(rep[k]) for k in ("q", "k", "v", "ks", "vs")]
        cpu.backward(*(buf(rep[k]) for k in ("q", "k", "v", "ks", "vs")), buf(co), buf(clse),
                     buf(rep["dout"]), *(buf(t) for t in cg))
        # CUDA: bf16, KV heads as they are.
        dx = {k: t.cuda() for k, t in x.items()}
        go, glse = torch.zeros_like(dx["q"]), torch.zeros(rows, hq, device="cuda")
        both = mod.CUDA_WHOLE_SHARDS | mod.CUDA_PREFIXED_SHARDS
        cu.forward(*(buf(dx[k]) for k in ("q", "k", "v", "ks", "vs")), buf(go), buf(glse), stream,
                   both)
        gg = [torch.zeros_like(dx[k]) for k in ("q", "k", "v", "ks", "vs")]
        cu.backward(*(buf(dx[k]) for k in ("q", "k", "v", "ks", "vs")), buf(go), buf(glse),
                    buf(dx["dout"]), *(buf(t) for t in gg), stream, both)
        torch.cuda.synchronize()
        # The groups one at a time, on two streams at once (as attention()
        # runs them), into separate buffers: bitwise the same rows.
        side = torch.cuda.Stream()
        so = [torch.zeros_like(go) for _ in range(2)]
        sl = [torch.zeros_like(glse) for _ in range(2)]
        side.wait_stream(torch.cuda.current_stream())
        cu.forward(buf(dx["q"]), buf(dx["k"]), buf(dx["v"]), (0, 0), (0, 0), buf(so[0]),
                   buf(sl[0]), side.cuda_stream, mod.CUDA_WHOLE_SHARDS)
        cu.forward(buf(dx["q"]), (0, 0), (0, 0), buf(dx["ks"]), buf(dx["vs"]), buf(so[1]),
                   buf(sl[1]), stream, mod.CUDA_PREFIXED_SHARDS)
        torch.cuda.synchronize()
        whole = torch.cat([torch.arange(r0, r0 + n) for r0, start, n, _ in lay.segments()
                           if start == 0] or [torch.empty(0, dtype=torch.int64)]).cuda()
        merged = so[1].index_copy(0, whole, so[0].index_select(0, whole))
        assert torch.equal(merged, go), f"rank {rank}: split groups' O differs"
        assert cu.fallback_reason == "", cu.fallback_reason  # cuDNN ran, not the plain kernels
        # GQA: the CPU's per-query-head key gradients summed per KV head.
        fold = lambda t: t.view(t.shape[0], hkv, hq // hkv, d).sum(2)  # noqa: E731
        want = [co, clse, cg[0]] + [fold(t) for t in cg[1:]]
        got = [t.float().cpu() for t in [go, glse] + gg]
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv", "dk_stage", "dv_stage"), got, want):
            if b.numel() == 0:
                continue
            err, ref = float((a - b).abs().max()), float(b.abs().max())
            assert _close(err, ref), f"rank {rank} {name}: max abs error {err} (|ref| {ref})"
    assert prefixed > 0, "the plan has no prefixed shards: the test would not cover them"


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("scheme", ["targeted", "allgather"])
def test_cuda_attention_matches_the_cpu_path(scheme, n):
    # n > 1: every rank on cuda:0 over the harness's gloo group, so the
    # exchange is host-staged (CpContext.host_staged); the whole shards'
    # attention overlaps it on the side stream, the prefixed shards follow.
    res = harness.run(cases.cuda_attention_case, n, dict(doc_lens=DOCS, strategy="flashcp",
                                                          hq=4, hkv=2, d=64, seed=3,
                                                          min_shard=8, scheme=scheme),
                      timeout_s=300)
    for rank in range(n):
        r = res[rank]
        for name, err, ref in zip(("o", "dq", "dk", "dv"), r["err"], r["ref"]):
            assert _close(err, ref), f"{scheme} n={n} rank {rank} {name}: max abs error {err} " \
                                     f"(|ref| {ref})"
        assert r["fp32"] == ("TypeError", "q: dtype torch.float32 on cuda:0; the CUDA path "
                             "computes in bfloat16 (cuDNN) and does not convert: pass bfloat16 "
                             "tensors (q.bfloat16()), or CPU tensors for float32")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cuda_attention_under_block_diffusion_matches_the_cpu_path(n):
    # The block-diffusion mask on CUDA tensors: the masked kernels
    # (worker/cuda/masked_attention_kernels.h) through the binding's CUDA
    # hook, against the CPU path (docs/bdlm.md), every KV scheme but
    # all_to_all, three strategies, b in {1, 4, 16}.
    import bdlm_cases
    lens = [1, 37, 3, 1, 50, 5, 1, 12]
    specs = {}
    for s in ("llama3", "csbp", "flashcp"):
        for b in (1, 4, 16):
            try:
                plan = flashcp.plan(lens, n, s, attention_mask="block_diffusion", block_size=b)
            except flashcp.PlanError as e:
                if s == "csbp" and "FAILED_PRECONDITION" in str(e):
                    continue  # csbp refuses a batch with fewer blocks than ranks
                raise
            for scheme in ("targeted", "allgather", "full_kv"):
                specs[(s, b, scheme)] = dict(doc_lens=lens, plan=flashcp.plan_view(plan),
                                             scheme=scheme, heads=2, d=64, seed=7 + b)
    res = harness.run(bdlm_cases.cuda_attention_cases, n, specs, timeout_s=300)
    for rank in range(n):
        for key, r in res[rank].items():
            for name, err, ref in zip(("o", "dq", "dk", "dv"), r["err"], r["ref"]):
                assert _close(err, ref), f"{key} n={n} rank {rank} {name}: max abs error " \
                                         f"{err} (|ref| {ref})"


def test_compiled_cuda_attention_has_no_graph_break_and_matches_eager():
    # The custom op's CUDA kernels (flashcp/torch/_ops.py) under torch.compile:
    # 2 ranks on cuda:0 over gloo, a bf16 TinyAttentionModel, two plans.
    from test_compile import STEPS
    n = 2
    steps = [(lens, flashcp.plan_view(flashcp.plan(lens, n, s, min_shard_tokens=8)))
             for lens, s in zip(STEPS, ["flashcp", "zigzag"])]
    res = harness.run(cases.compile_case, n, dict(steps=steps, device="cuda"), timeout_s=300)
    for rank, r in enumerate(res):
        assert r["explain_breaks"] == 0 and r["explain_graphs"] == 1, (rank, r)
        assert r["graph_breaks"] == 0, (rank, r)
        assert r["unique_graphs"] == 1, (rank, r)
        for err, ref in zip(r["diffs"], r["mags"]):
            assert _close(err, ref), (rank, r)
