"""Client.plan_many against the real planner (ManyPlanner.PlanMany): the
answers equal plan()'s, in order; a bad item's error carries plan()'s exact
code and message while the others are planned; the call's own errors carry
the server's exact codes. Prefetcher(plans_per_call=k): k items a call, an
item's error in place, the in-process fallback item by item."""
import grpc
import pytest

import flashcp
import flashcp.planner_process
from flashcp_client import Client, ItemError, PrefetchError, Prefetcher, planner_pb2

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


class CountingClient(Client):
    """Counts Plan and PlanMany calls, to check how a Prefetcher sends."""

    def __init__(self, target):
        super().__init__(target, timeout=60)
        self.plan_calls = 0
        self.many_calls = []  # requests per PlanMany call

    def plan_async(self, *args, **kwargs):
        self.plan_calls += 1
        return super().plan_async(*args, **kwargs)

    def plan_many_async(self, requests, **kwargs):
        requests = list(requests)
        self.many_calls.append(len(requests))
        return super().plan_many_async(requests, **kwargs)


def test_prefetcher_sends_plans_per_call_items_per_plan_many(planner_address):
    items = [{"lens": [i + 1] * (4 + (i * 37) % 300), "step": i} for i in range(19)]
    client = CountingClient(planner_address)
    got = []
    for item, plan in Prefetcher(client, items, cp_size=4, strategy="ring", depth=4,
                                 plans_per_call=8, first_batch_id=100,
                                 doc_lens=lambda item: item["lens"]):
        assert plan.batch_id == 100 + item["step"]
        want = client.plan(item["lens"], 4, "ring", batch_id=100 + item["step"])
        assert _without_time(plan) == _without_time(want)
        got.append(item["step"])
    assert got == list(range(19))
    assert client.many_calls == [8, 8, 3]
    assert client.plan_calls == 0  # no Plan call: client.plan() above is not plan_async
    client.close()


def test_prefetcher_raises_the_failed_items_error_in_place_per_call(client):
    items = [[8, 8], [9, 9], [1, 1], [10, 10]]  # the third has 2 tokens for 4 ranks
    with pytest.raises(grpc.RpcError) as want:
        client.plan([1, 1], 4, "ring")
    got = []
    with pytest.raises(PrefetchError) as err:
        for item, plan in Prefetcher(client, items, cp_size=4, strategy="ring", depth=3,
                                     plans_per_call=3):
            got.append(list(plan.doc_lens))
    assert got == [[8, 8], [9, 9]]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.position, err.value.batch_id) == (2, 2)
    assert err.value.details() == f"item 2 (batch_id 2): {want.value.details()}"
    assert isinstance(err.value.cause, ItemError)


def test_prefetcher_rejects_bad_plans_per_call(client):
    for bad in (0, 257):
        with pytest.raises(ValueError, match=f"plans_per_call must be in \\[1, 256\\], got {bad}"):
            Prefetcher(client, [], cp_size=2, plans_per_call=bad)


def test_prefetcher_per_call_falls_back_item_by_item_when_the_planner_is_gone(planner_bin):
    with flashcp.planner_process.start(planner_bin) as address:
        pass  # started and stopped: nothing listens on its port now
    batches = [[300, 5, 1, 77], [64, 32, 16], [1000, 24], [7, 7, 7, 7, 100], [50, 50]]
    with Client(address, timeout=10) as c:
        pre = Prefetcher(c, batches, 2, "flashcp", depth=2, plans_per_call=2,
                         first_batch_id=100, fallback=flashcp.plan)
        got = list(pre)
    assert [item for item, _ in got] == batches
    for k, (item, plan) in enumerate(got):
        want = flashcp.plan(item, 2, "flashcp", batch_id=100 + k)
        assert _without_time(plan) == _without_time(want), k
    assert pre.fallback_plans == len(batches)
