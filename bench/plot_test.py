"""Tests of bench/plot.py: its helpers exactly, and every figure's structure from a real run
of flashcp-plan and the committed plan_latency_bench output.

    python3 bench/plot_test.py --bin build/bin     # ctest: bench_plot_test
"""

import argparse
import importlib.util
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location("plot", os.path.join(HERE, "plot.py"))
plot = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(plot)
NS = "{http://www.w3.org/2000/svg}"
BIN = "build/bin"


class HelpersTest(unittest.TestCase):
    def test_percentile_is_nearest_rank(self):
        v = [5, 1, 4, 2, 3]
        self.assertEqual(plot.percentile(v, 0.05), 1)
        self.assertEqual(plot.percentile(v, 0.5), 3)
        self.assertEqual(plot.percentile(v, 0.95), 5)
        self.assertEqual(plot.percentile(v, 1.0), 5)
        self.assertEqual(plot.percentile([7], 0.25), 7)

    def test_axes_map_linear_and_log(self):
        svg = plot.Svg(100, 100)
        ax = plot.Axes(svg, 10, 20, 200, 100, (0, 4), (1, 1000), ylog=True)
        self.assertEqual(ax.px(0), 10)
        self.assertEqual(ax.px(1), 60)
        self.assertEqual(ax.px(4), 210)
        self.assertAlmostEqual(ax.py(1), 120)
        self.assertAlmostEqual(ax.py(10), 120 - 100 / 3)
        self.assertAlmostEqual(ax.py(1000), 20)

    def test_plan_fields_are_read_from_the_plan_response_json(self):
        plan = {"metrics": {"imbalance_ratio": 1.25, "bytes": [
            {"scheme": "full_kv", "bottleneck_bytes": 96},
            {"scheme": "allgather", "bottleneck_bytes": "64"},  # protobuf's printer: a string
            {"scheme": "targeted", "bottleneck_bytes": 32}]}}
        self.assertEqual(plot.imbalance(plan), 1.25)
        self.assertEqual(plot.bottleneck_bytes(plan, "full_kv"), 96)
        self.assertEqual(plot.bottleneck_bytes(plan, "allgather"), 64)
        self.assertEqual(plot.bottleneck_bytes(plan, "targeted"), 32)
        with self.assertRaisesRegex(KeyError, "no metrics.bytes entry for scheme 'ring'"):
            plot.bottleneck_bytes(plan, "ring")

    def test_text_is_escaped(self):
        svg = plot.Svg(10, 10)
        svg.text(0, 0, 'a<b & "c"')
        self.assertEqual(svg.items[-1],
                         '<text x="0.00" y="0.00" text-anchor="start" fill="#000">'
                         "a&lt;b &amp; &quot;c&quot;</text>")


class FiguresTest(unittest.TestCase):
    """One run of the script with 2 batches per cell; each figure checked for its parts."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        latency = os.path.join(os.path.dirname(HERE), "bench", "results", "planner",
                               "plan_latency.json")
        argv = sys.argv
        sys.argv = ["plot.py", "--bin", BIN, "--out", cls.tmp.name, "--latency_json", latency,
                    "--batches", "2"]
        try:
            plot.main()
        finally:
            sys.argv = argv

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def parse(self, name):
        return ET.parse(os.path.join(self.tmp.name, name)).getroot()

    def test_every_figure_is_written(self):
        self.assertEqual(sorted(os.listdir(self.tmp.name)),
                         ["exchange_vs_n.svg", "imbalance.svg", "plan_latency.svg",
                          "plan_per_doc_vs_flashcp.svg"])

    def test_plan_picture_has_two_panels_of_eight_ranks(self):
        root = self.parse("plan_per_doc_vs_flashcp.svg")
        panels = [g for g in root.iter(NS + "g") if g.get("class") == "panel"]
        self.assertEqual([p.get("data-title") for p in panels], ["per_doc", "flashcp"])
        for p in panels:
            ranks = [g for g in p.iter(NS + "g") if g.get("class") == "rank"]
            self.assertEqual(len(ranks), 8)

    def test_imbalance_has_a_box_per_strategy_and_data_set(self):
        root = self.parse("imbalance.svg")
        boxes = [r for r in root.iter(NS + "rect") if r.get("stroke") == "#333"]
        self.assertEqual(len(boxes), len(plot.STRATEGIES) * len(plot.DATASETS))

    def test_exchange_has_a_line_per_series_and_data_set(self):
        root = self.parse("exchange_vs_n.svg")
        lines = list(root.iter(NS + "polyline"))
        self.assertEqual(len(lines), len(plot.EXCHANGE_SERIES) * len(plot.DATASETS))
        for line in lines:
            self.assertEqual(len(line.get("points").split()), len(plot.EXCHANGE_NS))

    def test_latency_has_p50_and_p99_per_strategy_and_cell(self):
        root = self.parse("plan_latency.svg")
        lines = list(root.iter(NS + "polyline"))
        self.assertEqual(len(lines), 2 * len(plot.STRATEGIES) * len(plot.LATENCY_CELLS))
        for line in lines:
            self.assertEqual(len(line.get("points").split()), len(plot.DATASETS))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=BIN)
    args, rest = ap.parse_known_args()
    BIN = args.bin
    unittest.main(argv=[sys.argv[0]] + rest)
