"""One plan per CP group: CpContext's plan check (every rank raises where the
ranks hold different plans) and plan_on_first_rank, on real gloo groups."""
import pytest

import flashcp
import flashcp.torch as ft
import cases
import harness

LENS = [37, 1, 60, 5, 100, 1, 1, 29]  # 234 tokens


def _plans(n, strategies):
    return [flashcp.plan(LENS, n, s, min_shard_tokens=8) for s in strategies]


def _mismatch_message(rank, groups, reference):
    """groups: [(ranks, hash)] of the differing plans, in rank order."""
    def ranks(rs):
        return f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
    others = "; ".join(f"{ranks(rs)} plan_hash {h}" for rs, h in groups)
    return (f"rank {rank}: CpContext: the group's ranks hold different plans for this step: "
            f"{others}; {ranks(reference[0])} plan_hash {reference[1]}. Every rank must run the "
            "same plan of the same batch: plan once and share it "
            "(flashcp.torch.plan_on_first_rank), or give every rank the same planner version "
            "and batch")


def test_two_ranks_with_different_plans_both_raise_naming_the_other():
    # Before the check: rank 0 ran flashcp's plan and rank 1 ring's; gloo
    # aborted one rank and the other computed wrong attention.
    plans = _plans(2, ["flashcp", "ring"])
    h = [p.plan_hash for p in plans]
    assert h[0] != h[1]
    res = harness.run(cases.plan_agreement_case, 2,
                      dict(plans=[p.SerializeToString() for p in plans], doc_lens=LENS))
    for rank, r in enumerate(res):
        # A tie: rank 0's plan is the reference.
        assert r["error"] == ("PlanMismatchError", _mismatch_message(rank, [([1], h[1])],
                                                                     ([0], h[0])), [1], h)
        assert r["still_works"] is True
        assert r["plan_hash"] == h[0]


def test_three_ranks_name_the_odd_one_and_every_hash():
    a, b, c = (flashcp.plan_view(p) for p in _plans(3, ["flashcp", "zigzag", "ring"]))
    ha, hb, hc = a.plan_hash, b.plan_hash, c.plan_hash
    assert len({ha, hb, hc}) == 3
    # Rank 1 differs from ranks 0 and 2.
    res = harness.run(cases.plan_agreement_case, 3, dict(plans=[a, b, a], doc_lens=LENS))
    for rank, r in enumerate(res):
        assert r["error"] == ("PlanMismatchError",
                              _mismatch_message(rank, [([1], hb)], ([0, 2], ha)),
                              [1], [ha, hb, ha])
        assert r["still_works"] is True
    # Ranks 0 and 1 agree on the odd plan: the majority is the reference.
    res = harness.run(cases.plan_agreement_case, 3, dict(plans=[c, c, a], doc_lens=LENS))
    for rank, r in enumerate(res):
        assert r["error"][2] == [2] and r["error"][3] == [hc, hc, ha], r["error"]
    # Three plans: the reference is rank 0's, the other two named with theirs.
    res = harness.run(cases.plan_agreement_case, 3, dict(plans=[a, b, c], doc_lens=LENS))
    for rank, r in enumerate(res):
        assert r["error"][1] == _mismatch_message(rank, [([1], hb), ([2], hc)], ([0], ha))
        assert r["error"][2] == [1, 2]


def test_one_plan_in_any_form_passes_the_check():
    # The hash is of the plan's fields: the PlanResponse on one rank, its
    # JSON on another and a PlanView on the third are one plan.
    from google.protobuf import json_format
    p = flashcp.plan(LENS, 3, "flashcp", min_shard_tokens=8)
    forms = [p.SerializeToString(), json_format.MessageToJson(p, preserving_proto_field_name=True),
             flashcp.plan_view(p)]
    res = harness.run(cases.plan_agreement_case, 3, dict(plans=forms, doc_lens=LENS))
    for r in res:
        assert r["error"] is None and r["still_works"] is True
        assert r["plan_hash"] == p.plan_hash


@pytest.mark.parametrize("n", [2, 3])
def test_plan_on_first_rank_in_process(n):
    res = harness.run(cases.plan_on_first_rank_case, n,
                      dict(doc_lens=LENS, strategy="flashcp", fields={"min_shard_tokens": 8}))
    want = flashcp.plan(LENS, n, "flashcp", min_shard_tokens=8)
    for r in res:
        got = flashcp.planner_pb2.PlanResponse.FromString(r["plan"])
        assert got.plan_hash == want.plan_hash
        assert got.SerializeToString() == res[0]["plan"]  # the same bytes on every rank
        assert r["err"] < 2e-5


def test_plan_on_first_rank_from_the_service(planner_address):
    res = harness.run(cases.plan_on_first_rank_case, 2,
                      dict(doc_lens=LENS, strategy="zigzag", address=planner_address))
    want = flashcp.plan(LENS, 2, "zigzag")
    for r in res:
        got = flashcp.planner_pb2.PlanResponse.FromString(r["plan"])
        assert got.strategy == "zigzag" and got.plan_hash == want.plan_hash
        assert r["plan"] == res[0]["plan"]
        assert r["err"] < 2e-5


def test_plan_on_first_rank_failure_raises_on_every_rank(planner_address):
    res = harness.run(cases.plan_on_first_rank_case, 3,
                      dict(doc_lens=[5, 0], strategy="flashcp"))
    with pytest.raises(flashcp.PlanError) as local:
        flashcp.plan([5, 0], 3, "flashcp")
    assert str(local.value).startswith("INVALID_ARGUMENT: doc_lens[1]")
    assert res[0] == ("PlanError", "INVALID_ARGUMENT", str(local.value))
    for r in res[1:]:
        assert r == ("PlanError", "INVALID_ARGUMENT",
                     "INVALID_ARGUMENT: rank 0 of the group (global rank 0) could not plan the "
                     f"batch: {local.value.args[0].partition(': ')[2]}")
    # From the service: rank 0 gets the grpc.RpcError, the others its code.
    res = harness.run(cases.plan_on_first_rank_case, 2,
                      dict(doc_lens=[5, 0], strategy="flashcp", address=planner_address))
    assert res[0] == ("RpcError", "INVALID_ARGUMENT", local.value.args[0].partition(": ")[2])
    assert res[1][:2] == ("PlanError", "INVALID_ARGUMENT")
    assert "doc_lens[1]" in res[1][2]
