"""Client.plan_many against the real planner (ManyPlanner.PlanMany): the
answers equal plan()'s, in order; a bad item's error carries plan()'s exact
code and message while the others are planned; the call's own errors carry
the server's exact codes."""
import grpc
import pytest

from flashcp_client import Client, planner_pb2

DOCS = [5000, 300, 1200, 7000, 64, 2500, 900, 3100]


@pytest.fixture
def client(planner_address):
    with Client(planner_address, timeout=60) as c:
        yield c


def _without_time(plan: planner_pb2.PlanResponse) -> planner_pb2.PlanResponse:
    plan = planner_pb2.PlanResponse.FromString(plan.SerializeToString())
    plan.metrics.planning_seconds = 0
    return plan


def test_answers_are_plans_answers_in_order(client):
    requests = [Client.request(DOCS, 4, "flashcp", batch_id=1),
                Client.request(DOCS, 8, "ring", batch_id=2),
                Client.request([9, 1, 3, 3, 3], 2, "per_doc", batch_id=3)]
    got = client.plan_many(requests)
    assert [r.batch_id for r in got] == [1, 2, 3]
    for r, req in zip(got, requests, strict=True):
        assert not r.HasField("error")
        want = client.plan(req.doc_lens, req.cp_size, req.strategy, batch_id=req.batch_id)
        assert _without_time(r) == _without_time(want)


def test_a_bad_item_gets_plans_error_and_the_others_are_planned(client):
    bad = Client.request([5, 3], 2, batch_id=8)
    bad.cp_size = 0
    got = client.plan_many([Client.request([5, 3], 2, batch_id=7), bad,
                            Client.request([8, 8], 2, "ilp", batch_id=9),
                            Client.request([8, 8], 2, batch_id=10)])
    assert [r.batch_id for r in got] == [7, 8, 9, 10]
    assert not got[0].HasField("error") and len(got[0].shards) > 0
    assert got[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert got[1].error.message == "cp_size: must be at least 1, got 0"
    assert len(got[1].shards) == 0
    with pytest.raises(grpc.RpcError) as err:
        client.plan([5, 3], 0)
    assert err.value.details() == got[1].error.message
    assert got[2].error.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert got[2].error.message == (
        "strategy: ilp is disabled on this server (start it with --allow_ilp)")
    assert not got[3].HasField("error") and len(got[3].shards) > 0


@pytest.mark.parametrize("count,code,details", [
    (0, grpc.StatusCode.INVALID_ARGUMENT, "requests: empty; send 1 to 256 PlanRequests"),
    (257, grpc.StatusCode.RESOURCE_EXHAUSTED,
     "requests: 257 in one call, above 256; send fewer per call"),
])
def test_the_calls_errors_carry_the_exact_code(client, count, code, details):
    with pytest.raises(grpc.RpcError) as err:
        client.plan_many([Client.request([5, 3], 2)] * count)
    assert err.value.code() == code
    assert err.value.details() == details


def test_256_requests_are_planned(client):
    got = client.plan_many([Client.request([5, 3], 2, batch_id=i) for i in range(256)])
    assert [r.batch_id for r in got] == list(range(256))
    assert not any(r.HasField("error") for r in got)
