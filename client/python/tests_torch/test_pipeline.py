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
    assert plan["ckpt_solver"] == "greedy"  # no CBC in process: the greedy checkpointing
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


def test_in_process_checkpointing_is_greedy_and_the_time_limit_is_accepted():
    # No CBC in the extension: the DPP strategies checkpoint greedily, and the
    # checkpoint ILP's time limit, kept for compatibility, changes nothing.
    docs = [40000, 20000, 9000, 5000]
    a = flashcp.plan_pipeline(docs, 4)
    b = flashcp.plan_pipeline(docs, 4, ckpt_time_limit_seconds=0.5)
    a.pop("planning_seconds")
    b.pop("planning_seconds")
    assert a == b
    assert a["ckpt_solver"] == "greedy"
    assert (a["ckpt_gap"], a["ckpt_optimal"]) == (0, False)


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


def _tiny_plan(pp):
    from flashcp.torch import pipeline as pipe
    docs = [40, 23, 17, 9, 5, 3]
    plan = flashcp.plan_pipeline(docs, pp, "dpp_full_ckpt", layers=4, hidden=32, kv_hidden=32,
                                 ffn_hidden=64, vocab=64, slice_count=3)
    return pipe, docs, plan


def test_one_stage_execution_equals_training_without_chunks():
    # flashcp.torch.pipeline in process (d_p = 1, no communication): the
    # chunks, K/V kept for later slices and their dK/dV give the loss and
    # gradients of training on the whole documents.
    pipe, docs, plan = _tiny_plan(1)
    assert any(c["kind"] == "split" for c in plan["chunks"])
    cfg = pipe.TinyDecoderConfig()
    stage = pipe.Stage(cfg, plan, docs, 1, 0)
    ops = stage.run(flashcp.pipeline_stage_order(plan, 1)[0])
    assert [(k, b) for k, b, _, _ in ops] == flashcp.pipeline_stage_order(plan, 1)[0]
    ref_loss, ref_grads = pipe.reference(cfg, docs)
    assert stage.loss == pytest.approx(ref_loss, rel=1e-5)
    for name, p in stage.model.named_parameters():
        err = (p.grad - ref_grads[name]).abs().max() / ref_grads[name].abs().max()
        assert err <= 1e-4, name


def test_a_split_document_run_backward_in_forward_order_is_refused():
    # The later slice's dK/dV must reach the earlier slice before its
    # backward; run first slice first and the stage ends with state behind.
    pipe, docs, plan = _tiny_plan(1)
    order = flashcp.pipeline_stage_order(plan, 1)[0]
    forward = [k for k, b in order if not b]
    stage = pipe.Stage(pipe.TinyDecoderConfig(), plan, docs, 1, 0)
    with pytest.raises(RuntimeError, match="left state behind"):
        stage.run([(k, False) for k in forward] + [(k, True) for k in forward])


def test_stage_order_is_one_f_one_b():
    # d_p = 2, 3 chunks, no shared document: stage 0 warms up 2 forwards,
    # stage 1 alternates.
    plan = {"pipelines": [{"forward": [0, 1, 2], "backward": [0, 1, 2]}]}
    assert flashcp.pipeline_stage_order(plan, 2) == [
        [(0, False), (1, False), (0, True), (2, False), (1, True), (2, True)],
        [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True)]]


def test_explicit_coefficients_replace_the_profiles():
    docs = [3000, 1000, 500]
    base = flashcp.plan_pipeline(docs, 2, "dpp_no_ckpt", slice_count=1)
    slow = flashcp.plan_pipeline(docs, 2, "dpp_no_ckpt", slice_count=1,
                                 coefficients={"fwd_chunk_s": 1.0, "bwd_chunk_s": 2.0})
    # One chunk per document here; every chunk now costs 32 / 2 layers x 3 s
    # per stage more, which dominates the iteration.
    assert len(slow["chunks"]) == len(base["chunks"])
    assert slow["prediction"]["iteration_s"] > base["prediction"]["iteration_s"] + 16 * 3
    with pytest.raises(flashcp.PlanError) as e:
        flashcp.plan_pipeline(docs, 2, coefficients={"fwd_flops": 1.0})
    assert e.value.code == "INVALID_ARGUMENT"
    assert "profile.fwd_flops" in str(e.value)
    with pytest.raises(flashcp.PlanError) as e:
        flashcp.plan_pipeline(docs, 2, coefficients={"p2p_bytes_per_s": 0.0})
    assert e.value.code == "INVALID_ARGUMENT"
    assert "profile.p2p_bytes_per_s" in str(e.value)
