"""Client.plan_global_batch against the real planner (PlanGlobalBatch):
the hand-worked global batch exactly, the same packing and plans as
flashcp.plan_global_batch in process, and the server's exact error codes."""
import grpc
import pytest

import flashcp
from flashcp_client import Client, global_batch_pb2


@pytest.fixture
def client(planner_address):
    with Client(planner_address, timeout=60) as c:
        yield c


def test_hand_worked_two_replicas(client):
    # C = 10, two replicas. First fit: [9, 1] (45 + 1 pairs), [3, 3, 3] (18):
    # 46 / 32. Balanced: [9] (45), [1, 3, 3, 3] (19): 45 / 32.
    g = client.plan_global_batch([9, 1, 3, 3, 3], dp_size=2, cp_size=2, context=10,
                                 strategy="per_doc", batch_id=5)
    assert isinstance(g, global_batch_pb2.GlobalBatchPlan)
    assert g.batch_id == 5
    assert list(g.piece_lens) == [9, 1, 3, 3, 3]
    assert list(g.piece_doc) == [0, 1, 2, 3, 4]
    assert g.first_fit_imbalance == 46 / 32
    assert g.imbalance == 45 / 32
    assert [list(r.pieces) for r in g.replicas] == [[0], [1, 2, 3, 4]]
    assert [list(r.doc_lens) for r in g.replicas] == [[9], [1, 3, 3, 3]]
    assert [r.workload for r in g.replicas] == [45.0, 19.0]
    for r in g.replicas:
        assert r.plan.strategy == "per_doc"
        assert r.plan.cp_size == 2
        assert list(r.plan.doc_lens) == list(r.doc_lens)


def test_equals_the_in_process_plan(client):
    docs = [5000, 300, 1200, 7000, 64, 2500, 900, 3100, 450, 1000, 20, 600, 4000, 150, 2900]
    g = client.plan_global_batch(docs, dp_size=4, cp_size=8, context=8192, strategy="flashcp")
    want = flashcp.plan_global_batch(docs, dp_size=4, cp_size=8, context=8192,
                                     strategy="flashcp")
    assert tuple(g.piece_lens) == want.piece_lens
    assert g.imbalance == want.imbalance
    assert g.first_fit_imbalance == want.first_fit_imbalance
    for got, r in zip(g.replicas, want.replicas, strict=True):
        assert tuple(got.pieces) == r.pieces
        assert tuple((s.doc, s.start, s.len, s.rank) for s in got.plan.shards) == r.plan.shards


@pytest.mark.parametrize("kwargs,code,prefix", [
    (dict(dp_size=0), grpc.StatusCode.INVALID_ARGUMENT, "dp_size: 0; must be in [1, 4096]"),
    (dict(context=1), grpc.StatusCode.INVALID_ARGUMENT,
     "context: 1 tokens; must be at least plan.cp_size (2)"),
    (dict(strategy="nope"), grpc.StatusCode.INVALID_ARGUMENT, "plan.strategy: "),
    (dict(docs=[6, 6, 6]), grpc.StatusCode.FAILED_PRECONDITION,
     "doc_lens: piece 2 (6 tokens) fits in none of the 2 replicas of 10 tokens"),
])
def test_errors_carry_the_exact_code_and_field(client, kwargs, code, prefix):
    args = dict(docs=[9, 1, 3, 3, 3], dp_size=2, cp_size=2, context=10, strategy="per_doc")
    args.update(kwargs)
    with pytest.raises(grpc.RpcError) as err:
        client.plan_global_batch(args.pop("docs"), **args)
    assert err.value.code() == code
    assert err.value.details().startswith(prefix), err.value.details()
