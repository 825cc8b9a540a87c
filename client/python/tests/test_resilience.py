"""flashcp_client's resilience against the real planner: UNAVAILABLE retried
with the RetryPolicy's backoff and reported with the attempt count when the
retries run out, wait_for_ready, a Prefetcher that survives a planner killed
and restarted on the same port mid-run and names the item it gives up on,
and non-integer document lengths refused. Every wait has a deadline; the
planner's restart waits on an observed retry, not on time."""
import signal
import socket
import threading
import time

import grpc
import pytest

import flashcp.planner_process
from flashcp_client import (NO_RETRY, PREFETCH_RETRY, Client, PrefetchError, Prefetcher,
                            RetriesExhausted, RetryPolicy)

DEADLINE_S = 60.0
FAST = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02, total_timeout=30)


def free_port() -> int:
    """A loopback port free a moment ago (bound to 0, read back, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(pred, what, timeout=DEADLINE_S):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)  # poll interval, bounded by the deadline


# -- lengths -------------------------------------------------------------------
@pytest.mark.parametrize("lens, message", [
    ([100, 100.7], "doc_lens[1]: must be an integer, got 100.7 (float)"),
    ([100.0], "doc_lens[0]: must be an integer, got 100.0 (float)"),
    ([5, True], "doc_lens[1]: must be an integer, got True (bool)"),
    ([5, "7"], "doc_lens[1]: must be an integer, got '7' (str)"),
])
def test_non_integer_lengths_are_refused(planner_address, lens, message):
    with pytest.raises(TypeError) as err:
        Client.request(lens, cp_size=2)
    assert str(err.value) == message
    with Client(planner_address) as c:
        with pytest.raises(TypeError) as err:
            c.plan(lens, cp_size=2)
        assert str(err.value) == message


def test_integer_like_lengths_are_taken_exactly():
    class Length:
        def __index__(self):
            return 4097

    assert list(Client.request([4096, Length()], cp_size=2).doc_lens) == [4096, 4097]


# -- the policy ------------------------------------------------------------------
def test_backoff_is_the_cpp_formula():
    p = RetryPolicy()  # client/retrying_planner_client.h's defaults
    assert (p.max_attempts, p.initial_backoff, p.max_backoff, p.backoff_multiplier,
            p.total_timeout) == (5, 0.05, 2.0, 2.0, 60.0)
    assert [p.backoff(k) for k in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert sum(PREFETCH_RETRY.backoff(k) for k in range(1, 12)) == pytest.approx(13.15)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_attempts": 0}, "RetryPolicy.max_attempts must be >= 1, got 0"),
    ({"backoff_multiplier": 0.5}, "RetryPolicy.backoff_multiplier must be >= 1, got 0.5"),
    ({"initial_backoff": -1}, "RetryPolicy.initial_backoff must be >= 0 seconds, got -1"),
    ({"total_timeout": -2}, "RetryPolicy.total_timeout must be >= 0 seconds, got -2"),
    # NaN passed every check and failed later, at the first retry (time.sleep).
    ({"initial_backoff": float("nan")},
     "RetryPolicy.initial_backoff must be >= 0 seconds, got nan"),
    ({"total_timeout": float("nan")}, "RetryPolicy.total_timeout must be >= 0 seconds, got nan"),
    ({"backoff_multiplier": float("nan")},
     "RetryPolicy.backoff_multiplier must be >= 1, got nan"),
    ({"max_attempts": 2.5}, "RetryPolicy.max_attempts must be an integer, got 2.5"),
])
def test_bad_policies_are_refused(kwargs, message):
    with pytest.raises(ValueError) as err:
        RetryPolicy(**kwargs)
    assert str(err.value) == message


# -- unary calls -------------------------------------------------------------------
def test_unavailable_is_retried_then_reported_with_the_attempts():
    target = f"127.0.0.1:{free_port()}"  # nobody listens
    with Client(target, timeout=10, retry=FAST) as c:
        for call in (lambda: c.plan([8, 8], cp_size=2), c.list_strategies, c.server_info,
                     lambda: c.plan_async([8, 8], cp_size=2).result(timeout=DEADLINE_S)):
            with pytest.raises(RetriesExhausted) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.attempts == 3
            assert err.value.details().startswith("after 3 attempts: ")
            assert err.value.last.code() == grpc.StatusCode.UNAVAILABLE
    with Client(target, timeout=10, retry=NO_RETRY) as c:
        with pytest.raises(RetriesExhausted) as err:
            c.plan([8, 8], cp_size=2)
        assert err.value.attempts == 1


def test_other_codes_are_not_retried(planner_address):
    with Client(planner_address, timeout=30, retry=FAST) as c:
        for call in (lambda: c.plan([1, 1], cp_size=4, strategy="ring"),
                     lambda: c.plan_async([1, 1], cp_size=4, strategy="ring").result(
                         timeout=DEADLINE_S)):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert not isinstance(err.value, RetriesExhausted)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_retries_stop_at_the_total_timeout():
    target = f"127.0.0.1:{free_port()}"
    policy = RetryPolicy(max_attempts=1000, initial_backoff=0.05, max_backoff=0.05,
                         total_timeout=0.5)
    with Client(target, timeout=10, retry=policy) as c:
        start = time.monotonic()
        with pytest.raises(RetriesExhausted) as err:
            c.plan([8, 8], cp_size=2)
        elapsed = time.monotonic() - start
    assert 1 < err.value.attempts < 1000
    assert elapsed < 5  # the 0.5 s budget plus one attempt's connect failure


def test_wait_for_ready(planner_bin):
    port = free_port()
    target = f"127.0.0.1:{port}"
    with Client(target, timeout=DEADLINE_S, wait_for_ready=True) as waiting:
        with pytest.raises(grpc.FutureTimeoutError) as err:
            waiting.wait_for_ready(timeout=0.2)
        assert str(err.value) == f"planner {target} not reachable within 0.2 s"
        # A call made before the planner listens waits for it (wait_for_ready=True).
        future = waiting.plan_async([5, 3], cp_size=2, strategy="ring")
        proc, address = flashcp.planner_process.launch(planner_bin, ["--listen", target])
        try:
            assert address == target
            waiting.wait_for_ready(timeout=DEADLINE_S)
            assert future.result(timeout=DEADLINE_S).cp_size == 2
        finally:
            flashcp.planner_process.stop(proc)


# -- Prefetcher ---------------------------------------------------------------------
class RecordingClient(Client):
    """Keeps every plan_async future, to observe the Prefetcher's retries."""

    def __init__(self, target, **kwargs):
        super().__init__(target, **kwargs)
        self.futures = []

    def plan_async(self, *args, **kwargs):
        fut = super().plan_async(*args, **kwargs)
        self.futures.append(fut)
        return fut


def test_prefetcher_survives_a_planner_restart_on_the_same_port(planner_bin):
    proc, address = flashcp.planner_process.launch(planner_bin)
    items = [[64 + i, 32, 16] for i in range(40)]
    client = RecordingClient(address, timeout=30)
    killed = threading.Event()
    got, errors, arrived = [], [], []

    def consume():
        try:
            for item, plan in Prefetcher(client, items, cp_size=2, strategy="ring", depth=4,
                                         first_batch_id=500):
                got.append((plan.batch_id, list(plan.doc_lens) == item))
                arrived.append(time.monotonic())
                if len(got) == 10:
                    killed.wait(DEADLINE_S)
        except Exception as e:  # the test fails below with it
            errors.append(e)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        poll(lambda: len(got) >= 10, "10 plans before the kill")
        assert flashcp.planner_process.stop(proc, signal.SIGKILL) == -9
        kill_time = time.monotonic()
        killed.set()
        # The Prefetcher's requests now meet a dead port: wait for a retry.
        poll(lambda: any(f.attempts >= 2 for f in client.futures), "a retried plan")
        proc, again = flashcp.planner_process.launch(planner_bin, ["--listen", address])
        restarted = time.monotonic()
        assert again == address
        consumer.join(DEADLINE_S)
        assert not consumer.is_alive()
        assert errors == []
        assert got == [(500 + i, True) for i in range(40)]
        assert max(f.attempts for f in client.futures) >= 2
        stall = max(b - a for a, b in zip(arrived, arrived[1:]))
        # Retries keep the channel reconnecting: without that, gRPC's backup
        # poller (every 5 s) alone noticed the planner was back (5.1 s stalls).
        assert stall < 3.0
        print(f"longest wait between two plans: {stall:.3f} s (kill to restart "
              f"{restarted - kill_time:.3f} s); most attempts of one plan: "
              f"{max(f.attempts for f in client.futures)}")
    finally:
        killed.set()
        flashcp.planner_process.stop(proc)
        client.close()


def test_prefetcher_names_the_item_it_gives_up_on(planner_bin):
    proc, address = flashcp.planner_process.launch(planner_bin)
    items = [[64 + i, 32] for i in range(10)]
    client = RecordingClient(address, timeout=30)
    got = []
    try:
        with pytest.raises(PrefetchError) as err:
            for item, plan in Prefetcher(client, items, cp_size=2, strategy="ring", depth=1,
                                         first_batch_id=7, retry=FAST):
                got.append(plan.batch_id)
                if len(got) == 3:
                    # Item 3's plan is in flight (depth 1): let it land, then
                    # kill the planner, so that item 4's is the one that fails.
                    client.futures[3].result(timeout=DEADLINE_S)
                    flashcp.planner_process.stop(proc, signal.SIGKILL)
    finally:
        flashcp.planner_process.stop(proc)
        client.close()
    assert got == [7, 8, 9, 10]
    e = err.value
    assert (e.position, e.batch_id) == (4, 11)
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    assert isinstance(e.cause, RetriesExhausted) and e.cause.attempts == 3
    assert str(e).startswith("plan of item 4 (batch_id 11) failed: UNAVAILABLE: after 3 attempts")
    assert e.details().startswith("item 4 (batch_id 11): after 3 attempts: ")


def test_prefetcher_refuses_batch_id_in_fields(planner_address):
    with Client(planner_address) as c:
        with pytest.raises(TypeError, match="pass first_batch_id"):
            Prefetcher(c, [], cp_size=2, batch_id=3)
