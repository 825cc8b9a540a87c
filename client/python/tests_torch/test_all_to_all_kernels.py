"""flashcp.torch's CUDA all_to_all composition on the CPU: attention_on_kernels
(_all_to_all.py: the head exchange, the choice between KV heads as they are
and one copy per query head, the kernels' autograd node) on bf16 CPU tensors
over real gloo groups, with a test double of the cuDNN whole-shard kernels
(cuda_a2a_cases.KernelDouble: the binding's buffer counts, causal attention
per document, cuDNN's GQA order) in place of the device. Against dense
document-masked attention in fp32 within test_cuda.py's tolerance (bf16
storage). What this does not cover, the cuDNN kernels and the CUDA streams,
is test_cuda_all_to_all.py's (marked gpu)."""
import pytest

import cuda_a2a_cases
import flashcp
import harness

DOCS = [37, 1, 60, 5, 100, 1, 1, 29]
D = 16


def _close(err, ref):
    return err <= 2e-2 + 2e-2 * ref


@pytest.mark.parametrize("n", [2, 4])
def test_kernel_composition_matches_dense_attention(n):
    specs = {}
    shapes = [(8, 8), (8, 2), (6, 3)] if n == 2 else [(8, 8), (8, 2)]
    for s in ("flashcp", "per_doc", "whole_doc"):
        plan = flashcp.plan_view(flashcp.plan(DOCS, n, s, min_shard_tokens=8))
        for hq, hkv in shapes:
            specs[(s, hq, hkv)] = dict(doc_lens=DOCS, plan=plan, hq=hq, hkv=hkv, d=D,
                                       seed=hq + 3 * hkv)
    res = harness.run(cuda_a2a_cases.kernel_double_cases, n, specs, timeout_s=240)
    expanded = 0
    for rank in range(n):
        for key, r in res[rank].items():
            for name, e, m in zip(("o", "dq", "dk", "dv"), r["err"], r["ref"]):
                assert _close(e, m), f"{key} n={n} rank {rank} {name}: {e} (|ref| {m})"
            nq, nk = r["heads"]
            # One kernel per call, for this position's heads: its KV heads as
            # they are in cuDNN's order, else one per query head.
            assert r["made"] == [(nq, nk if r["gqa"] else nq)], (key, rank, r)
            expanded += not r["gqa"]
    if n == 2:
        # (6, 3): position 0 reads KV heads 0, 0, 1 (not cuDNN's order).
        assert expanded > 0
