"""flashcp.plan_global_batch (core::PlanGlobalBatch): documents over DP
replicas and each replica's CP plan, in process."""
import pytest

import flashcp


def test_hand_worked_two_replicas():
    # As core_global_batch_test: first fit [9, 1] | [3, 3, 3] (46 and 18
    # pairs), balanced [9] | [1, 3, 3, 3] (45 and 19).
    g = flashcp.plan_global_batch([9, 1, 3, 3, 3], dp_size=2, cp_size=2, context=10,
                                  strategy="per_doc")
    assert g.first_fit_imbalance == pytest.approx(46 / 32, rel=0, abs=1e-15)
    assert g.imbalance == pytest.approx(45 / 32, rel=0, abs=1e-15)
    assert [r.doc_lens for r in g.replicas] == [(9,), (1, 3, 3, 3)]
    assert [r.pieces for r in g.replicas] == [(0,), (1, 2, 3, 4)]
    assert [r.workload for r in g.replicas] == [45.0, 19.0]
    for r in g.replicas:
        p = r.plan
        assert p.cp_size == 2 and p.doc_lens == r.doc_lens
        assert sum(s[2] for s in p.shards) == sum(r.doc_lens)
        # The same plan as planning the replica's batch alone.
        assert p.plan_hash == flashcp.plan(list(r.doc_lens), 2, "per_doc").plan_hash


def test_long_documents_are_cut_into_context_pieces():
    g = flashcp.plan_global_batch([25, 3], dp_size=3, cp_size=1, context=10,
                                  strategy="per_doc")
    assert g.piece_lens == (10, 10, 5, 3) and g.piece_doc == (0, 0, 0, 1)
    assert sorted(p for r in g.replicas for p in r.pieces) == [0, 1, 2, 3]
    assert all(sum(r.doc_lens) <= 10 for r in g.replicas)


def test_errors_name_the_field():
    with pytest.raises(flashcp.PlanError, match="dp_size: must be >= 1"):
        flashcp.plan_global_batch([5], dp_size=0, cp_size=1, context=10)
    with pytest.raises(flashcp.PlanError, match="doc_lens: 21 tokens; more than dp_size x "
                                                "context = 2 x 10"):
        flashcp.plan_global_batch([11, 10], dp_size=2, cp_size=1, context=10)
    with pytest.raises(flashcp.PlanError, match="doc_lens: piece 2 .* fits in none"):
        flashcp.plan_global_batch([6, 6, 6], dp_size=2, cp_size=1, context=10)
