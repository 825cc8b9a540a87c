#!/usr/bin/env python3
"""scripts/plan_diff.py on two hand-made plan files: exact rows and exit codes."""
import json
import pathlib
import subprocess
import sys
import tempfile
import unittest

TOOL = pathlib.Path(__file__).resolve().parent / "plan_diff.py"


def plan(batch_id, shards, imbalance, bottleneck, cut_docs):
    return {"batch_id": batch_id, "strategy": "flashcp", "doc_lens": [8, 4], "padding": 0,
            "shards": [{"doc": d, "start": s, "len": n, "rank": r} for d, s, n, r in shards],
            "metrics": {"imbalance_ratio": imbalance, "cut_docs": cut_docs,
                        "bytes": [{"scheme": "targeted", "phase_bottleneck_tokens": bottleneck}]}}


class PlanDiffTest(unittest.TestCase):
    def run_tool(self, before, after, *flags):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for name, plans in (("before", before), ("after", after)):
                path = pathlib.Path(d) / f"{name}.json"
                path.write_text("".join(json.dumps(p) + "\n" for p in plans))
                paths.append(str(path))
            return subprocess.run([sys.executable, str(TOOL), *paths, *flags],
                                  capture_output=True, text=True, check=False)

    def test_a_changed_plan_is_one_row_with_its_moves(self):
        same = plan(0, [(0, 0, 8, 0), (1, 0, 4, 1)], 1.5, 4, 0)
        old = plan(1, [(0, 0, 8, 0), (1, 0, 4, 1)], 1.5, 4, 0)
        # doc 0 cut at 6: its tokens 6..8 move from rank 0 to rank 1.
        new = plan(1, [(0, 0, 6, 0), (0, 6, 2, 1), (1, 0, 4, 1)], 1.25, 2, 1)
        r = self.run_tool([same, old], [same, new])
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 3)  # header, one changed plan, the sum
        self.assertEqual(lines[1].split(), ["1", "flashcp", "2->3", "3", "2", "0->1",
                                            "1.5000->1.2500", "4->2"])
        self.assertEqual(lines[2], "1 of 2 plans changed; mean imbalance 1.5000 -> 1.3750; "
                                   "mean targeted bottleneck 4.0 -> 3.0 tokens")

    def test_the_same_plans_exit_zero_and_all_prints_every_row(self):
        p = plan(0, [(0, 0, 8, 0), (1, 0, 4, 1)], 1.5, 4, 0)
        r = self.run_tool([p], [p])
        self.assertEqual(r.returncode, 0)
        self.assertEqual(len(r.stdout.splitlines()), 2)
        r = self.run_tool([p], [p], "--all")
        self.assertEqual(r.stdout.splitlines()[1].split()[3], "0")  # no shard changed

    def test_unpaired_batches_are_an_error(self):
        r = self.run_tool([plan(0, [], 1, 0, 0)], [plan(1, [], 1, 0, 0)])
        self.assertEqual(r.returncode, 2)
        self.assertIn("different batches", r.stderr)


if __name__ == "__main__":
    unittest.main()
