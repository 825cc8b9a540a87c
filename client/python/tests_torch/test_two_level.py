"""attention() with a mixed plan whose groups include "two_level" (core/
two_level.h: the all-to-all within each node's part of a group, the KV
other nodes' queries need across nodes) on real gloo process groups: output
and gradients against dense SDPA with the document mask (fp32), GQA and
padding included, at N = 4 and 8 with 2 or 4 ranks a node, and every rank's
bytes, forward plus backward, equal to core::GroupedSchemeBytes' exactly:
the planner's own chosen_bytes where flashcp's choice names the groups, the
native grouped_scheme_bytes for groups given by hand beside every other
scheme. The refusals name the field. One process group per N."""
import pytest

import flashcp
import cases
import harness
from flashcp._native import native
from flashcp_client import Client, planner_pb2

HQ, D = 8, 16
TOL = 2e-5  # fp32, as test_attention.py
# 317 tokens: padding at N = 4 and 8. flashcp's choice runs it two_level
# (one group of N) at each (N, ranks a node, Hkv) below but (8, 2, 8).
LENS = [108, 11, 67, 131]
CHOSEN = [(4, 2, 8), (4, 2, 2), (8, 2, 2), (8, 4, 8), (8, 4, 2)]


def _response(lens, n, per_node, hkv, strategy="flashcp", choose=True):
    req = Client.request(lens, n, strategy, heads=hkv, head_dim=D, dtype_bytes=4,
                         ranks_per_node=per_node, min_shard_tokens=-1)
    req.query_heads = HQ
    req.choose_schemes = choose
    out = native().plan(req.SerializeToString(), timeout=0.0, **native().service_bounds())
    return planner_pb2.PlanResponse.FromString(out)


def _predicted(view, groups, hkv, per_node):
    return native().grouped_scheme_bytes(list(view.doc_lens), view.cp_size, view.padding,
                                         list(view.shards), [(list(r), s) for r, s in groups],
                                         hkv, HQ, D, 4, per_node)


def _spec(lens, view, groups, hkv, per_node, seed, **extra):
    return dict(cases.with_reference(dict(doc_lens=lens, hq=HQ, hkv=hkv, d=D, seed=seed,
                                          plan=view)),
                scheme=[(list(r), s) for r, s in groups], ranks_per_node=per_node, **extra)


def _check(res, n, key, want):
    for r in range(n):
        status, errs, sent, received = res[r][key]
        assert status == "ok", (key, r, status, errs)
        for name, err in zip(("o", "dq", "dk", "dv"), errs):
            assert err <= TOL, f"{key} rank {r} {name}: max abs error {err}"
        assert (sent, received) == (want["sent"][r], want["received"][r]), (key, r)


@pytest.mark.parametrize("n", [4, 8])
def test_flashcps_two_level_choice_runs_and_moves_the_predicted_bytes(n):
    specs, wants = {}, {}
    for (m, per_node, hkv) in CHOSEN:
        if m != n:
            continue
        resp = _response(LENS, n, per_node, hkv)
        groups = [(tuple(g.ranks), g.scheme) for g in resp.groups]
        assert groups == [(tuple(range(n)), "two_level")], groups  # the response's form
        view = flashcp.plan_view(resp)
        want = _predicted(view, groups, hkv, per_node)
        # The planner's chosen_bytes are the same core function's.
        assert list(resp.chosen_bytes.sent_bytes) == want["sent"]
        assert list(resp.chosen_bytes.received_bytes) == want["received"]
        assert max(want["inter_sent"]) > 0  # KV crosses nodes
        key = (per_node, hkv)
        specs[key] = _spec(LENS, view, groups, hkv, per_node, seed=n + hkv)
        wants[key] = want
    # The refusals, on every rank before any exchange: no nodes, one node.
    resp = _response(LENS, n, 2, 2)
    groups = [(tuple(g.ranks), g.scheme) for g in resp.groups]
    view = flashcp.plan_view(resp)
    specs["no_nodes"] = _spec(LENS, view, groups, 2, 0, seed=1)
    specs["one_node"] = _spec(LENS, view, groups, 2, n, seed=1)
    res = harness.run(cases.all_to_all_cases, n, specs, timeout_s=240)
    for key, want in wants.items():
        _check(res, n, key, want)
    for r in range(n):
        assert res[r]["no_nodes"] == (
            "refused", "FAILED_PRECONDITION: ranks_per_node: the two-level scheme needs nodes "
                       "(ranks_per_node > 0)"), res[r]["no_nodes"]
        assert res[r]["one_node"] == (
            "refused", f"FAILED_PRECONDITION: ranks_per_node: the group spans one node of {n} "
                       "ranks; the two-level scheme is the all-to-all there"), res[r]["one_node"]


def test_two_level_groups_run_beside_every_other_scheme():
    # whole_doc's plans of these batches at N = 8 (found by search): with 2
    # ranks a node, groups {0, 1, 2, 3, 6, 7} (three node parts of 2) and
    # {4, 5} (one node); with 4 a node, {0, 6, 7}, {1, 2, 4, 5} (two node
    # parts of 2) and {3}. The two-level group runs beside each other scheme
    # on the rest; and MHA over one group of 8 (2 a node), which flashcp
    # does not choose there, runs when asked.
    n = 8
    batches = {2: ([106, 61, 103, 76, 20, 75, 103, 4], (0, 1, 2, 3, 6, 7)),
               4: ([35, 85, 68, 86, 45, 19, 49, 2, 48, 62], (1, 2, 4, 5))}
    specs, wants = {}, {}
    for per_node, (lens, two) in batches.items():
        view = flashcp.plan_view(_response(lens, n, per_node, 2, "whole_doc", choose=False))
        rank_groups = sorted(_rank_groups(view))
        assert two in rank_groups, rank_groups
        others = [g for g in rank_groups if g != two]
        assert any(len(g) > 1 for g in others), rank_groups
        for hkv in (8, 2):
            for other in ("targeted", "allgather", "full_kv", "all_to_all"):
                if hkv == 8 and other != "targeted":
                    continue  # MHA: one combination (time on 2 cores)
                groups = [(two, "two_level")] + [
                    (g, other if other != "all_to_all" or HQ % len(g) == 0 else "targeted")
                    for g in others]
                key = (per_node, hkv, other)
                specs[key] = _spec(lens, view, groups, hkv, per_node, seed=per_node + hkv)
                wants[key] = _predicted(view, groups, hkv, per_node)
                assert max(wants[key]["inter_sent"]) > 0
    view = flashcp.plan_view(_response(LENS, n, 2, 8))
    groups = [(tuple(range(n)), "two_level")]
    specs["mha"] = _spec(LENS, view, groups, 8, 2, seed=3)
    wants["mha"] = _predicted(view, groups, 8, 2)
    res = harness.run(cases.all_to_all_cases, n, specs, timeout_s=300)
    for key, want in wants.items():
        _check(res, n, key, want)


def _rank_groups(view):
    """The plan's rank groups (ranks linked by shared documents), as tuples."""
    parent = list(range(view.cp_size))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    first = {}
    for doc, _, _, rank in view.shards:
        if doc in first:
            a, b = find(first[doc]), find(rank)
            parent[max(a, b)] = min(a, b)
        else:
            first[doc] = rank
    out = {}
    for r in range(view.cp_size):
        out.setdefault(find(r), []).append(r)
    return [tuple(g) for g in out.values()]
