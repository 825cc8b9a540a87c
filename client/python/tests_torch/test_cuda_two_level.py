"""attention() with a mixed plan's "two_level" groups on CUDA tensors (bf16,
the project's cuDNN shard kernels over the node part's head-parallel rows,
whole and prefixed batches; _two_level.py) against the CPU path in fp32 on
the same bf16 values: every rank on cuda:0 over the harness's gloo group
(the exchanges host-staged, CpContext.host_staged): N = 4 with 2 ranks a
node, (Hq, Hkv) = (8, 8), (8, 2), (6, 3) (KV heads not in cuDNN's order);
N = 8 with 4 a node, (8, 2); and at N = 8 with 2 a node a two-level group
of six beside a targeted and an all-to-all group of two. Marked gpu,
skipped where torch sees no CUDA device (CI, the build machines); it has not
run yet (docs/gpu.md: tests/gpu/device_check.sh runs it on a lent GPU;
test_nccl.py runs two_level over NCCL where there are 2 or 4 GPUs).

Checked per rank: O, dQ, dK, dV within test_cuda.py's tolerance (2e-2 +
2e-2 * the CPU result's max abs); the bytes moved are the CPU path's
exactly, halved (bf16 against fp32: the same messages)."""
import pytest
import torch

import flashcp
import harness
import two_level_cases
from flashcp._native import native
from flashcp_client import Client, planner_pb2

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch.cuda.is_available() is False)")]

LENS = [108, 11, 67, 131]  # 317 tokens: padding at N = 4 and 8
D = 64


def _view(lens, n, per_node, hq, hkv, strategy="flashcp"):
    req = Client.request(lens, n, strategy, heads=hkv, head_dim=D, dtype_bytes=2,
                         ranks_per_node=per_node, min_shard_tokens=-1)
    req.query_heads = hq
    out = native().plan(req.SerializeToString(), timeout=0.0, **native().service_bounds())
    return flashcp.plan_view(planner_pb2.PlanResponse.FromString(out))


def _check(res, n):
    for rank in range(n):
        for key, r in res[rank].items():
            status, err, ref, moved = r
            assert status == "ok", (key, rank, r)
            for name, e, m in zip(("o", "dq", "dk", "dv"), err, ref):
                assert e <= 2e-2 + 2e-2 * m, f"{key} n={n} rank {rank} {name}: max abs " \
                                             f"error {e} (|ref| {m})"
            cpu, cuda = moved["cpu"], moved["cuda"]
            assert (cuda[0] * 2, cuda[1] * 2) == cpu, (key, rank, moved)


@pytest.mark.parametrize("n", [4, 8])
def test_cuda_two_level_matches_the_cpu_path(n):
    specs = {}
    # N = 8 one shape (eight processes build their graphs on one GPU; 2 a
    # node at N = 8 is the test below's).
    per_node, shapes = (2, ((8, 8), (8, 2), (6, 3))) if n == 4 else (4, ((8, 2),))
    for hq, hkv in shapes:
        specs[(per_node, hq, hkv)] = dict(
            doc_lens=LENS, plan=_view(LENS, n, per_node, hq, hkv), hq=hq, hkv=hkv, d=D,
            seed=hq + hkv, ranks_per_node=per_node, scheme=[(list(range(n)), "two_level")])
    res = harness.run(two_level_cases.cuda_against_cpu_cases, n, specs, timeout_s=300)
    _check(res, n)


def test_cuda_two_level_beside_other_schemes():
    # whole_doc's plan at N = 8, 2 ranks a node (test_two_level.py): groups
    # {0, 1, 2, 3, 6, 7} (three node parts of 2) and {4, 5} (one node).
    n, lens = 8, [106, 61, 103, 76, 20, 75, 103, 4]
    view = _view(lens, n, 2, 8, 2, "whole_doc")
    specs = {other: dict(doc_lens=lens, plan=view, hq=8, hkv=2, d=D, seed=5, ranks_per_node=2,
                         scheme=[([0, 1, 2, 3, 6, 7], "two_level"), ([4, 5], other)])
             for other in ("targeted", "all_to_all")}
    res = harness.run(two_level_cases.cuda_against_cpu_cases, n, specs, timeout_s=300)
    _check(res, n)
