#!/usr/bin/env python3
"""The planner's key figures as SVG, from the benchmarks' own output.

    python3 bench/plot.py [--bin build/bin] [--out docs/figures]
                          [--latency_json bench/results/planner/plan_latency.json]
                          [--batches 64]

Writes into --out:
  plan_per_doc_vs_flashcp.svg  one WLB-LLM batch (128K, N = 8) planned by per_doc and
                               flashcp, drawn per rank (flashcp-plan --svg)
  imbalance.svg                imbalance distribution per strategy, per data set, 128K, N = 8
                               (flashcp-plan's JSON lines, --batches batches, seed 1)
  exchange_vs_n.svg            one phase's KV bottleneck relative to full KV, vs N, 128K
                               (the same JSON lines)
  plan_latency.svg             plan latency (thread CPU p50 and p99) vs documents per batch
                               (plan_latency_bench's JSON: --latency_json, or a fresh run
                               when the file is missing, saved there)

Standard library only: the SVG is written by hand, so no plotting package is needed.
Every input is deterministic (data sets sampled with seed 1) except plan latency, which
depends on the machine; the latency JSON records its context (host, CPUs, load).
"""

import argparse
import json
import math
import os
import subprocess
import sys

DATASETS = ["wlbllm", "pile", "redpajama"]
STRATEGIES = ["llama3", "per_doc", "ring", "zigzag", "whole_doc", "flashcp_paper", "flashcp", "magi"]
COLOURS = {
    "llama3": "#8c564b", "per_doc": "#e377c2", "ring": "#7f7f7f", "zigzag": "#bcbd22",
    "whole_doc": "#17becf", "flashcp_paper": "#ff7f0e", "flashcp": "#1f77b4", "magi": "#2ca02c",
}
FONT = 'font-family="sans-serif" font-size="11"'


def fmt(v):
    return f"{v:.2f}"


def esc(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


class Svg:
    """An SVG document built from primitives, in user units."""

    def __init__(self, width, height):
        self.width, self.height, self.items = width, height, []

    def add(self, s):
        self.items.append(s)

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{fmt(x1)}" y1="{fmt(y1)}" x2="{fmt(x2)}" y2="{fmt(y2)}" '
                 f'stroke="{stroke}" stroke-width="{width}"{d}/>')

    def rect(self, x, y, w, h, fill, stroke="none"):
        self.add(f'<rect x="{fmt(x)}" y="{fmt(y)}" width="{fmt(w)}" height="{fmt(h)}" '
                 f'fill="{fill}" stroke="{stroke}"/>')

    def text(self, x, y, s, anchor="start", size=None, weight=None, rotate=False, fill="#000"):
        extra = f' font-size="{size}"' if size else ""
        extra += f' font-weight="{weight}"' if weight else ""
        extra += f' transform="rotate(-90 {fmt(x)} {fmt(y)})"' if rotate else ""
        self.add(f'<text x="{fmt(x)}" y="{fmt(y)}" text-anchor="{anchor}" fill="{fill}"{extra}>'
                 f"{esc(s)}</text>")

    def polyline(self, pts, stroke, width=1.5, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        p = " ".join(f"{fmt(x)},{fmt(y)}" for x, y in pts)
        self.add(f'<polyline points="{p}" fill="none" stroke="{stroke}" stroke-width="{width}"{d}/>')

    def circle(self, x, y, r, fill):
        self.add(f'<circle cx="{fmt(x)}" cy="{fmt(y)}" r="{r}" fill="{fill}"/>')

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                    f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" {FONT}>\n')
            f.write('<rect width="100%" height="100%" fill="#fff"/>\n')
            f.write("\n".join(self.items))
            f.write("\n</svg>\n")


class Axes:
    """A plot area mapping data to user units; log scales take positive values only."""

    def __init__(self, svg, x, y, w, h, xlim, ylim, xlog=False, ylog=False):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, w, h
        self.xlim, self.ylim, self.xlog, self.ylog = xlim, ylim, xlog, ylog

    def _t(self, v, lim, log):
        a, b = lim
        if log:
            v, a, b = math.log10(v), math.log10(a), math.log10(b)
        return (v - a) / (b - a)

    def px(self, v):
        return self.x + self._t(v, self.xlim, self.xlog) * self.w

    def py(self, v):
        return self.y + self.h - self._t(v, self.ylim, self.ylog) * self.h

    def frame(self, title, xlabel, ylabel, xticks, yticks):
        s = self.svg
        s.rect(self.x, self.y, self.w, self.h, "none", "#444")
        for v, label in yticks:
            y = self.py(v)
            s.line(self.x, y, self.x + self.w, y, "#e4e4e4")
            s.line(self.x - 4, y, self.x, y, "#444")
            s.text(self.x - 6, y + 4, label, "end")
        for v, label in xticks:
            x = self.px(v)
            s.line(x, self.y + self.h, x, self.y + self.h + 4, "#444")
            s.text(x, self.y + self.h + 16, label, "middle")
        s.text(self.x + self.w / 2, self.y - 8, title, "middle", size=12, weight="bold")
        if xlabel:
            s.text(self.x + self.w / 2, self.y + self.h + 32, xlabel, "middle")
        if ylabel:
            s.text(self.x - 46, self.y + self.h / 2, ylabel, "middle", rotate=True)


def legend(svg, x, y, entries, dash=None):
    """Entries (label, colour[, dash]) in one row from (x, y)."""
    for e in entries:
        label, colour = e[0], e[1]
        d = e[2] if len(e) > 2 else dash
        svg.line(x, y - 4, x + 18, y - 4, colour, 2.5, d)
        svg.text(x + 22, y, label)
        x += 30 + 6.2 * len(label)


def percentile(values, p):
    """Nearest rank, as the benchmarks compute it."""
    v = sorted(values)
    k = min(len(v), max(1, math.ceil(p * len(v))))
    return v[k - 1]


def run(cmd):
    print("plot.py: " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout


def plan_lines(bin_dir, dataset, cp, strategies, batches, context=131072):
    """flashcp-plan's JSON lines (PlanResponse in JSON) for sampled batches, as dicts."""
    out = run([os.path.join(bin_dir, "flashcp-plan"), "--dataset", dataset, "--context",
               str(context), "--cp", str(cp), "--batches", str(batches), "--seed", "1",
               "--strategy", ",".join(strategies), "--quiet"])
    return [json.loads(line) for line in out.splitlines() if line]


def bottleneck_bytes(plan, scheme):
    """One layer's bottleneck bytes (forward + backward) under `scheme` ("full_kv",
    "allgather", "targeted"): the plan's metrics.bytes entry. 64-bit integers may be JSON
    strings (protobuf's printer) or numbers (flashcp-plan)."""
    for b in plan["metrics"]["bytes"]:
        if b["scheme"] == scheme:
            return int(b["bottleneck_bytes"])
    raise KeyError(f"plan has no metrics.bytes entry for scheme {scheme!r}")


def imbalance(plan):
    """max / mean attention workload (metrics.imbalance_ratio)."""
    return float(plan["metrics"]["imbalance_ratio"])


# --- imbalance distribution -------------------------------------------------------------

def imbalance_figure(plans_by_ds, batches, path):
    """Box per strategy: p25-p75 box, median bar, p5-p95 whiskers, min and max dots.

    The y axis is log(imbalance - 1), labelled as imbalance, so that 1.0005 and 3 both show.
    """
    pw, ph, left, top = 330, 300, 64, 40
    svg = Svg(left + 3 * (pw + 24) + 8, top + ph + 128)
    floor = 1e-4
    ticks = [(1e-4, "1.0001"), (1e-3, "1.001"), (1e-2, "1.01"), (1e-1, "1.1"), (1.0, "2"),
             (4.0, "5")]
    for i, ds in enumerate(DATASETS):
        ax = Axes(svg, left + i * (pw + 24), top, pw, ph, (0, len(STRATEGIES)), (floor, 6),
                  ylog=True)
        ax.frame(f"{ds}, C = 128K, N = 8", "", "imbalance (max / mean workload)" if i == 0 else "",
                 [], ticks)
        # Target R = 1.02.
        ax.svg.line(ax.x, ax.py(0.02), ax.x + ax.w, ax.py(0.02), "#d62728", 1, "4,3")
        if i == 0:
            ax.svg.text(ax.x + 4, ax.py(0.02) - 4, "R = 1.02", fill="#d62728")
        for k, st in enumerate(STRATEGIES):
            vals = [max(floor, imbalance(p) - 1) for p in plans_by_ds[ds]
                    if p["strategy"] == st]
            if not vals:
                continue
            c = COLOURS[st]
            xc = ax.px(k + 0.5)
            q = {p: percentile(vals, p) for p in (0.05, 0.25, 0.5, 0.75, 0.95)}
            svg.line(xc, ax.py(q[0.05]), xc, ax.py(q[0.95]), c, 1.5)
            for p in (0.05, 0.95):
                svg.line(xc - 6, ax.py(q[p]), xc + 6, ax.py(q[p]), c, 1.5)
            y75, y25 = ax.py(q[0.75]), ax.py(q[0.25])
            svg.rect(xc - 12, y75, 24, max(1.0, y25 - y75), c, "#333")
            svg.line(xc - 12, ax.py(q[0.5]), xc + 12, ax.py(q[0.5]), "#fff", 2)
            svg.circle(xc, ax.py(min(vals)), 2, c)
            svg.circle(xc, ax.py(max(vals)), 2, c)
            svg.text(xc + 4, top + ph + 8, st, "end", rotate=True)
    svg.text(left, top + ph + 118,
             f"Each box: {batches} batches (seed 1); box p25-p75, white bar median, whiskers "
             "p5-p95, dots min and max. flashcp-plan --dataset D --cp 8 --batches "
             f"{batches} --strategy all", size=10, fill="#444")
    svg.save(path)


# --- exchange vs N -----------------------------------------------------------------------

EXCHANGE_SERIES = [  # (label, strategy, scheme, dash)
    ("flashcp, targeted", "flashcp", "targeted", None),
    ("flashcp, all-gather", "flashcp", "allgather", "6,3"),
    ("flashcp_paper, all-gather", "flashcp_paper", "allgather", "6,3"),
    ("magi, targeted", "magi", "targeted", None),
    ("whole_doc, targeted", "whole_doc", "targeted", None),
]
EXCHANGE_NS = [4, 8, 16, 32]


def exchange_figure(plans, batches, path):
    """Mean over batches of a scheme's per-layer bottleneck bytes / full KV's, vs N."""
    pw, ph, left, top = 330, 280, 64, 40
    svg = Svg(left + 3 * (pw + 24) + 8, top + ph + 96)
    for i, ds in enumerate(DATASETS):
        ax = Axes(svg, left + i * (pw + 24), top, pw, ph, (3.4, 38), (0, 1.05), xlog=True)
        ax.frame(f"{ds}, C = 128K", "N (ranks)",
                 "KV bottleneck / full-KV all-gather's" if i == 0 else "",
                 [(n, str(n)) for n in EXCHANGE_NS],
                 [(v / 4, f"{v / 4:.2f}") for v in range(5)])
        svg.line(ax.x, ax.py(1), ax.x + ax.w, ax.py(1), "#8c564b", 1.5, "2,2")
        if i == 0:
            svg.text(ax.x + 4, ax.py(1) + 12, "full KV (llama3, per_doc CP)", fill="#8c564b")
        for label, st, scheme, dash in EXCHANGE_SERIES:
            pts = []
            for n in EXCHANGE_NS:
                rows = [p for p in plans[(ds, n)] if p["strategy"] == st]
                if rows:
                    r = sum(bottleneck_bytes(p, scheme) / bottleneck_bytes(p, "full_kv")
                            for p in rows)
                    pts.append((ax.px(n), ax.py(r / len(rows))))
            svg.polyline(pts, COLOURS[st], 2, dash)
            for x, y in pts:
                svg.circle(x, y, 2.5, COLOURS[st])
    legend(svg, left, top + ph + 56, [(l, COLOURS[s], d) for l, s, _, d in EXCHANGE_SERIES])
    svg.text(left, top + ph + 84,
             f"Mean over {batches} batches (seed 1) of one layer's bottleneck bytes (forward + "
             "backward, max over ranks) under each scheme, over the full-KV all-gather's "
             "(SPEC Eq. 4, 5).", size=10, fill="#444")
    svg.save(path)


# --- plan latency vs documents --------------------------------------------------------

LATENCY_CELLS = [(131072, 8, "C = 128K, N = 8", 1.0), (1048576, 64, "C = 1M, N = 64", 20.0)]


def latency_figure(bench, path):
    """p50 (dashed) and p99 (solid) thread CPU ms vs mean documents per batch."""
    runs = [b for b in bench["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
    pw, ph, left, top = 420, 300, 64, 40
    svg = Svg(left + 2 * (pw + 40) + 8, top + ph + 128)
    for i, (context, cp, title, target) in enumerate(LATENCY_CELLS):
        cells = {}
        for b in runs:
            st, ds, c, n = b["name"].split("/")[:4]
            if c == f"C:{context}" and n == f"N:{cp}":
                cells.setdefault(st, []).append(
                    (b["docs_per_batch"], b["p50_cpu_us"] / 1e3, b["p99_cpu_us"] / 1e3, ds))
        xs = [d for v in cells.values() for d, *_ in v]
        ys = [y for v in cells.values() for _, a, b_, _ in v for y in (a, b_)] + [target]
        if not xs:
            continue
        xlim = (min(xs) / 1.4, max(xs) * 1.4)
        ylim = (10 ** math.floor(math.log10(min(ys))), 10 ** math.ceil(math.log10(max(ys))))
        ax = Axes(svg, left + i * (pw + 40), top, pw, ph, xlim, ylim, xlog=True, ylog=True)
        yt = []
        e = math.log10(ylim[0])
        while e <= math.log10(ylim[1]) + 1e-9:
            v = 10 ** e
            yt.append((v, f"{v:g}"))
            e += 1
        xt = []
        for d in sorted({round(d, 1) for d in xs}):
            xt.append((d, f"{d:.0f}"))
        ax.frame(title, "documents per batch (wlbllm, pile, redpajama)",
                 "MakePlan thread CPU time, ms" if i == 0 else "", xt, yt)
        svg.line(ax.x, ax.py(target), ax.x + ax.w, ax.py(target), "#d62728", 1, "4,3")
        svg.text(ax.x + 4, ax.py(target) - 4, f"flashcp p99 target {target:g} ms", fill="#d62728")
        for st in STRATEGIES:
            v = sorted(cells.get(st, []))
            if not v:
                continue
            svg.polyline([(ax.px(d), ax.py(p99)) for d, _, p99, _ in v], COLOURS[st], 2)
            svg.polyline([(ax.px(d), ax.py(p50)) for d, p50, _, _ in v], COLOURS[st], 1.2, "4,3")
            for d, p50, p99, _ in v:
                svg.circle(ax.px(d), ax.py(p99), 2.5, COLOURS[st])
    legend(svg, left, top + ph + 60, [(s, COLOURS[s]) for s in STRATEGIES])
    ctx = bench.get("context", {})
    svg.text(left, top + ph + 88,
             "Solid: p99, dashed: p50, nearest rank over the calls of one run; 64 batches per "
             "cell (seed 1). build/bin/plan_latency_bench --benchmark_format=json", size=10,
             fill="#444")
    svg.text(left, top + ph + 104,
             f"Machine: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs at "
             f"{ctx.get('mhz_per_cpu', '?')} MHz, load average "
             f"{', '.join(f'{x:.1f}' for x in ctx.get('load_avg', []))}; "
             f"{ctx.get('date', '?')}", size=10, fill="#444")
    svg.save(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin", help="folder with flashcp-plan and the benches")
    ap.add_argument("--out", default="docs/figures", help="folder for the SVG files")
    ap.add_argument("--latency_json", "--latency-json", default="bench/results/planner/plan_latency.json",
                    help="plan_latency_bench --benchmark_format=json output; run when missing")
    ap.add_argument("--batches", type=int, default=64, help="sampled batches per cell")
    a = ap.parse_args()
    if a.batches < 1:
        ap.error(f"--batches: must be at least 1, got {a.batches}")
    os.makedirs(a.out, exist_ok=True)

    # A plan per rank: one WLB-LLM batch at N = 8, per_doc beside flashcp.
    run([os.path.join(a.bin, "flashcp-plan"), "--dataset", "wlbllm", "--context", "131072",
         "--cp", "8", "--batches", "1", "--strategy", "per_doc,flashcp", "--quiet",
         "--svg", os.path.join(a.out, "plan_per_doc_vs_flashcp.svg")])

    by_ds = {ds: plan_lines(a.bin, ds, 8, STRATEGIES, a.batches) for ds in DATASETS}
    imbalance_figure(by_ds, a.batches, os.path.join(a.out, "imbalance.svg"))

    want = sorted({s for _, s, _, _ in EXCHANGE_SERIES})
    plans = {}
    for ds in DATASETS:
        for n in EXCHANGE_NS:
            plans[(ds, n)] = by_ds[ds] if n == 8 else plan_lines(a.bin, ds, n, want, a.batches)
    exchange_figure(plans, a.batches, os.path.join(a.out, "exchange_vs_n.svg"))

    if not os.path.exists(a.latency_json):
        os.makedirs(os.path.dirname(a.latency_json) or ".", exist_ok=True)
        run([os.path.join(a.bin, "plan_latency_bench"),
             "--benchmark_filter=/C:(131072/N:8|1048576/N:64)$", "--benchmark_format=json",
             f"--benchmark_out={a.latency_json}", "--benchmark_out_format=json"])
    with open(a.latency_json, encoding="utf-8") as f:
        latency_figure(json.load(f), os.path.join(a.out, "plan_latency.svg"))
    print(f"plot.py: figures in {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
