"""flashcp.plan (in process) against the real service and flashcp-plan."""
import json
import subprocess

import grpc
import pytest

import flashcp
from flashcp._native import native
from conftest import CLIENT_OPTIONS

STRATEGIES = ["llama3", "per_doc", "ring", "zigzag", "whole_doc", "flashcp_paper", "flashcp",
              "magi"]


def _dataset(plan_bin, cp):
    """Batches of the pile data set (core/datasets.h), as flashcp-plan samples them."""
    out = subprocess.run([plan_bin, "--dataset", "pile", "--context", "16384", "--batches", "3",
                          "--cp", str(cp), "--strategy", "all"], capture_output=True,
                         timeout=120, check=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _bytes_without_time(resp):
    resp = type(resp).FromString(resp.SerializeToString())
    resp.metrics.planning_seconds = 0.0
    return resp.SerializeToString(deterministic=True)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_in_process_plan_equals_service_and_cli_on_a_dataset(plan_bin, planner_address, cp):
    client = flashcp.Client(planner_address, options=CLIENT_OPTIONS)
    lines = _dataset(plan_bin, cp)
    assert {line["strategy"] for line in lines} == set(STRATEGIES)
    for line in lines:
        for layout in (False, True):
            remote = client.plan(line["doc_lens"], cp, line["strategy"], include_layout=layout)
            local = flashcp.plan(line["doc_lens"], cp, line["strategy"], include_layout=layout)
            assert local.metrics.planning_seconds > 0
            assert _bytes_without_time(local) == _bytes_without_time(remote)
        # The CLI's line is the same PlanResponse in JSON: its batch_id is
        # the batch index, planning_seconds 0, no layout.
        cli = flashcp.response_from_json(line)
        local = flashcp.plan(line["doc_lens"], cp, line["strategy"], batch_id=cli.batch_id)
        assert _bytes_without_time(cli) == _bytes_without_time(local), line["strategy"]
        view = flashcp.plan_view(local)
        assert view == flashcp.plan_view(line), line["strategy"]


def test_in_process_options_match_the_service_and_ilp_runs_there(planner_address):
    client = flashcp.Client(planner_address, options=CLIENT_OPTIONS)
    for kwargs in ({"target_imbalance": 1.3}, {"heads": 8, "head_dim": 64, "dtype_bytes": 4},
                   {"cost_profile": "cpu-fp32", "rank_speed": [1, 1.5, 0.5, 1],
                    "ranks_per_node": 2},
                   {"cost": {"whole_pair": 2, "prefixed_pair": 3, "token": 1}}):
        remote = client.plan([300, 5, 1, 77, 1000], 4, "flashcp", **kwargs)
        local = flashcp.plan([300, 5, 1, 77, 1000], 4, "flashcp", **kwargs)
        assert _bytes_without_time(local) == _bytes_without_time(remote)
    req = flashcp.Client.request([500, 40, 3], 2, "flashcp")
    req.min_shard_tokens = -1
    remote = client._get_stub().Plan(req, timeout=30)
    assert _bytes_without_time(flashcp.plan([500, 40, 3], 2, "flashcp", min_shard_tokens=-1)) \
        == _bytes_without_time(remote)
    # ilp plans where CBC is linked (the extension links none): the service
    # plans it; in process it is FAILED_PRECONDITION naming where it runs.
    assert flashcp.plan_view(client.plan([64, 32, 16], 2, "ilp")).shards
    with pytest.raises(flashcp.PlanError) as local:
        flashcp.plan([64, 32, 16], 2, "ilp")
    assert local.value.code == "FAILED_PRECONDITION"
    assert "flashcp-planner --allow_ilp" in str(local.value)
    assert "flashcp-plan --strategy ilp" in str(local.value)


@pytest.mark.parametrize("args, field", [
    (([], 2), "doc_lens"),
    (([5, 0], 2), "doc_lens[1]"),
    (([1], 2), "cp_size"),
    (([5, 5], 2, "nope"), "strategy"),
])
def test_in_process_errors_match_the_service(planner_address, args, field):
    with pytest.raises(grpc.RpcError) as remote:
        flashcp.Client(planner_address, options=CLIENT_OPTIONS).plan(*args)
    with pytest.raises(flashcp.PlanError) as local:
        flashcp.plan(*args)
    assert local.value.code == remote.value.code().name == "INVALID_ARGUMENT"
    assert str(local.value) == f"INVALID_ARGUMENT: {remote.value.details()}"
    assert remote.value.details().startswith(field)


def test_block_diffusion_plan_in_process_equals_the_service(planner_address):
    """attention_mask="block_diffusion": the plan covers both copies of every
    document (noisy, then clean), in process as in the service."""
    client = flashcp.Client(planner_address, options=CLIENT_OPTIONS)
    for strategy in ("llama3", "csbp", "flashcp"):
        local = flashcp.plan([300, 5, 1, 78], 4, strategy, attention_mask="block_diffusion",
                             block_size=4)
        assert local.attention_mask == "block_diffusion" and local.block_size == 4
        assert list(local.doc_lens) == [300, 5, 1, 78, 300, 5, 1, 78]
        assert list(local.metrics.rank_tokens) == [192] * 4  # 2C/N
        req = flashcp.Client.request([300, 5, 1, 78], 4, strategy)
        req.attention_mask = "block_diffusion"
        req.block_size = 4
        remote = client._get_stub().Plan(req, timeout=30)
        assert _bytes_without_time(local) == _bytes_without_time(remote), strategy
    with pytest.raises(flashcp.PlanError) as bad:
        flashcp.plan([8], 2, "llama3", attention_mask="block_diffusion")
    assert bad.value.code == "INVALID_ARGUMENT"
    assert "block_size: must be in [1, 2^40]" in str(bad.value)
    with pytest.raises(flashcp.PlanError) as bad:
        flashcp.plan([8], 2, "magi", attention_mask="block_diffusion", block_size=2)
    assert "strategy: magi does not plan attention_mask block_diffusion" in str(bad.value)


def test_plan_view_rejects_what_is_not_a_plan():
    with pytest.raises(ValueError, match="expected a PlanResponse"):
        flashcp.plan_view(42)
    with pytest.raises(ValueError, match="not a PlanResponse in JSON: .*nonsense"):
        flashcp.plan_view({"cp_size": 2, "doc_lens": [3], "nonsense": 1})
    with pytest.raises(ValueError, match="not a PlanResponse in JSON: .*doc_lens"):
        flashcp.plan_view('{"cp_size": 2, "doc_lens": ["x"]}')
    with pytest.raises(ValueError, match="cp_size must be at least 1, got 0"):
        flashcp.plan_view({})
    with pytest.warns(DeprecationWarning, match="old JSON"), \
            pytest.raises(ValueError, match="missing or bad 'shards'"):
        flashcp.plan_view({"cp_size": 2, "docs": [3], "padding": 1})
    err = flashcp.planner_pb2.PlanResponse()
    err.error.code = 3
    err.error.message = "doc_lens: empty"
    with pytest.raises(ValueError, match="carries an error .code 3.: doc_lens: empty"):
        flashcp.plan_view(err)


def test_client_options_override_the_defaults():
    # A listener that never speaks HTTP/2: the call fails when the connect
    # attempt times out, which grpc.min_reconnect_backoff_ms sets (the
    # Client's default 100 ms unless the caller's value comes first).
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        address = f"127.0.0.1:{s.getsockname()[1]}"
        client = flashcp.Client(address, timeout=20, options=CLIENT_OPTIONS)
        t = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            client.plan([5], 1)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - t >= 4.5


def test_plan_view_reads_the_old_cli_json_with_a_warning():
    new = flashcp.plan([64, 32, 16], 2, "ring")
    old = {"cp_size": 2, "docs": [64, 32, 16], "padding": 0, "strategy": "ring", "batch": 0,
           "shards": [{"doc": s.doc, "start": s.start, "len": s.len, "rank": s.rank}
                      for s in new.shards],
           "metrics": {"imbalance": new.metrics.imbalance_ratio,
                       "comm_saving": new.metrics.comm_saving_ratio,
                       "targeted_saving": new.metrics.targeted_saving_ratio}}
    with pytest.warns(DeprecationWarning, match="doc_lens"):
        assert flashcp.plan_view(json.dumps(old)) == flashcp.plan_view(new)


def test_plan_hash_is_the_same_from_the_service_the_cli_and_in_process(
        plan_bin, planner_address):
    client = flashcp.Client(planner_address, options=CLIENT_OPTIONS)
    version = native().planner_version
    # ring on [5, 3] at N = 2: core/plan_hash_test.cc's pinned hash.
    cli = subprocess.run([plan_bin, "--cp", "2", "--strategy", "ring", "5,3"],
                         capture_output=True, timeout=60, check=True, text=True).stdout
    line = json.loads(cli)
    for got in (client.plan([5, 3], 2, "ring"), flashcp.plan([5, 3], 2, "ring"),
                flashcp.response_from_json(line)):
        assert got.plan_hash == "acb8cc4eb63dfe48"
        assert got.planner_version == version
    assert line["plan_hash"] == "acb8cc4eb63dfe48"
    assert flashcp.plan_hash(line) == flashcp.plan_hash(flashcp.plan_view(line)) == \
        "acb8cc4eb63dfe48"
    # Every strategy of a data set's batches: the three agree, the hash
    # computed from the plan's fields is the one carried, and plans with other
    # shards hash apart.
    lens = [300, 5, 1, 77, 1000, 64, 2]
    seen = {}
    for strategy in STRATEGIES:
        remote = client.plan(lens, 4, strategy)
        local = flashcp.plan(lens, 4, strategy)
        assert remote.plan_hash == local.plan_hash == flashcp.plan_hash(local), strategy
        assert len(remote.plan_hash) == 16 and int(remote.plan_hash, 16) >= 0
        seen.setdefault(tuple(flashcp.plan_view(local).shards), set()).add(local.plan_hash)
    assert all(len(h) == 1 for h in seen.values())
    assert len({h for hs in seen.values() for h in hs}) == len(seen) > 3
    for line in _dataset(plan_bin, 2):
        assert line["plan_hash"] == flashcp.plan(line["doc_lens"], 2, line["strategy"]).plan_hash
        assert line["planner_version"] == version
