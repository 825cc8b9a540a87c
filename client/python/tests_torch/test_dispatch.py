"""dispatch / undispatch exact round trips and the context's model helpers."""
import pytest

import flashcp
import cases
import harness

LENS = [37, 1, 60, 5, 100, 1, 1, 29]  # 234 tokens


@pytest.mark.parametrize("n, strategy", [(1, "flashcp"), (3, "zigzag"), (4, "flashcp"),
                                         (8, "per_doc")])
def test_dispatch_round_trip_and_helpers(n, strategy):
    view = flashcp.plan_view(flashcp.plan(LENS, n, strategy, min_shard_tokens=8))
    res = harness.run(cases.dispatch_case, n, dict(doc_lens=LENS, plan=view))
    assert sum(r["real_rows"] for r in res) == 234
    for rank, r in enumerate(res):
        assert r["rows"] == r["local_rows"] == -(-234 // n)
        for key in ("round_trip", "round_trip_padded", "pad_rows_zero", "pad_rows_taken",
                    "ids_round_trip", "positions", "labels", "grad_flows"):
            assert r[key] is True, (rank, key)
        assert r["cu_q_last"] == r["real_rows"]
        # Each rank's shards: key lengths = prefix + own, as the plan says.
        mine = [s for s in view.shards if s[3] == rank]
        assert r["cu_q"] == [0] + [sum(s[2] for s in mine[:i + 1]) for i in range(len(mine))]
        assert r["cu_k"] == [0] + [sum(s[1] + s[2] for s in mine[:i + 1])
                                   for i in range(len(mine))]
        assert r["max_q"] == max(s[2] for s in mine)
        assert r["max_k"] == max(s[1] + s[2] for s in mine)
