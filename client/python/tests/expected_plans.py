"""Plans worked out by hand that several tests expect from the real planner."""


def shards(plan):
    """A PlanResponse's shards as (doc, start, len, rank) tuples."""
    return [(s.doc, s.start, s.len, s.rank) for s in plan.shards]


# Ring on [5, 3], N = 2: chunks of C/N = 4 tokens. Rank 0: doc 0 [0, 4); rank
# 1: doc 0 [4, 5) and doc 1 [0, 3).
RING_5_3_SHARDS = [(0, 0, 4, 0), (0, 4, 1, 1), (1, 0, 3, 1)]
# Its plan_hash: core/plan_hash_test.cc's pinned value.
RING_5_3_HASH = "acb8cc4eb63dfe48"


def assert_ring_plan_for_5_3(plan):
    """Every field of ring's plan for [5, 3] at N = 2 but batch_id. Workload
    (2p + s + 1) s / 2: rank 0 10, rank 1 5 + 6 = 11; imbalance 11 / 10.5."""
    assert plan.strategy == "ring"
    assert plan.cp_size == 2
    assert list(plan.doc_lens) == [5, 3]
    assert plan.padding == 0
    assert shards(plan) == RING_5_3_SHARDS
    assert plan.plan_hash == RING_5_3_HASH
    assert list(plan.metrics.rank_workload) == [10.0, 11.0]
    assert plan.metrics.imbalance_ratio == 11 / 10.5
    assert plan.metrics.tokens_per_rank == 4
