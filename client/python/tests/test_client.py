"""flashcp_client against the real planner: plan(), plan_async(), the
Prefetcher's order and depth, exact error codes, and use after fork()."""
import multiprocessing
import os

import grpc
import pytest

from expected_plans import RING_5_3_SHARDS, assert_ring_plan_for_5_3, shards
from flashcp_client import Client, Prefetcher, planner_pb2


@pytest.fixture
def client(planner_address):
    with Client(planner_address, timeout=60) as c:
        yield c


def test_plan_ring_hand_worked(client):
    plan = client.plan([5, 3], cp_size=2, strategy="ring")
    assert isinstance(plan, planner_pb2.PlanResponse)
    assert_ring_plan_for_5_3(plan)


def test_plan_async_returns_futures(client):
    batches = [[100 + i, 7 * i + 3, 4096] for i in range(12)]
    futures = [client.plan_async(b, cp_size=4, strategy="llama3", batch_id=i)
               for i, b in enumerate(batches)]
    for i, (b, fut) in enumerate(zip(batches, futures)):
        plan = fut.result(timeout=60)
        assert plan.batch_id == i
        assert list(plan.doc_lens) == b
        assert plan.strategy == "llama3"


def test_errors_carry_the_exact_code(client):
    with pytest.raises(grpc.RpcError) as err:
        client.plan([1, 1], cp_size=4, strategy="ring")  # 2 tokens for 4 ranks
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cp_size" in err.value.details()

    fut = client.plan_async([4, 4], cp_size=2, strategy="no_such_strategy")
    exc = fut.exception(timeout=60)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "strategy" in exc.details()

    with pytest.raises(grpc.RpcError) as err:
        client.plan([], cp_size=2, strategy="ring")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "doc_lens" in err.value.details()


def test_min_shard_tokens_reaches_the_planner(client):
    # flashcp at cp 4: by default (128) the 42-token document stays whole on
    # rank 0; with the rule off (-1) it is cut into four shards of 10-11.
    batch = [42, 7233, 6337, 1768]
    default = client.plan(batch, cp_size=4, strategy="flashcp")
    assert [s for s in shards(default) if s[0] == 0] == [(0, 0, 42, 0)]
    off = client.plan(batch, cp_size=4, strategy="flashcp", min_shard_tokens=-1)
    assert [s for s in shards(off) if s[0] == 0] == [
        (0, 32, 10, 0), (0, 22, 10, 1), (0, 11, 11, 2), (0, 0, 11, 3)]
    assert Client.request(batch, 4, min_shard_tokens=300).min_shard_tokens == 300

    with pytest.raises(grpc.RpcError) as err:
        client.plan(batch, cp_size=4, strategy="flashcp", min_shard_tokens=-2)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == ("min_shard_tokens: must be -1 (off), 0 (the default 128) "
                                   "or a token count in [1, 2^40], got -2")


def test_every_plan_request_field_reaches_the_planner(client):
    # ranks_per_node, cost_profile, cost and rank_speed were TypeErrors.
    batch = [4096, 100, 30000, 2000]
    plan = client.plan(batch, cp_size=4, cost_profile="cpu-fp32", rank_speed=[1, 1, 1.5, 0.5],
                       ranks_per_node=2)
    assert plan.metrics.cost_profile == "cpu-fp32"
    assert list(plan.metrics.rank_speed) == [1, 1, 1.5, 0.5]
    assert plan.metrics.bytes[0].phase_inter_node_bytes > 0  # two nodes of 2 ranks
    explicit = planner_pb2.CostCoefficients(whole_pair=2, prefixed_pair=3, sequence=0, token=1)
    for cost in (explicit, {"whole_pair": 2, "prefixed_pair": 3, "token": 1}):
        plan = client.plan(batch, cp_size=4, cost=cost)
        assert plan.metrics.cost_profile == ""
        assert plan.metrics.cost == explicit
    req = Client.request(batch, 4, ranks_per_node=8, cost_profile="h200-cudnn",
                         rank_speed=(2, 1, 1, 1))
    assert (req.ranks_per_node, req.cost_profile, list(req.rank_speed)) == (
        8, "h200-cudnn", [2, 1, 1, 1])
    assert not req.HasField("cost") and not Client.request(batch, 4).HasField("cost")

    with pytest.raises(grpc.RpcError) as err:
        client.plan(batch, cp_size=4, ranks_per_node=-1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "ranks_per_node: must be in [0, 65536] (0: one node), got -1"
    with pytest.raises(grpc.RpcError) as err:
        client.plan(batch, cp_size=4, cost_profile="cpu-fp32", rank_speed=[1, 1, 1])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == ("rank_speed: 3 entries for 4 ranks (give none or one per "
                                   "rank)")
    with pytest.raises(ValueError) as terr:
        Client.request(batch, 4, cost={"whole_pair": 1, "bogus": 2})
    assert "bogus" in str(terr.value)


def test_list_strategies_and_server_info(client):
    names = {s.name for s in client.list_strategies()}
    assert {"ring", "llama3", "flashcp"} <= names
    assert client.server_info().api_version == "flashcp.v1"


class CountingClient(Client):
    """Counts plan_async calls, to check how far the Prefetcher runs ahead."""

    def __init__(self, target):
        super().__init__(target, timeout=60)
        self.calls = 0

    def plan_async(self, *args, **kwargs):
        self.calls += 1
        return super().plan_async(*args, **kwargs)


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_prefetcher_yields_in_order_with_depth_in_flight(planner_address, depth):
    # Sizes vary so that later plans may be ready before earlier ones.
    items = [{"lens": [i + 1] * (4 + (i * 37) % 300), "step": i} for i in range(20)]
    client = CountingClient(planner_address)
    seen = []
    prefetcher = Prefetcher(client, items, cp_size=4, strategy="ring", depth=depth,
                            doc_lens=lambda item: item["lens"])
    for item, plan in prefetcher:
        i = item["step"]
        # When item i is handed out, items up to i + depth have been sent.
        assert client.calls == min(i + 1 + depth, len(items))
        assert plan.batch_id == i
        assert list(plan.doc_lens) == item["lens"]
        seen.append(i)
    assert seen == list(range(20))
    client.close()


def test_prefetcher_raises_the_failed_items_error_in_place(client):
    items = [[8, 8], [9, 9], [1, 1], [10, 10]]  # the third has 2 tokens for 4 ranks
    got = []
    with pytest.raises(grpc.RpcError) as err:
        for item, plan in Prefetcher(client, items, cp_size=4, strategy="ring", depth=3):
            got.append(list(plan.doc_lens))
    assert got == [[8, 8], [9, 9]]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.position, err.value.batch_id) == (2, 2)
    assert err.value.details().startswith("item 2 (batch_id 2): ")


def test_prefetcher_rejects_bad_depth(client):
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        Prefetcher(client, [], cp_size=2, depth=0)


def _plan_in_child(client, queue):
    try:
        plan = client.plan([5, 3], cp_size=2, strategy="ring")
        queue.put((os.getpid(), client.channel_pid, shards(plan)))
    except Exception as e:  # reported to the parent, which fails the test
        queue.put(("error", repr(e), None))


def test_fork_makes_a_new_channel_in_the_child(client):
    # The parent's channel exists and has been used before the fork.
    assert shards(client.plan([5, 3], cp_size=2, strategy="ring")) == RING_5_3_SHARDS
    parent_pid = os.getpid()
    assert client.channel_pid == parent_pid
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    # daemon: a child that hung would be killed at exit rather than waited for.
    procs = [ctx.Process(target=_plan_in_child, args=(client, queue), daemon=True)
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for child_pid, channel_pid, child_shards in results:
        assert child_pid != "error", channel_pid
        assert child_pid != parent_pid
        assert channel_pid == child_pid  # a channel of its own, made after the fork
        assert child_shards == RING_5_3_SHARDS
    # The parent's channel still works and is still the parent's.
    assert client.plan([8, 8], cp_size=2, strategy="ring").cp_size == 2
    assert client.channel_pid == parent_pid
