"""torch.compile of a model that calls flashcp.torch.attention: no graph
break, one graph for steps of different plans, the eager path's numbers."""
import pytest

import flashcp
import cases
import harness

# Two batches of 234 tokens: C/N equal at each N, plans different.
STEPS = [[37, 1, 60, 5, 100, 1, 1, 29], [100, 34, 100]]


@pytest.mark.parametrize("n", [2])
def test_compiled_attention_has_no_graph_break_and_matches_eager(n):
    steps = [(lens, flashcp.plan_view(flashcp.plan(lens, n, s, min_shard_tokens=8)))
             for lens, s in zip(STEPS, ["flashcp", "zigzag"])]
    for rank, r in enumerate(harness.run(cases.compile_case, n, dict(steps=steps),
                                         timeout_s=240)):
        assert r["explain_breaks"] == 0 and r["explain_graphs"] == 1, (rank, r)
        assert r["graph_breaks"] == 0, (rank, r)
        # A new context (plan) each step is a new input, not a recompile.
        assert r["unique_graphs"] == 1, (rank, r)
        assert max(r["diffs"]) < 1e-5, (rank, r)
