"""flashcp.torch's CUDA two_level composition on the CPU: two_level_on_kernels
(_two_level.py: the all-to-all over the node part, the KV exchange across
nodes over the layout's KV-row fields, the staging, the choice between KV
heads as they are and one copy per query head, the kernels' autograd node
over both shard groups) on bf16 CPU tensors over real gloo groups, with a
test double of the cuDNN shard kernels (two_level_cases.ShardKernelDouble:
the binding's buffer counts, the layout's whole and prefixed batches, cuDNN's
GQA order, NaN in rows a call does not own) in place of the device. Against
dense document-masked attention in fp32 within test_cuda.py's tolerance
(bf16 storage), at N = 4 and 8 with 2 or 4 ranks a node, Hkv 8 and 2 (and
6 / 3: KV not in cuDNN's order), and a two-level group of six beside a
targeted or all-to-all group of two (N = 8, the latter on attention()'s CPU
path); the bytes each rank moves are core::GroupedSchemeBytes' for bf16
exactly. What this does not cover, the
cuDNN kernels, NCCL and the CUDA streams, is test_cuda_two_level.py's
(marked gpu)."""
import pytest

import flashcp
import harness
import two_level_cases
from flashcp._native import native
from flashcp_client import Client, planner_pb2

LENS = [108, 11, 67, 131]  # 317 tokens: padding at N = 4 and 8
D = 16


def _close(err, ref):
    return err <= 2e-2 + 2e-2 * ref


def _view(n, per_node, hq, hkv):
    req = Client.request(LENS, n, "flashcp", heads=hkv, head_dim=D, dtype_bytes=2,
                         ranks_per_node=per_node, min_shard_tokens=-1)
    req.query_heads = hq
    out = native().plan(req.SerializeToString(), timeout=0.0, **native().service_bounds())
    return flashcp.plan_view(planner_pb2.PlanResponse.FromString(out))


@pytest.mark.parametrize("n", [4, 8])
def test_two_level_kernel_composition_matches_dense_attention(n):
    specs, wants = {}, {}
    per_nodes = (2,) if n == 4 else (2, 4)
    shapes = [(8, 8), (8, 2), (6, 3)]
    for per_node in per_nodes:
        for hq, hkv in shapes:
            if n // per_node > 1 and hq % per_node:
                continue  # a node part of 4 cannot split 6 query heads
            view = _view(n, per_node, hq, hkv)
            ranks = tuple(range(n))
            # One rank group of N (every rank shares a document with the next).
            groups = [(list(ranks), "two_level")]
            key = (per_node, hq, hkv)
            specs[key] = dict(doc_lens=LENS, plan=view, hq=hq, hkv=hkv, d=D, seed=hq + 3 * hkv,
                              ranks=ranks, ranks_per_node=per_node, scheme=groups)
            wants[key] = native().grouped_scheme_bytes(
                list(view.doc_lens), view.cp_size, view.padding, list(view.shards), groups,
                hkv, hq, D, 2, per_node)
            assert max(wants[key]["inter_sent"]) > 0  # KV crosses nodes
    res = harness.run(two_level_cases.kernel_double_cases, n, specs, timeout_s=240)
    expanded = prefixed = 0
    for rank in range(n):
        for key, r in res[rank].items():
            for name, e, m in zip(("o", "dq", "dk", "dv"), r["err"], r["ref"]):
                assert _close(e, m), f"{key} n={n} rank {rank} {name}: {e} (|ref| {m})"
            nq, nk = r["heads"]
            # One kernel per call, for this position's heads: its KV heads as
            # they are in cuDNN's order, else one per query head.
            assert r["made"] == [(nq, nk if r["gqa"] else nq)], (key, rank, r)
            # Forward whole then prefixed; backward prefixed then whole.
            assert r["calls"] == [("forward", True), ("forward", False),
                                  ("backward", False), ("backward", True)], (key, rank)
            want = wants[key]
            assert r["moved"] == (want["sent"][rank], want["received"][rank]), (key, rank, r)
            expanded += not r["gqa"]
            prefixed += r["batches"][1] > 0
    assert expanded > 0  # (6, 3) over a node part of 2: KV heads 0, 0, 1 at position 0
    assert prefixed > 0  # some rank attends KV received across nodes


def test_two_level_kernel_composition_beside_other_schemes():
    # whole_doc's plan at N = 8, 2 ranks a node (test_two_level.py): groups
    # {0, 1, 2, 3, 6, 7} (three node parts of 2) run two_level on the kernel
    # double; {4, 5} (one node) its own scheme through attention().
    n, lens, two = 8, [106, 61, 103, 76, 20, 75, 103, 4], (0, 1, 2, 3, 6, 7)
    req = Client.request(lens, n, "whole_doc", heads=2, head_dim=D, dtype_bytes=2,
                         ranks_per_node=2, min_shard_tokens=-1)
    req.query_heads = 8
    view = flashcp.plan_view(planner_pb2.PlanResponse.FromString(
        native().plan(req.SerializeToString(), timeout=0.0, **native().service_bounds())))
    specs, wants = {}, {}
    for other in ("targeted", "all_to_all"):
        groups = [(list(two), "two_level"), ([4, 5], other)]
        specs[other] = dict(doc_lens=lens, plan=view, hq=8, hkv=2, d=D, seed=5, ranks=two,
                            ranks_per_node=2, scheme=groups)
        wants[other] = native().grouped_scheme_bytes(
            list(view.doc_lens), n, view.padding, list(view.shards), groups, 2, 8, D, 2, 2)
        assert max(wants[other]["inter_sent"]) > 0
    res = harness.run(two_level_cases.kernel_double_cases, n, specs, timeout_s=240)
    for rank in range(n):
        for key, r in res[rank].items():
            for name, e, m in zip(("o", "dq", "dk", "dv"), r["err"], r["ref"]):
                assert _close(e, m), f"{key} rank {rank} {name}: {e} (|ref| {m})"
            assert r["moved"] == (wants[key]["sent"][rank], wants[key]["received"][rank]), \
                (key, rank, r)
            assert ("calls" in r) == (rank in two), (key, rank)
