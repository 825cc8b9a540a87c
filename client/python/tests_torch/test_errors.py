"""Bad input gets a precise error and no hang; a rank that dies makes the
others fail in bounded time, naming it."""
import json
import time

import pytest

import flashcp
import cases
import harness

LENS = [37, 1, 60, 5, 100, 1, 1, 29]


def test_bad_inputs_raise_precise_errors_without_collectives():
    plan = flashcp.plan_view(flashcp.plan(LENS, 2, "flashcp"))
    bad = json.loads(json.dumps({"cp_size": 2, "doc_lens": LENS, "padding": 0,
                                 "shards": [{"doc": s[0], "start": s[1], "len": s[2],
                                             "rank": s[3]} for s in plan.shards]}))
    bad["shards"][0]["len"] += 1  # overlaps the next shard of its document
    res = harness.run(cases.errors_case, 2, dict(
        doc_lens=LENS, plan=plan, plan3=flashcp.plan_view(flashcp.plan(LENS, 3)), bad_plan=bad),
        timeout_s=60)
    for rank, r in enumerate(res):
        rows = 117
        want = {
            "group_size": ("ValueError", "CpContext: the group has 2 ranks but the plan is for "
                                         "cp_size 3"),
            "rank": ("ValueError", f"CpContext: rank {1 - rank} given, but this process is rank "
                                   f"{rank} of the group"),
            "rank_range": ("ValueError", "CpContext: rank 2 outside [0, 2)"),
            "other_docs": ("ValueError", "CpContext: the plan is for documents [37, 1, 60, 5, "
                                         "100, 1, 1, 29], the batch has [37, 1, 60, 5, 100, 1, "
                                         "1, 30]"),
            "dispatch_rows": ("ValueError", "x: (241,); the plan is for 234 tokens (+0 padding): "
                                            "the first dimension must be 234 or 234"),
            "undispatch_rows": ("ValueError", f"x_local: ({rows + 1},); expected {rows} rows "
                                              "(C/N) first"),
            "q_rows": ("ValueError", f"q: {rows - 1} rows; this rank holds C/N = {rows}"),
            "q_dims": ("ValueError", f"q: shape ({rows}, 64); expected [C/N, heads, head_dim] "
                                     f"with C/N = {rows}"),
            "k_rows": ("ValueError", f"k: {rows - 1} rows; this rank holds C/N = {rows}"),
            "dtype": ("TypeError", "q: dtype torch.float64; expected torch.float32 or "
                                   "torch.bfloat16"),
            "mixed_dtype": ("TypeError", "k: dtype torch.bfloat16 but q is torch.float32"),
            "device": ("ValueError", "k: on meta but q is on cpu"),
            "q_device": ("ValueError", "q: on meta; expected a CPU or CUDA tensor"),
            "non_contiguous": ("ValueError", f"q: not contiguous (strides (16, {rows * 16}, 1)); "
                                             "call .contiguous()"),
            "gqa": ("ValueError", "heads: q has 3, k and v 2; q's must be a multiple (GQA)"),
            "kv_zero_heads": ("ValueError", "heads: k and v have 0 heads; need at least 1"),
            "head_dim": ("ValueError", "k: head_dim 8 but q's is 16"),
            "kv_shapes": ("ValueError", f"k ({rows}, 2, 16) and v ({rows}, 1, 16) differ"),
            "scheme": ("ValueError", "scheme: 'ring'; expected one of targeted, allgather, "
                                     "full_kv, all_to_all"),
            "scale": ("ValueError", "softmax_scale: -1.0; must be positive and finite"),
            "ctx": ("TypeError", "ctx: expected a flashcp.torch.CpContext, got object"),
            "still_works": (rows, 4, 16),
        }
        for key, value in want.items():
            assert r[key] == value, (rank, key, r[key])
        kind, msg = r["bad_plan"]
        assert kind == "ValueError" and msg.startswith("shards"), msg


@pytest.mark.parametrize("scheme", ["targeted", "allgather"])
def test_a_rank_that_dies_mid_step_makes_the_others_fail_naming_it(scheme):
    # ring over one long document at N = 3: rank 0's KV goes to ranks 1 and 2,
    # so both wait on it in the backward.
    plan = flashcp.plan_view(flashcp.plan([300], 3, "ring"))
    group_timeout = 20.0
    t = time.monotonic()
    res = harness.run(cases.dies_case, 3, dict(plan=plan, scheme=scheme, victim=0),
                      timeout_s=90, group_timeout_s=group_timeout, allow_errors=True)
    assert res[0] == ("exited", "exit code 17")
    for rank in (1, 2):
        kind, msg, seconds = res[rank]
        assert kind == "ExchangeError", (rank, kind, msg)
        assert msg.startswith(f"rank {rank}: "), msg
        assert "rank 0" in msg.split(":", 1)[1], msg
        assert seconds < group_timeout + 10, seconds
    assert time.monotonic() - t < 90
