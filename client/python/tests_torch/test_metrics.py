"""flashcp.torch.step_metrics on real gloo groups: measured bytes equal the
plan's prediction, the group's imbalance is one number on every rank, and the
dashboards' metric names receive the step."""
import grpc
import pytest

import flashcp
import flashcp.torch as ft
import cases
import harness
from conftest import CLIENT_OPTIONS

LENS = [37, 1, 60, 5, 100, 1, 1, 29]  # 234 tokens


@pytest.mark.parametrize("n", [2, 3])
def test_step_metrics_measure_what_the_plan_predicts(n):
    # The plan analysed for the shape the step runs: Hkv = 2, D = 16, fp32.
    plan = flashcp.plan(LENS, n, "flashcp", min_shard_tokens=8, heads=2, head_dim=16,
                        dtype_bytes=4)
    res = harness.run(cases.metrics_case, n, dict(plan=plan.SerializeToString(),
                                                  scheme="targeted"))
    targeted = next(b for b in plan.metrics.bytes if b.scheme == "targeted")
    ms = [r["metrics"] for r in res]
    assert sum(m["bytes_sent"] for m in ms) == sum(m["bytes_received"] for m in ms) > 0
    for rank, (r, m) in enumerate(zip(res, ms)):
        assert r["callback"] == [m]
        assert m["rank"] == rank and m["cp_size"] == n and m["calls"] == 1
        assert m["strategy"] == "flashcp" and m["plan_hash"] == plan.plan_hash
        # Both phases, as the plan counts them: exactly its prediction.
        assert m["bytes_sent"] == m["predicted_bytes_sent"] == targeted.sent_bytes[rank]
        assert m["bytes_received"] == targeted.received_bytes[rank]
        assert m["attention_seconds"] > 0 and m["comm_seconds"] > 0
        assert m["measured_imbalance"] == ms[0]["measured_imbalance"] >= 1.0
        assert m["predicted_imbalance"] == plan.metrics.imbalance_ratio
        assert r["stats_after"] == {"kernel_seconds": 0.0, "comm_seconds": 0.0,
                                    "bytes_sent": 0, "bytes_received": 0, "calls": 0}
        run = {"strategy": "flashcp", "scheme": "targeted", "device": "cpu"}
        per = {"strategy": "flashcp", "device": "cpu"}
        assert r["exported"] == [
            ("flashcp_worker_attention_seconds", "inc", run, m["attention_seconds"]),
            ("flashcp_worker_comm_duration_seconds", "observe", run, m["comm_seconds"]),
            ("flashcp_worker_bytes_sent", "inc", run, m["bytes_sent"]),
            ("flashcp_worker_bytes_received", "inc", run, m["bytes_received"]),
            ("flashcp_worker_steps", "inc", run, 1),
            ("flashcp_worker_attention_time_ratio", "set", per, m["attention_time_ratio"]),
            ("flashcp_worker_predicted_imbalance_ratio", "set", per, plan.metrics.imbalance_ratio),
        ]
    assert sum(m["attention_time_ratio"] for m in ms) == pytest.approx(n, rel=1e-12)
    times = [m["attention_seconds"] for m in ms]
    assert ms[0]["measured_imbalance"] == pytest.approx(max(times) / (sum(times) / n), rel=1e-12)


def test_step_times_carry_the_planners_features_of_each_rank():
    # ring on [5, 3] at N = 2: rank 0 holds doc 0 [0, 4) (a whole shard: 10
    # pairs), rank 1 doc 0 [4, 5) (prefixed: (2*4 + 1 + 1) * 1 / 2 = 5 pairs)
    # and doc 1 [0, 3) (whole: 6 pairs); 4 real tokens each.
    st = ft.step_times(flashcp.plan([5, 3], 2, "ring"), [0.25, 0.5])
    assert st.cp_size == 2
    assert [(r.whole_pairs, r.prefixed_pairs, r.sequences, r.tokens, r.seconds)
            for r in st.ranks] == [(10, 0, 1, 4, 0.25), (6, 5, 2, 4, 0.5)]
    with pytest.raises(ValueError, match="seconds: 1 times for a plan of cp_size 2"):
        ft.step_times(flashcp.plan([5, 3], 2, "ring"), [0.25])


def test_a_training_step_reports_its_times_to_the_planner(planner_address):
    plan = flashcp.plan(LENS, 2, "flashcp", cost_profile="cpu-fp32", heads=2, head_dim=16,
                        dtype_bytes=4)
    res = harness.run(cases.metrics_case, 2, dict(plan=plan.SerializeToString(),
                                                  scheme="targeted"))
    seconds = res[0]["metrics"]["group_attention_seconds"]
    assert seconds == res[1]["metrics"]["group_attention_seconds"]
    assert [r["metrics"]["attention_seconds"] for r in res] == list(seconds)
    with flashcp.Client(planner_address, options=CLIENT_OPTIONS) as client:
        got = client.report_step_times("cpu-fp32", [ft.step_times(plan, seconds)])
        assert got.accepted_samples == 2 and got.profile_samples >= 2
        with pytest.raises(grpc.RpcError) as e:
            client.report_step_times("pairs", [ft.step_times(plan, seconds)])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
