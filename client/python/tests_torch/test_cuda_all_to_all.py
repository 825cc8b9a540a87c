"""attention(scheme="all_to_all") and mixed plans on CUDA tensors (bf16, the
project's cuDNN kernels over the head-parallel rows; a mixed plan's
all-gather group point to point among its ranks) against the CPU path in
fp32 on the same bf16 values: every rank on cuda:0 over the harness's gloo
group (the exchange host-staged, CpContext.host_staged). Marked gpu,
skipped where torch sees no CUDA device (CI, the build machines); it has not
run yet (docs/gpu.md: tests/gpu/device_check.sh runs it on a lent GPU).

Checked per rank: O, dQ, dK, dV within test_cuda.py's tolerance (2e-2 +
2e-2 * the CPU result's max abs); the bytes moved are the CPU path's
exactly, halved (bf16 against fp32: the same messages); a group whose size
does not divide Hq is refused on both devices with the same
FAILED_PRECONDITION naming query_heads."""
import pytest
import torch

import cuda_a2a_cases
import flashcp
import harness

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch.cuda.is_available() is False)")]

DOCS = [37, 1, 60, 5, 100, 1, 1, 29]  # one-token documents; padding at N = 4
D = 64


def _close(err, ref):
    return err <= 2e-2 + 2e-2 * ref


def _check(res, n):
    ran = []
    for rank in range(n):
        for key, r in res[rank].items():
            if r[0] == "refused":
                cpu, cuda = r[1].get("cpu"), r[1].get("cuda")
                assert cpu == cuda, f"{key} rank {rank}: CPU {cpu}, CUDA {cuda}"
                assert cpu[0] == "RuntimeError" and "FAILED_PRECONDITION" in cpu[1] and \
                    "query_heads" in cpu[1], (key, rank, cpu)
                continue
            _, err, ref, moved, gqa = r
            for name, e, m in zip(("o", "dq", "dk", "dv"), err, ref):
                assert _close(e, m), f"{key} n={n} rank {rank} {name}: max abs error {e} " \
                                     f"(|ref| {m})"
            cpu, cuda = moved["cpu"], moved["cuda"]
            assert (cuda[0] * 2, cuda[1] * 2) == cpu, (key, rank, moved)
            ran.append((key, rank, gqa))
    return ran


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cuda_all_to_all_matches_the_cpu_path(n):
    specs = {}
    for s in ("flashcp", "zigzag", "whole_doc"):
        # (6, 3): position 0 of a group of 2 reads KV heads 0, 0, 1, not
        # cuDNN's GQA order (KV expanded per query head); a group of 4
        # cannot split 6 query heads (refused).
        for hq, hkv in ((8, 8), (8, 2), (6, 3)):
            plan = flashcp.plan(DOCS, n, s, min_shard_tokens=8)
            specs[(s, hq, hkv)] = dict(doc_lens=DOCS, plan=flashcp.plan_view(plan), hq=hq,
                                       hkv=hkv, d=D, seed=hq + hkv, scheme="all_to_all")
    res = harness.run(cuda_a2a_cases.cuda_against_cpu_cases, n, specs, timeout_s=300)
    ran = _check(res, n)
    assert len({key for key, _, _ in ran}) >= 6, ran
    if n == 2:
        assert any(gqa is False for _, _, gqa in ran), "the KV expansion path did not run"
        assert any(gqa is True for _, _, gqa in ran)


def test_cuda_mixed_plan_runs_each_group_with_its_scheme():
    # basp's plan of two equal documents at N = 4: rank groups {0, 1} and
    # {2, 3}; an all-gather group runs point to point among its 2 ranks.
    lens, n = [40, 40], 4
    view = flashcp.plan_view(flashcp.plan(lens, n, "basp"))
    combos = [("allgather", "all_to_all"), ("all_to_all", "full_kv"),
              ("targeted", "allgather"), ("all_to_all", "all_to_all")]
    specs = {c: dict(doc_lens=lens, plan=view, hq=8, hkv=2, d=D, seed=11,
                     scheme=[([0, 1], c[0]), ([2, 3], c[1])]) for c in combos}
    res = harness.run(cuda_a2a_cases.cuda_against_cpu_cases, n, specs, timeout_s=300)
    ran = _check(res, n)
    assert sorted({key for key, _, _ in ran}) == sorted(combos)
    assert len(ran) == n * len(combos)
