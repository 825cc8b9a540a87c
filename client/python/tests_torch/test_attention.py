"""attention() output and gradients against dense SDPA with the document
mask: every strategy, both schemes, N = 1, 2, 3, 4, 8 real gloo processes,
GQA, one-token documents, padding. One process group per N runs every case
(cases.attention_case); each test asserts one (N, case)."""
import subprocess

import pytest

import flashcp
import cases
import harness

STRATEGIES = ["llama3", "per_doc", "ring", "zigzag", "whole_doc", "flashcp_paper", "flashcp", "ilp"]
# One-token documents, a long one, and totals that N does not divide
# (234: padding 2 at N = 4 and 6 at N = 8; 235: padding 1 at N = 2 and 3).
BATCHES = [[37, 1, 60, 5, 100, 1, 1, 29], [1, 120, 3, 1, 90, 19, 1]]
TOL = 2e-5  # fp32: blocked online softmax vs SDPA's math, |x| ~ 1 inputs


def _ilp_json(plan_bin, lens, n):
    # flashcp-plan's JSON (CpContext's third input form), with a short MILP
    # time limit and coarse blocks: the service's default limit is 10 s.
    return subprocess.run([plan_bin, "--cp", str(n), "--strategy", "ilp", "--ilp_time_limit",
                           "1s", "--ilp_granularity", "8", *map(str, lens)], check=True,
                          capture_output=True, text=True, timeout=120).stdout


def _specs(n, plan_bin):
    specs = {}
    for b, lens in enumerate(BATCHES):
        for s in STRATEGIES:
            if s == "ilp" and b:  # the MILP is slow; one batch is enough
                continue
            gqa = (4, 2) if b == 0 else (3, 1)
            # Planned once here; the ranks get the plan (as a PlanView).
            plan = flashcp.plan_view(_ilp_json(plan_bin, lens, n) if s == "ilp" else
                                     flashcp.plan(lens, n, s, min_shard_tokens=-1 if b else 8))
            specs[(s, b)] = cases.with_reference(dict(
                doc_lens=lens, strategy=s, hq=gqa[0], hkv=gqa[1], d=16, seed=10 * b + n,
                plan=plan))
    return specs


_RESULTS = {}


def _results(n, plan_bin):
    if n not in _RESULTS:
        specs = _specs(n, plan_bin)
        per_rank = harness.run(cases.attention_cases, n, specs, timeout_s=240)
        _RESULTS[n] = per_rank
    return _RESULTS[n]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("strategy, batch", [(s, b) for b in range(len(BATCHES))
                                             for s in STRATEGIES if not (s == "ilp" and b)])
def test_attention_matches_dense_reference(plan_bin, n, strategy, batch):
    for rank, res in enumerate(_results(n, plan_bin)):
        for scheme, errs in res[(strategy, batch)].items():
            for name, err in zip(("o", "dq", "dk", "dv"), errs):
                assert err <= TOL, f"N={n} rank {rank} {scheme} {name}: max abs error {err}"


def test_bf16_inputs_return_bf16_close_to_the_reference():
    res = harness.run(cases.attention_cases, 2, {
        "bf16": cases.with_reference(dict(doc_lens=BATCHES[0], strategy="flashcp", hq=4, hkv=2,
                                          d=16, seed=3, dtype="bfloat16", min_shard=8))},
        timeout_s=120)
    for rank in res:
        for scheme, errs in rank["bf16"].items():
            # bf16 inputs and outputs (8 bits of mantissa), fp32 inside.
            assert max(errs) <= 0.1, (scheme, errs)


def test_cp_groups_inside_a_larger_world():
    lens = BATCHES[1]
    plan = flashcp.plan_view(flashcp.plan(lens, 2, "flashcp", min_shard_tokens=8))
    for rank, res in enumerate(harness.run(cases.subgroup_case, 4, dict(doc_lens=lens,
                                                                         plan=plan))):
        assert res.pop("undispatch") is True
        for scheme, errs in res.items():
            assert max(errs) <= TOL, (rank, scheme, errs)


@pytest.mark.parametrize("n", [3, 4])
def test_the_targeted_exchange_posts_one_batched_call_per_phase(n):
    # flashcp's plan cuts documents across ranks: several peers each way.
    lens = BATCHES[0]
    spec = cases.with_reference(dict(doc_lens=lens, strategy="per_doc", hq=2, hkv=2, d=16,
                                     seed=3, plan=flashcp.plan_view(
                                         flashcp.plan(lens, n, "per_doc"))))
    for rank, r in enumerate(harness.run(cases.batched_p2p_case, n, spec, timeout_s=120)):
        assert max(r["errors"]) < TOL, (rank, r["errors"])
        c = r["counts"]
        assert r["sends"] + r["recvs"] > 1, r  # a grouped call worth testing
        # Forward: the layout's sends and receives; backward: the mirror.
        assert c == {"batches": 2, "isend": r["sends"] + r["recvs"],
                     "irecv": r["recvs"] + r["sends"], "ungrouped": 0}, (rank, r)
