"""flashcp.plan_pipeline: the in-process pipeline planner (core/pipeline.h
through the native binding) against flashcp-plan --pipeline."""
import json
import subprocess

import pytest

import flashcp


def test_defaults_plan_for_four_stages():
    plan = flashcp.plan_pipeline([40000, 20000, 9000, 5000, 3000, 1200, 800], 4)
    assert plan["strategy"] == "dpp"
    assert len(plan["ckpt"]) == 4
    assert plan["ckpt_solver"] in ("ilp", "greedy")
    assert len(plan["prediction"]["stage_peak_bytes"]) == 4
    assert max(plan["prediction"]["stage_peak_bytes"]) <= 80 * 2**30
    # Every token in exactly one chunk.
    seen = {}
    for chunk in plan["chunks"]:
        for s in chunk["slices"]:
            seen.setdefault(s["doc"], []).append((s["start"], s["len"]))
    for doc, lens in zip(range(7), [40000, 20000, 9000, 5000, 3000, 1200, 800]):
        at = 0
        for start, n in sorted(seen[doc]):
            assert start == at
            at += n
        assert at == lens


def test_errors_name_the_field():
    with pytest.raises(flashcp.PlanError) as e:
        flashcp.plan_pipeline([100, 200], 3)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "model.layers" in str(e.value)
    with pytest.raises(flashcp.PlanError) as e:
        flashcp.plan_pipeline([131072], 4, memory_budget_gib=29)
    assert e.value.code == "FAILED_PRECONDITION"
    assert "GiB) more" in str(e.value)
    with pytest.raises(flashcp.PlanError) as e:
        flashcp.plan_pipeline([100], 4, "ring")
    assert e.value.code == "INVALID_ARGUMENT"


def test_same_plan_as_flashcp_plan(plan_bin):
    docs = [30000, 4000, 4000, 2000, 700]
    mine = flashcp.plan_pipeline(docs, 8, "token_level")
    out = subprocess.run([plan_bin, "--pipeline", "--quiet", "--pp=8", "--strategy=token_level",
                          ",".join(map(str, docs))], check=True, capture_output=True, text=True)
    theirs = json.loads(out.stdout)
    mine.pop("planning_seconds")
    theirs.pop("planning_seconds")
    assert mine == theirs
