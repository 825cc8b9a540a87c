"""attention(scheme="all_to_all") on real gloo process groups: output and
gradients against dense SDPA with the document mask for every strategy at
N = 2, 4, 8 with Hq = 8 and Hkv 8 (MHA) or 2 (GQA: a KV head replicated over
the positions that read it), and every rank's bytes, forward plus backward,
equal to flashcp-plan's (core::AnalyzePlan's) bytes["all_to_all"] exactly.
A group whose size does not divide Hq raises FAILED_PRECONDITION naming
query_heads on its ranks, as the analysis says. One process group per N."""
import json
import subprocess

import pytest

import flashcp
import cases
import harness

STRATEGIES = ["llama3", "per_doc", "ring", "zigzag", "magi", "whole_doc", "flashcp_paper",
              "flashcp", "csbp", "basp", "ilp"]
HQ, D = 8, 16
TOL = 2e-5  # fp32, as test_attention.py


def _batches(n):
    # One document (one group of N under every strategy), equal documents
    # (basp's batches; groups of N/2) and mixed lengths with one-token
    # documents and padding.
    return [[13 * n + 3], [8 * n] * 2 if n > 2 else [8 * n], [37, 1, 60, 5, 100, 1, 1, 29]]


def _plan_json(plan_bin, lens, n, strategy, hkv):
    args = [plan_bin, "--cp", str(n), "--strategy", strategy, "--heads", str(hkv),
            "--query_heads", str(HQ), "--head_dim", str(D), "--dtype_bytes", "4"]
    if strategy == "ilp":
        args += ["--ilp_time_limit", "1s", "--ilp_granularity", "8"]
    r = subprocess.run(args + [str(x) for x in lens], capture_output=True, text=True,
                       timeout=120)
    return r.stdout if r.returncode == 0 else None  # basp refuses unequal documents


def _specs(n, plan_bin):
    specs = {}
    for b, lens in enumerate(_batches(n)):
        for s in STRATEGIES:
            if s == "ilp" and b:  # the MILP is slow; one batch is enough
                continue
            if b == 1 and s != "basp":  # equal documents: basp's batch (time on 2 cores)
                continue
            for hkv in (8, 2):
                text = _plan_json(plan_bin, lens, n, s, hkv)
                if text is None:
                    assert s == "basp", (s, lens)
                    continue
                metrics = json.loads(text)["metrics"]
                a2a = next(x for x in metrics["bytes"] if x["scheme"] == "all_to_all")
                specs[(s, b, hkv)] = dict(cases.with_reference(dict(
                    doc_lens=lens, hq=HQ, hkv=hkv, d=D, seed=10 * b + n + hkv,
                    plan=flashcp.plan_view(text))),
                    sent=a2a["sent_bytes"], received=a2a["received_bytes"],
                    inapplicable=metrics.get("all_to_all_inapplicable", ""))
    return specs


_RESULTS = {}


def _results(n, plan_bin):
    if n not in _RESULTS:
        specs = _specs(n, plan_bin)
        _RESULTS[n] = (specs, harness.run(cases.all_to_all_cases, n,
                                          {k: {x: v[x] for x in v if x not in ("sent", "received",
                                                                                "inapplicable")}
                                           for k, v in specs.items()}, timeout_s=240))
    return _RESULTS[n]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_to_all_matches_dense_reference_and_predicted_bytes(plan_bin, n):
    specs, per_rank = _results(n, plan_bin)
    ran = set()
    for key, spec in specs.items():
        refused = [r for r in range(n) if per_rank[r][key][0] == "refused"]
        if spec["inapplicable"]:
            assert refused, (key, spec["inapplicable"])
            for r in refused:
                assert "FAILED_PRECONDITION: query_heads: the all-to-all over a group of" in \
                    per_rank[r][key][1], (key, r, per_rank[r][key][1])
            continue
        assert not refused, (key, [per_rank[r][key] for r in refused])
        for r in range(n):
            _, errs, sent, received = per_rank[r][key]
            for name, err in zip(("o", "dq", "dk", "dv"), errs):
                assert err <= TOL, f"N={n} {key} rank {r} {name}: max abs error {err}"
            assert (sent, received) == (spec["sent"][r], spec["received"][r]), (key, r)
        ran.add(key[0])
    # Every strategy ran at least one batch (the one-document batch splits
    # its document over a group of N, and N divides Hq = 8).
    assert ran == set(STRATEGIES), set(STRATEGIES) - ran


def test_bf16_messages_are_bf16_and_close_to_the_reference(plan_bin):
    # bf16 inputs travel as bf16 (2 bytes an element: flashcp-plan's bytes at
    # dtype_bytes 2), the kernels compute in fp32.
    lens = [37, 1, 60, 5, 100, 1, 1, 29]
    args = [plan_bin, "--cp", "2", "--strategy", "per_doc", "--heads", "2", "--query_heads",
            "4", "--head_dim", str(D), "--dtype_bytes", "2"]
    text = subprocess.run(args + [str(x) for x in lens], check=True, capture_output=True,
                          text=True, timeout=60).stdout
    a2a = next(x for x in json.loads(text)["metrics"]["bytes"] if x["scheme"] == "all_to_all")
    spec = cases.with_reference(dict(doc_lens=lens, hq=4, hkv=2, d=D, seed=5,
                                     dtype="bfloat16", plan=flashcp.plan_view(text)))
    res = harness.run(cases.all_to_all_cases, 2, {"bf16": spec}, timeout_s=120)
    for r in range(2):
        status, errs, sent, received = res[r]["bf16"]
        assert status == "ok"
        assert max(errs) <= 0.1, errs  # bf16 inputs and outputs, fp32 inside
        assert (sent, received) == (a2a["sent_bytes"][r], a2a["received_bytes"][r])


def test_a_mixed_plan_runs_each_group_with_its_scheme(plan_bin):
    # whole_doc's plan of this batch at N = 8 has two rank groups, {0, 1, 2,
    # 7} and {3, 4, 5, 6} (found by search). Every combination of the four
    # schemes over the two groups runs side by side (an all-gather group
    # point to point among its ranks); each rank moves its group's scheme's
    # bytes: flashcp-plan's per rank for targeted and all_to_all, and for an
    # all-gather group its block (C/N rows, or the group's largest non-last
    # rows) to and from each of the other 3, forward and back
    # (core::GroupedSchemeBytes).
    lens = [139, 160, 157, 85, 118, 154, 8, 59, 163, 46, 141, 150]
    hkv = 2
    text = _plan_json(plan_bin, lens, 8, "whole_doc", hkv)
    view = flashcp.plan_view(text)
    groups = [(0, 1, 2, 7), (3, 4, 5, 6)]
    metrics = json.loads(text)["metrics"]
    by = {x["scheme"]: x for x in metrics["bytes"]}
    kv_row = 2 * hkv * D * 4  # [K | V] of a token, fp32

    def want(scheme, g, r):
        if scheme in ("targeted", "all_to_all"):
            return by[scheme]["sent_bytes"][r], by[scheme]["received_bytes"][r]
        block = (metrics["tokens_per_rank"] if scheme == "full_kv"
                 else max(metrics["rank_nonlast_tokens"][x] for x in g))
        b = 2 * kv_row * block * (len(g) - 1)
        return b, b

    schemes = ("targeted", "allgather", "full_kv", "all_to_all")
    combos = [(a, b) for a in schemes for b in schemes]
    refuse = [[(list(range(8)), "targeted")],
              [([0, 1, 2, 7], "ring"), ([3, 4, 5, 6], "targeted")]]
    specs = {}
    for a, b in combos:
        mixed = [(list(groups[0]), a), (list(groups[1]), b)]
        specs[(a, b)] = dict(cases.with_reference(dict(doc_lens=lens, hq=HQ, hkv=hkv, d=D, seed=7,
                                                       plan=view)), scheme=mixed, refuse=refuse)
    res = harness.run(cases.all_to_all_cases, 8, specs, timeout_s=300)
    for a, b in combos:
        for r in range(8):
            status, errs, sent, received = res[r][(a, b)]
            assert status == "ok", ((a, b), r, status)
            assert max(errs) <= TOL, ((a, b), r, errs)
            assert res[r][((a, b), "refused")] == [
                ("ValueError", "scheme: groups [(0, 1, 2, 3, 4, 5, 6, 7)] are not the plan's "
                               "rank groups [(0, 1, 2, 7), (3, 4, 5, 6)] (ranks linked by shared "
                               "documents)"),
                ("ValueError", "scheme: 'ring' for ranks [0, 1, 2, 7]; expected one of targeted, "
                               "allgather, full_kv, all_to_all, two_level")], r
            g, mine = (groups[0], a) if r in groups[0] else (groups[1], b)
            assert (sent, received) == want(mine, g, r), ((a, b), r)
    # An all-gather group's bytes are not the whole plan's all-gather's.
    assert want("allgather", groups[0], 0) != (by["allgather"]["sent_bytes"][0],
                                               by["allgather"]["received_bytes"][0])
