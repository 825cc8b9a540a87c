"""Prefetcher(..., fallback=flashcp.plan): a real planner that stops; the
batches after it are planned in process, counted and logged."""
import logging
import sys
import types

import flashcp
import flashcp.planner_process
import flashcp_client
import flashcp_client.client as client_module
from conftest import CLIENT_OPTIONS

BATCHES = [[300, 5, 1, 77], [64, 32, 16], [1000, 24], [7, 7, 7, 7, 100], [50, 50]]


def _without_time(resp):
    resp = type(resp).FromString(resp.SerializeToString())
    resp.metrics.planning_seconds = 0.0
    return resp.SerializeToString(deterministic=True)


def _want(k, lens):
    return _without_time(flashcp.plan(lens, 2, "flashcp", batch_id=100 + k))


def test_a_planner_that_stops_mid_run_is_replaced_by_the_fallback(planner_bin, caplog):
    caplog.set_level(logging.INFO, logger="flashcp_client")
    proc, address = flashcp.planner_process.launch(planner_bin)
    client = flashcp.Client(address, options=CLIENT_OPTIONS)
    try:
        pre = flashcp.Prefetcher(client, BATCHES, 2, "flashcp", depth=1, first_batch_id=100,
                                 fallback=flashcp.plan)
        it = iter(pre)
        item, plan = next(it)  # from the service, which is up
        assert item == BATCHES[0] and pre.fallback_plans == 0
        assert _without_time(plan) == _want(0, BATCHES[0])
        flashcp.planner_process.stop(proc)
        # Batch 1 was already in flight (depth 1) and may have been answered;
        # every later one meets a stopped planner.
        rest = list(it)
    finally:
        flashcp.planner_process.stop(proc)
        client.close()
    assert [item for item, _ in rest] == BATCHES[1:]
    for k, (item, plan) in enumerate(rest, start=1):
        assert _without_time(plan) == _want(k, item), k  # the same plan either way
    assert pre.fallback_plans in (len(BATCHES) - 2, len(BATCHES) - 1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert msg.startswith(f"planner {address} unreachable (UNAVAILABLE: ")
    assert msg.endswith(f"): planning in this process from batch_id "
                        f"{100 + len(BATCHES) - pre.fallback_plans}")


def test_a_stopped_planner_plans_every_batch_in_process_and_counts(planner_bin, caplog,
                                                                  monkeypatch):
    # A stand-in prometheus_client records the counter's use (the real one is
    # not a dependency of the package).
    incs = []

    class Counter:
        def __init__(self, name, doc, labels):
            incs.append(("new", name, tuple(labels)))

        def labels(self, **kw):
            return types.SimpleNamespace(inc=lambda: incs.append(("inc", kw)))

    monkeypatch.setitem(sys.modules, "prometheus_client", types.SimpleNamespace(Counter=Counter))
    monkeypatch.setattr(client_module, "_counter", None)
    caplog.set_level(logging.INFO, logger="flashcp_client")
    with flashcp.planner_process.start(planner_bin) as address:
        pass  # started and stopped: nothing listens on its port now
    with flashcp.Client(address, options=CLIENT_OPTIONS) as client:
        pre = flashcp.Prefetcher(client, BATCHES, 2, "flashcp", depth=2, first_batch_id=100,
                                 fallback=flashcp.plan)
        got = list(pre)
    assert [item for item, _ in got] == BATCHES
    for k, (item, plan) in enumerate(got):
        assert _without_time(plan) == _want(k, item), k
        assert plan.metrics.planning_seconds > 0  # planned here, timed here
    assert pre.fallback_plans == len(BATCHES)
    assert incs == [("new", "flashcp_prefetch_fallback_plans", ("planner",))] + \
        [("inc", {"planner": address})] * len(BATCHES)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    # Without a fallback the same run fails naming the first item.
    with flashcp.Client(address, options=CLIENT_OPTIONS) as client:
        try:
            list(flashcp.Prefetcher(client, BATCHES, 2, "flashcp",
                                    retry=flashcp_client.NO_RETRY))
        except flashcp_client.PrefetchError as e:
            assert e.position == 0 and e.code().name == "UNAVAILABLE"
        else:
            raise AssertionError("no PrefetchError")
