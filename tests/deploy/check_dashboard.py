#!/usr/bin/env python3
"""deploy/grafana/flashcp.json: valid JSON; a Prometheus data-source variable that every panel
and query uses; the filter variables namespace, group, strategy and cp_size, each with "All"
as the regex .*; every query is valid PromQL (promtool parses each one as a recording rule,
variables replaced by .*, as Grafana's All does) and names only metrics from known_metrics.txt
or recording rules from deploy/prometheus/rules; queries use no other variable and every
variable only inside a =~ matcher, so an end-to-end test can run each one with All. Every
saving panel names its scheme ({{scheme}} in each legend); there is a per-rank heatmap.
Standard library only."""
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/flashcp.json"
RULES = ROOT / "deploy/prometheus/rules"
KNOWN = pathlib.Path(__file__).resolve().parent / "known_metrics.txt"

# PromQL functions and aggregation operators (Prometheus 2.42), and keywords.
FUNCTIONS = set("""abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min
count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv exp floor
histogram_count histogram_fraction histogram_quantile histogram_sum holt_winters hour idelta
increase irate label_join label_replace last_over_time ln log10 log2 max_over_time
min_over_time minute month predict_linear present_over_time quantile_over_time rate resets
round scalar sgn sort sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time time
timestamp vector year acos acosh asin asinh atan atanh cos cosh deg pi rad sin sinh tan tanh
sum min max avg group stddev stdvar count count_values bottomk topk quantile""".split())
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset", "inf", "nan"}

FILTERS = ("namespace", "group", "strategy", "cp_size")
failures = []


def with_all(expr):
    """The query as Grafana runs it with every filter variable at All (.*)."""
    for v in FILTERS:
        expr = expr.replace("${" + v + "}", ".*").replace("$" + v, ".*")
    return expr


def fail(msg):
    failures.append(msg)


def known_names():
    names = set()
    for line in KNOWN.read_text().splitlines():
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        names.add(line[0])
        if line[1:] == ["histogram"]:
            names |= {line[0] + s for s in ("_bucket", "_sum", "_count")}
    rules = set()
    for path in RULES.glob("*.yml"):
        rules |= set(re.findall(r"^\s*- record:\s*(\S+)\s*$", path.read_text(), re.M))
    if not rules:
        fail(f"no recording rules found in {RULES}")
    return names, rules


def metric_names(expr):
    """The metric (or rule) names an expression selects: identifiers outside strings, label
    matchers, ranges and grouping clauses that are not functions or keywords."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = []
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        after = e[m.end():].lstrip()
        if word in KEYWORDS or (word in FUNCTIONS and after.startswith("(")):
            continue
        # Numbers like 1e-3 are not identifiers: skip a word glued to a preceding digit.
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue
        names.append(word)
    return names


def main():
    global DASHBOARD
    if len(sys.argv) > 1:  # another dashboard file, e.g. to test this checker
        DASHBOARD = pathlib.Path(sys.argv[1])
    try:
        dash = json.loads(DASHBOARD.read_text())
    except (OSError, json.JSONDecodeError) as err:
        print(f"FAIL: {DASHBOARD}: {err}", file=sys.stderr)
        return 1

    for key in ("uid", "title", "panels", "templating", "schemaVersion"):
        if key not in dash:
            fail(f"dashboard has no {key!r}")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        fail("dashboard needs a 'datasource' variable of type datasource, query prometheus")
    if set(variables) != {"datasource", *FILTERS}:
        fail(f"variables must be datasource and {', '.join(FILTERS)}: {sorted(variables)}")
    for v in FILTERS:
        var = variables.get(v, {})
        if var.get("type") != "query" or not var.get("includeAll") or var.get("allValue") != ".*":
            fail(f"variable {v!r}: want a query variable with includeAll and allValue '.*'")

    names, rules = known_names()
    exprs = []
    ids = set()
    panels = []
    for p in dash.get("panels", []):
        panels.append(p)
        panels += p.get("panels", [])  # collapsed rows hold their panels
    for p in panels:
        title = p.get("title", "?")
        if p.get("id") in ids:
            fail(f"panel {title!r}: duplicate id {p.get('id')}")
        ids.add(p.get("id"))
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") not in ("${datasource}", "$datasource"):
            fail(f"panel {title!r}: datasource is not ${{datasource}}")
        if not p.get("targets"):
            fail(f"panel {title!r}: no queries")
        for t in p.get("targets", []):
            expr = t.get("expr", "")
            where = f"panel {title!r} query {t.get('refId')}"
            if not expr.strip():
                fail(f"{where}: empty expr")
                continue
            if t.get("datasource", {}).get("uid") not in (None, "${datasource}", "$datasource"):
                fail(f"{where}: datasource is not ${{datasource}}")
            for m in re.finditer(r'(\w+)\s*(=~|!~|!=|=)\s*"\$\{?(\w+)\}?"', expr):
                if m.group(3) not in FILTERS or m.group(2) != "=~" or m.group(1) != m.group(3):
                    fail(f"{where}: variable ${m.group(3)} must filter its own label with =~: {expr}")
            expr = with_all(expr)
            if "$" in expr:
                fail(f"{where}: uses a Grafana variable other than {FILTERS}: {expr}")
            if "saving" in title.lower() and "{{scheme}}" not in t.get("legendFormat", ""):
                fail(f"{where}: a saving series must name its scheme in the legend")
            used = metric_names(expr)
            if not used:
                fail(f"{where}: selects no metric: {expr}")
            for n in used:
                if n not in names and n not in rules:
                    fail(f"{where}: unknown metric or rule {n!r} in {expr}")
            exprs.append((where, expr))

    if not any(p.get("type") == "heatmap" and "rank" in json.dumps(p.get("targets")) for p in panels):
        fail("no per-rank heatmap panel")

    # Syntax: promtool parses every expression as a recording rule.
    promtool = shutil.which("promtool")
    if not promtool:
        fail("promtool not found (Debian package 'prometheus'; scripts/install-deps.sh installs it)")
    elif exprs:
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            f.write("groups:\n  - name: dashboard\n    rules:\n")
            for i, (_, expr) in enumerate(exprs):
                f.write(f"      - record: dashboard:query_{i}\n        expr: {json.dumps(expr)}\n")
            f.flush()
            res = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
            if res.returncode != 0:
                fail("promtool rejects a dashboard query:\n" + res.stdout + res.stderr)

    if failures:
        for msg in failures:
            print("FAIL: " + msg, file=sys.stderr)
        return 1
    print(f"PASS: dashboard: {len(panels)} panels, {len(exprs)} queries, all known names and valid PromQL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
