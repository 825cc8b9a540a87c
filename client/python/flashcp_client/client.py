"""A thin wrapper over the generated flashcp.v1 stubs.

Fork safety: a gRPC channel belongs to the process that made it (its I/O
threads do not survive fork()). A Client therefore creates its channel lazily
in each process: after a fork (a DataLoader worker, multiprocessing), the
first call in the child notices the new pid and makes a fresh channel; the
inherited one is dropped unused, never closed from the child.
"""
import collections
import collections.abc
import dataclasses
import itertools
import logging
import operator
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import grpc

from flashcp_client._gen.flashcp.v1 import (global_batch_pb2, global_batch_pb2_grpc,
                                            plan_many_pb2, plan_many_pb2_grpc, planner_pb2,
                                            planner_pb2_grpc)

# Reconnect quickly once a server comes (back) up: gRPC's own backoff grows to
# 120 s. Plans of large batches exceed gRPC's 4 MiB default message size.
_DEFAULT_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Retries of UNAVAILABLE (planner not up yet, restarting, connection lost),
    as client/retrying_planner_client.h's RetryPolicy: the same fields, defaults
    and backoff. Other codes come back at once: INVALID_ARGUMENT will not change
    on retry, RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED are the caller's to judge.

    max_attempts: attempts, the first included (>= 1). Backoff before attempt
    k + 1: min(initial_backoff * backoff_multiplier ** (k - 1), max_backoff),
    seconds. total_timeout: seconds for all attempts and waits together; no
    attempt starts after it, each attempt's deadline is cut to what remains.
    The defaults (C++'s) wait 0.75 s in all between attempts; a training
    loop's Prefetcher defaults to PREFETCH_RETRY, which rides out a planner
    restart.
    """
    max_attempts: int = 5
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    backoff_multiplier: float = 2.0
    total_timeout: float = 60.0

    def __post_init__(self):
        # Comparisons written so that NaN fails them too.
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            try:
                operator.index(self.max_attempts)
            except TypeError:
                raise ValueError("RetryPolicy.max_attempts must be an integer, got "
                                 f"{self.max_attempts!r}") from None
        if not self.max_attempts >= 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if not self.backoff_multiplier >= 1:
            raise ValueError("RetryPolicy.backoff_multiplier must be >= 1, got "
                             f"{self.backoff_multiplier}")
        for name in ("initial_backoff", "max_backoff", "total_timeout"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"RetryPolicy.{name} must be >= 0 seconds, got "
                                 f"{getattr(self, name)}")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (>= 1)."""
        return min(self.initial_backoff * self.backoff_multiplier ** (attempt - 1),
                   self.max_backoff)


# One attempt only: Client(..., retry=NO_RETRY).
NO_RETRY = RetryPolicy(max_attempts=1)
# The Prefetcher's default: 12 attempts, 13.15 s of waits between them (0.05 s
# doubling to 2 s), as flashcp-worker's plan feed keeps reconnecting for its
# --timeout_s: a planner restart or a rolling update stalls training, it does
# not end it.
PREFETCH_RETRY = RetryPolicy(max_attempts=12)


class _FinishedCallError(grpc.RpcError, grpc.Call):
    """A grpc.RpcError for a call that has ended, wrapping the grpc.RpcError
    `_inner()` gives: grpc.Call's methods beyond code() and details(), the
    metadata from that error where it has them."""

    def _inner(self) -> BaseException:
        raise NotImplementedError

    def initial_metadata(self):
        return getattr(self._inner(), "initial_metadata", lambda: None)()

    def trailing_metadata(self):
        return getattr(self._inner(), "trailing_metadata", lambda: None)()

    def is_active(self) -> bool:
        return False

    def time_remaining(self):
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:
        return False


class RetriesExhausted(_FinishedCallError):
    """The last attempt's error, its code kept, saying how many attempts were
    made: code() and details() as a grpc.RpcError's; `last` is that attempt's
    grpc.RpcError, `attempts` the count."""

    def __init__(self, last: grpc.RpcError, attempts: int):
        super().__init__(f"after {attempts} attempts: {_code(last).name}: {_details(last)}")
        self.last = last
        self.attempts = attempts

    def code(self) -> grpc.StatusCode:
        return _code(self.last)

    def details(self) -> str:
        return f"after {self.attempts} attempts: {_details(self.last)}"

    def _inner(self) -> BaseException:
        return self.last


def _code(err: BaseException) -> Optional[grpc.StatusCode]:
    return err.code() if callable(getattr(err, "code", None)) else None


def _details(err: BaseException) -> str:
    return err.details() if callable(getattr(err, "details", None)) else str(err)


def _retryable(err: BaseException) -> bool:
    return isinstance(err, grpc.RpcError) and _code(err) == grpc.StatusCode.UNAVAILABLE


def _int_arg(name: str, v: Any) -> int:
    """v as an int; TypeError naming `name` for a bool (True is not 1 ranks)
    or anything that is not an integer (1.5 would otherwise become 1)."""
    if isinstance(v, bool):
        raise TypeError(f"{name}: must be an integer, got {v!r} (bool)")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name}: must be an integer, got {v!r} ({type(v).__name__})") from None


def _doc_lens(doc_lens: Iterable[int]) -> List[int]:
    """Each length as an int; TypeError naming the position for anything that
    is not an integer (100.7 would otherwise be truncated to 100, and 100.0 is
    refused too: a float length is a caller's bug, not a length). A mapping,
    set or string is refused whole: its iteration order or items are not a
    packing order of lengths (a dict would give its keys)."""
    if isinstance(doc_lens, (collections.abc.Mapping, collections.abc.Set, str, bytes)):
        raise TypeError(f"doc_lens: expected a sequence of document lengths, got "
                        f"{type(doc_lens).__name__}")
    out = []
    for i, n in enumerate(doc_lens):
        if isinstance(n, bool):
            raise TypeError(f"doc_lens[{i}]: must be an integer, got {n!r} (bool)")
        try:
            out.append(operator.index(n))
        except TypeError:
            raise TypeError(f"doc_lens[{i}]: must be an integer, got {n!r} "
                            f"({type(n).__name__})") from None
    return out


def _ignore_connectivity(state: grpc.ChannelConnectivity) -> None:
    """The reconnect subscription's callback: the subscription's polling is
    what matters (Client._keep_reconnecting)."""


class _RetryingFuture(grpc.Future):
    """plan_async's future under a RetryPolicy: each attempt is a gRPC future;
    an UNAVAILABLE one schedules the next on a timer thread after the backoff.
    result()/exception() give the final outcome (RetriesExhausted when the
    policy gave up on UNAVAILABLE)."""

    def __init__(self, start: Callable[[float], grpc.Future], timeout: float,
                 policy: RetryPolicy, keep_reconnecting: Callable[[], None]):
        self._start = start
        self._keep_reconnecting = keep_reconnecting
        self._timeout = timeout
        self._policy = policy
        self._deadline = time.monotonic() + policy.total_timeout
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._callbacks: list = []
        self._attempt = 0
        self._current: Optional[grpc.Future] = None
        self._timer: Optional[threading.Timer] = None
        self._cancelled = False
        self._result = None
        self._error: Optional[BaseException] = None
        self._launch()

    def _launch(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._attempt += 1
            timeout = min(self._timeout, max(0.0, self._deadline - time.monotonic()))
            fut = self._start(timeout)
            self._current = fut
        fut.add_done_callback(self._on_attempt)

    def _on_attempt(self, fut: grpc.Future) -> None:
        if fut.cancelled():
            return  # cancel() finished this future
        err = fut.exception()
        if err is None:
            self._finish(fut.result(), None)
            return
        if not _retryable(err):
            self._finish(None, err)
            return
        backoff = self._policy.backoff(self._attempt)
        if (self._attempt >= self._policy.max_attempts
                or time.monotonic() + backoff >= self._deadline):
            self._finish(None, RetriesExhausted(err, self._attempt))
            return
        with self._lock:
            if self._cancelled:
                return
            self._keep_reconnecting()
            self._timer = threading.Timer(backoff, self._launch)
            self._timer.daemon = True
            self._timer.start()

    def _finish(self, result, error) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._result, self._error = result, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    # -- grpc.Future ------------------------------------------------------------
    def cancel(self) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            self._cancelled = True
            if self._timer is not None:
                self._timer.cancel()
            current = self._current
        if current is not None:
            current.cancel()
        self._finish(None, grpc.FutureCancelledError())
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def running(self) -> bool:
        return not self._done.is_set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: Optional[float] = None):
        if not self._done.wait(timeout):
            raise grpc.FutureTimeoutError()
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout: Optional[float] = None):
        if not self._done.wait(timeout):
            raise grpc.FutureTimeoutError()
        return self._error

    def traceback(self, timeout: Optional[float] = None):
        err = self.exception(timeout)
        return None if err is None else err.__traceback__

    def add_done_callback(self, fn) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    @property
    def attempts(self) -> int:
        """Attempts started so far."""
        return self._attempt


def _reset_after_fork() -> None:
    for client in list(_clients):
        client._forget_channel()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class Client:
    """A connection to one planner. Thread-safe; usable across fork().

    target: "host:port" (or any gRPC target). timeout: default deadline per
    call, seconds. options: extra gRPC channel options. credentials: a
    grpc.ChannelCredentials for TLS; None for plaintext. retry: the
    RetryPolicy of every call (plan, plan_async, list_strategies,
    server_info); NO_RETRY for a single attempt. wait_for_ready: every call,
    the first attempt included, waits (within its deadline) for the channel
    to connect rather than failing UNAVAILABLE at once.
    """

    def __init__(self, target: str, *, timeout: float = 30.0,
                 options: Sequence[Tuple[str, Any]] = (),
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 retry: RetryPolicy = RetryPolicy(), wait_for_ready: bool = False):
        if not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(retry).__name__}")
        self._target = target
        self._timeout = timeout
        self._retry = retry
        self._wait_for_ready = wait_for_ready
        # The caller's options first: gRPC takes a repeated argument's first value.
        self._options = list(options) + list(_DEFAULT_CHANNEL_OPTIONS)
        self._credentials = credentials
        self._lock = threading.Lock()
        self._pid: Optional[int] = None
        self._channel: Optional[grpc.Channel] = None
        self._stub: Optional[planner_pb2_grpc.PlannerStub] = None
        self._subscribed = False  # _keep_reconnecting's subscription, on self._channel
        _clients.add(self)

    # -- channel per process -------------------------------------------------
    def _forget_channel(self) -> None:
        # In a forked child: the parent's channel and lock are not ours.
        self._lock = threading.Lock()
        self._pid = None
        self._channel = None
        self._stub = None
        self._subscribed = False

    def _get_stub(self) -> planner_pb2_grpc.PlannerStub:
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    if self._credentials is None:
                        channel = grpc.insecure_channel(self._target, options=self._options)
                    else:
                        channel = grpc.secure_channel(self._target, self._credentials,
                                                      options=self._options)
                    self._channel = channel
                    self._stub = planner_pb2_grpc.PlannerStub(channel)
                    self._pid = pid
        assert self._stub is not None
        return self._stub

    @property
    def retry(self) -> RetryPolicy:
        return self._retry

    def wait_for_ready(self, timeout: Optional[float] = None) -> None:
        """Blocks until the channel to the planner is connected (READY), up to
        `timeout` seconds (the client's default timeout when None). Raises
        grpc.FutureTimeoutError naming the target if it is not by then."""
        timeout = self._deadline(timeout)
        self._get_stub()
        ready = grpc.channel_ready_future(self._channel)
        try:
            ready.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            ready.cancel()
            raise grpc.FutureTimeoutError(
                f"planner {self._target} not reachable within {timeout} s") from None

    @property
    def channel_pid(self) -> Optional[int]:
        """The pid that made the current channel (None before the first call)."""
        return self._pid

    def close(self) -> None:
        with self._lock:
            if self._channel is not None and self._pid == os.getpid():
                self._channel.close()
            self._channel = None
            self._stub = None
            self._pid = None
            self._subscribed = False

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls -----------------------------------------------------------------
    @staticmethod
    def request(doc_lens: Iterable[int], cp_size: int, strategy: str = "", *,
                target_imbalance: float = 0.0, heads: int = 0, head_dim: int = 0,
                dtype_bytes: int = 0, include_layout: bool = False,
                batch_id: int = 0, min_shard_tokens: int = 0, ranks_per_node: int = 0,
                cost_profile: str = "", cost: Any = None,
                rank_speed: Iterable[float] = ()) -> planner_pb2.PlanRequest:
        """A PlanRequest; zero values mean the server's defaults (planner.proto).
        min_shard_tokens: flashcp's minimum cut shard, tokens; -1 turns it off.
        ranks_per_node: ranks per node (0: one node). cost_profile: a named
        rank cost ("h200-cudnn", "cpu-fp32", a calibrated one), or cost: the
        coefficients, a planner_pb2.CostCoefficients or a dict of its fields
        (not both; None: no coefficients). rank_speed: one speed per rank."""
        if isinstance(cost, dict):
            cost = planner_pb2.CostCoefficients(**cost)  # ValueError naming an unknown field
        return planner_pb2.PlanRequest(
            batch_id=_int_arg("batch_id", batch_id), doc_lens=_doc_lens(doc_lens),
            cp_size=_int_arg("cp_size", cp_size),
            strategy=strategy, target_imbalance=target_imbalance,
            heads=_int_arg("heads", heads), head_dim=_int_arg("head_dim", head_dim),
            dtype_bytes=_int_arg("dtype_bytes", dtype_bytes), include_layout=include_layout,
            min_shard_tokens=_int_arg("min_shard_tokens", min_shard_tokens),
            ranks_per_node=_int_arg("ranks_per_node", ranks_per_node),
            cost_profile=cost_profile, cost=cost, rank_speed=rank_speed)

    def plan(self, doc_lens: Iterable[int], cp_size: int, strategy: str = "", *,
             timeout: Optional[float] = None, **fields: Any) -> planner_pb2.PlanResponse:
        """Plans one batch, retrying UNAVAILABLE under the client's RetryPolicy;
        raises grpc.RpcError with the server's code on failure (RetriesExhausted,
        code UNAVAILABLE, when the retries ran out)."""
        req = self.request(doc_lens, cp_size, strategy, **fields)
        return self._call(lambda t, ready: self._get_stub().Plan(
            req, timeout=t, wait_for_ready=ready), timeout)

    def plan_async(self, doc_lens: Iterable[int], cp_size: int, strategy: str = "", *,
                   timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None,
                   **fields: Any) -> grpc.Future:
        """As plan(), returning a grpc.Future: .result() gives the PlanResponse
        or raises grpc.RpcError; .add_done_callback(), .cancel() work too.
        Retries (UNAVAILABLE) run on a timer thread; the future ends with the
        final outcome. retry: this call's RetryPolicy (default: the client's)."""
        req = self.request(doc_lens, cp_size, strategy, **fields)
        return _RetryingFuture(
            lambda t: self._get_stub().Plan.future(
                req, timeout=t, wait_for_ready=self._wait_for_ready),
            self._deadline(timeout), self._retry if retry is None else retry,
            self._keep_reconnecting)

    def report_step_times(self, cost_profile: str, steps: Iterable[planner_pb2.StepTimes], *,
                          timeout: Optional[float] = None
                          ) -> planner_pb2.ReportStepTimesResponse:
        """ReportStepTimes: measured per-rank attention times of steps run on
        plans of `cost_profile` (not "pairs"), each a StepTimes with one
        RankStepTime per rank (flashcp.torch.step_times builds them). The
        planner fits the profile online (docs/planner.md, "Calibration");
        raises grpc.RpcError (INVALID_ARGUMENT naming the field, NOT_FOUND
        for an unknown profile) as plan() does."""
        req = planner_pb2.ReportStepTimesRequest(cost_profile=cost_profile, steps=list(steps))
        return self._call(lambda t, ready: self._get_stub().ReportStepTimes(
            req, timeout=t, wait_for_ready=ready), timeout)

    def plan_global_batch(self, doc_lens: Iterable[int], dp_size: int, cp_size: int,
                          context: int, strategy: str = "", *, timeout: Optional[float] = None,
                          batch_id: int = 0, **fields: Any) -> global_batch_pb2.GlobalBatchPlan:
        """PlanGlobalBatch: which of the global batch's documents each of
        dp_size replicas packs (at most `context` tokens each; a longer
        document cut into context-sized pieces), balancing the replicas'
        attention work, and each replica's CP plan over cp_size ranks with
        `strategy` and `fields` (request()'s: heads, ranks_per_node, cost ...).
        Retries UNAVAILABLE as plan() does; raises grpc.RpcError with the
        server's code (INVALID_ARGUMENT naming the field, "plan.<field>" for
        the replicas' options; FAILED_PRECONDITION naming doc_lens where the
        documents do not fit whole)."""
        req = global_batch_pb2.PlanGlobalBatchRequest(
            batch_id=_int_arg("batch_id", batch_id), doc_lens=_doc_lens(doc_lens),
            dp_size=_int_arg("dp_size", dp_size), context=_int_arg("context", context),
            plan=self.request((), cp_size, strategy, **fields))
        return self._call(lambda t, ready: self._global_batch_stub().PlanGlobalBatch(
            req, timeout=t, wait_for_ready=ready), timeout)

    def _global_batch_stub(self) -> global_batch_pb2_grpc.GlobalBatchPlannerStub:
        self._get_stub()  # this process's channel
        return global_batch_pb2_grpc.GlobalBatchPlannerStub(self._channel)

    def plan_many(self, requests: Iterable[planner_pb2.PlanRequest], *,
                  timeout: Optional[float] = None) -> List[planner_pb2.PlanResponse]:
        """PlanMany: several PlanRequests (request()'s, 1 to 256) in one call,
        planned in order on one planning thread, so that the call's fixed cost
        is paid once (docs/planner.md, "Several plans per call"). Returns one
        PlanResponse per request, in order: its plan, or its `error` set (code
        and message as plan() would raise them; the other items are planned).
        Retries UNAVAILABLE as plan() does; raises grpc.RpcError for the call's
        own errors (INVALID_ARGUMENT for no requests, RESOURCE_EXHAUSTED for
        more than 256 or a full planning queue)."""
        req = plan_many_pb2.PlanManyRequest(requests=list(requests))
        resp = self._call(lambda t, ready: self._many_stub().PlanMany(
            req, timeout=t, wait_for_ready=ready), timeout)
        return list(resp.responses)

    def plan_many_async(self, requests: Iterable[planner_pb2.PlanRequest], *,
                        timeout: Optional[float] = None,
                        retry: Optional[RetryPolicy] = None) -> grpc.Future:
        """As plan_many(), returning a grpc.Future whose .result() is the
        PlanManyResponse (.responses, one per request, in order) or raises
        grpc.RpcError; retries as plan_async() does."""
        req = plan_many_pb2.PlanManyRequest(requests=list(requests))
        return _RetryingFuture(
            lambda t: self._many_stub().PlanMany.future(
                req, timeout=t, wait_for_ready=self._wait_for_ready),
            self._deadline(timeout), self._retry if retry is None else retry,
            self._keep_reconnecting)

    def _many_stub(self) -> plan_many_pb2_grpc.ManyPlannerStub:
        self._get_stub()  # this process's channel
        return plan_many_pb2_grpc.ManyPlannerStub(self._channel)

    def list_strategies(self, *, timeout: Optional[float] = None) -> list:
        resp = self._call(lambda t, ready: self._get_stub().ListStrategies(
            planner_pb2.ListStrategiesRequest(), timeout=t, wait_for_ready=ready), timeout)
        return list(resp.strategies)

    def server_info(self, *, timeout: Optional[float] = None) -> planner_pb2.ServerInfo:
        return self._call(lambda t, ready: self._get_stub().GetServerInfo(
            planner_pb2.GetServerInfoRequest(), timeout=t, wait_for_ready=ready), timeout)

    def _deadline(self, timeout: Optional[float]) -> float:
        return self._timeout if timeout is None else timeout

    def _keep_reconnecting(self) -> None:
        """From a call's first retry on, keeps the channel polled, so that it
        reconnects as soon as the planner is back: with no call in flight, a
        failed gRPC channel retries its connection only from gRPC's backup
        poller, every 5 s (measured: a 0.12 s planner restart stalled a
        Prefetcher 5.1 s). One connectivity subscription per channel, until
        close() (unsubscribing and subscribing again races gRPC's polling
        thread against close())."""
        self._get_stub()
        with self._lock:
            if not self._subscribed:
                self._channel.subscribe(_ignore_connectivity, try_to_connect=True)
                self._subscribed = True

    def _call(self, attempt: Callable[[float, bool], Any], timeout: Optional[float]) -> Any:
        """attempt(timeout_s, wait_for_ready) under the RetryPolicy, in this thread."""
        policy = self._retry
        per_call = self._deadline(timeout)
        deadline = time.monotonic() + policy.total_timeout
        for n in range(1, policy.max_attempts + 1):
            try:
                return attempt(min(per_call, max(0.0, deadline - time.monotonic())),
                               self._wait_for_ready)
            except grpc.RpcError as err:
                if not _retryable(err):
                    raise
                backoff = policy.backoff(n)
                if n >= policy.max_attempts or time.monotonic() + backoff >= deadline:
                    raise RetriesExhausted(err, n) from err
                self._keep_reconnecting()
                time.sleep(backoff)  # the policy's backoff between attempts
        raise AssertionError("unreachable: the loop returns or raises")


class ItemError(_FinishedCallError):
    """One item's error in a PlanMany answer (PlanResponse.error) as the
    grpc.RpcError plan() would have raised: code() and details()."""

    def __init__(self, error: planner_pb2.Error):
        self._code = _STATUS_BY_NUMBER.get(error.code, grpc.StatusCode.UNKNOWN)
        self._details = error.message
        super().__init__(f"{self._code.name}: {error.message}")

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def _inner(self) -> BaseException:
        return self


_STATUS_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


class PrefetchError(_FinishedCallError):
    """A Prefetcher's plan that failed for good: which item (its 0-based
    position in the input and the batch_id its request carried) and why.
    code() and details() are the failed call's (a RetriesExhausted when the
    retries on UNAVAILABLE ran out); `cause` is that grpc.RpcError."""

    def __init__(self, position: int, batch_id: int, cause: grpc.RpcError):
        self.position = position
        self.batch_id = batch_id
        self.cause = cause
        super().__init__(f"plan of item {position} (batch_id {batch_id}) failed: "
                         f"{_code(cause).name if _code(cause) else 'error'}: {_details(cause)}")

    def code(self) -> Optional[grpc.StatusCode]:
        return _code(self.cause)

    def details(self) -> str:
        return f"item {self.position} (batch_id {self.batch_id}): {_details(self.cause)}"

    def _inner(self) -> BaseException:
        return self.cause


class Prefetcher:
    """Plans the batches of an iterable ahead of the consumer.

    Iterating yields (item, plan) in the input's order while the plans of the
    next `depth` items are already in flight, so a training loop finds each
    plan ready. `doc_lens(item)` gives an item's document lengths (default: the
    item itself). Item k's request carries batch_id first_batch_id + k. Each
    plan retries UNAVAILABLE under `retry` (default PREFETCH_RETRY), so a
    planner restart is ridden out; the first plan that fails for good raises
    PrefetchError naming the item's position and batch_id (a grpc.RpcError
    with the call's code). Closing the iterator early cancels what is still in
    flight.

    plans_per_call: items planned per call. 1 (default): one Plan call per
    item. k > 1: k consecutive items go out in one PlanMany call
    (Client.plan_many_async), which pays the service's fixed cost per call
    once for k plans (docs/planner.md, "Several plans per call"); whenever
    fewer than `depth` items are in flight the next k are sent, so up to
    depth + k - 1 are. An item's own error raises PrefetchError as a failed
    Plan call would, with the same code.

    fallback: a planner to use in this process when the service is
    unreachable, called as fallback(doc_lens, cp_size, strategy,
    batch_id=..., **fields) (flashcp.plan fits). An item whose plan fails
    UNAVAILABLE or DEADLINE_EXCEEDED is then planned by it instead of
    raising; the default retry becomes NO_RETRY (one attempt: a planner that
    is down costs one refused connection per item, not the retries'
    backoff). Each such plan counts in `fallback_plans` (and in the counter
    flashcp_prefetch_fallback_plans_total{planner=...} where prometheus_client
    is installed); the first of a run, and the service answering again, are
    logged (logger "flashcp_client", WARNING and INFO). Where the ranks of a
    group each run a Prefetcher, one falling back may hold another plan than
    the rest (a planner of another version): flashcp.torch.CpContext refuses
    that step on every rank; planning on one rank
    (flashcp.torch.plan_on_first_rank) avoids it.
    """

    def __init__(self, client: Client, items: Iterable[Any], cp_size: int,
                 strategy: str = "", *, depth: int = 4,
                 doc_lens: Callable[[Any], Iterable[int]] = lambda item: item,
                 timeout: Optional[float] = None, first_batch_id: int = 0,
                 retry: Optional[RetryPolicy] = None,
                 fallback: Optional[Callable[..., planner_pb2.PlanResponse]] = None,
                 plans_per_call: int = 1, **fields: Any):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if not 1 <= operator.index(plans_per_call) <= 256:
            raise ValueError(f"plans_per_call must be in [1, 256], got {plans_per_call}")
        self._plans_per_call = operator.index(plans_per_call)
        if "batch_id" in fields:
            raise TypeError("Prefetcher sets each request's batch_id; pass first_batch_id")
        if fallback is not None and not callable(fallback):
            raise TypeError(f"fallback must be callable (e.g. flashcp.plan), got "
                            f"{type(fallback).__name__}")
        self._fallback = fallback
        self.fallback_plans = 0  # items planned by `fallback`, over every iteration
        self._falling_back = False
        self._client = client
        self._items = items
        self._cp_size = cp_size
        self._strategy = strategy
        self._depth = depth
        self._doc_lens = doc_lens
        self._timeout = timeout
        self._first_batch_id = operator.index(first_batch_id)
        self._retry = retry
        self._fields = fields

    def __iter__(self) -> Iterator[Tuple[Any, planner_pb2.PlanResponse]]:
        items = iter(self._items)
        # (position, item, future, index): index None for a Plan call's
        # future, else the item's place in its PlanMany call's answer.
        window: "collections.deque[Tuple[int, Any, grpc.Future, Optional[int]]]" = (
            collections.deque())
        position = 0

        def fill() -> None:
            nonlocal position
            while len(window) < self._depth:
                group = list(itertools.islice(items, self._plans_per_call))
                if not group:
                    return
                default_retry = PREFETCH_RETRY if self._fallback is None else NO_RETRY
                retry = self._retry or default_retry
                if self._plans_per_call == 1:
                    fut = self._client.plan_async(self._doc_lens(group[0]), self._cp_size,
                                                  self._strategy, timeout=self._timeout,
                                                  retry=retry,
                                                  batch_id=self._first_batch_id + position,
                                                  **self._fields)
                    window.append((position, group[0], fut, None))
                    position += 1
                    continue
                requests = [Client.request(self._doc_lens(item), self._cp_size, self._strategy,
                                           batch_id=self._first_batch_id + position + i,
                                           **self._fields) for i, item in enumerate(group)]
                fut = self._client.plan_many_async(requests, timeout=self._timeout, retry=retry)
                for i, item in enumerate(group):
                    window.append((position + i, item, fut, i))
                position += len(group)

        try:
            fill()
            while window:
                pos, item, fut, index = window.popleft()
                fill()  # keep `depth` in flight while the caller works on this one
                try:
                    plan = fut.result()
                    if index is not None:
                        plan = plan.responses[index]
                        if plan.HasField("error"):
                            raise ItemError(plan.error)
                except grpc.RpcError as err:
                    if self._fallback is None or _code(err) not in _UNREACHABLE:
                        raise PrefetchError(pos, self._first_batch_id + pos, err) from err
                    plan = self._plan_here(item, self._first_batch_id + pos, err)
                else:
                    if self._falling_back:
                        self._falling_back = False
                        _log.info("planner %s answers again from batch_id %d (%d plans made "
                                  "in process so far)", self._client._target,
                                  self._first_batch_id + pos, self.fallback_plans)
                yield item, plan
        finally:
            for _, _, fut, _ in window:
                fut.cancel()

    def _plan_here(self, item: Any, batch_id: int,
                   err: grpc.RpcError) -> planner_pb2.PlanResponse:
        """The fallback's plan of `item`, counted and (on the first of a run) logged."""
        if not self._falling_back:
            self._falling_back = True
            _log.warning("planner %s unreachable (%s: %s): planning in this process from "
                         "batch_id %d", self._client._target, _code(err).name, _details(err),
                         batch_id)
        plan = self._fallback(self._doc_lens(item), self._cp_size, self._strategy,
                              batch_id=batch_id, **self._fields)
        self.fallback_plans += 1
        _fallback_counter(self._client._target)
        return plan


# A Prefetcher falls back on these codes: the service cannot be reached or
# does not answer in time; the others are answers about the request.
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

_log = logging.getLogger("flashcp_client")

_counter_lock = threading.Lock()
_counter: Any = None  # prometheus_client.Counter, made on first use; False: not installed


def _fallback_counter(target: str) -> None:
    """Adds one to flashcp_prefetch_fallback_plans_total{planner=target} in
    prometheus_client's default registry, where prometheus_client is
    installed (the process's exporter serves it); nothing otherwise."""
    global _counter
    with _counter_lock:
        if _counter is None:
            try:
                import prometheus_client
            except ImportError:
                _counter = False
            else:
                _counter = prometheus_client.Counter(
                    "flashcp_prefetch_fallback_plans",
                    "Batches a Prefetcher planned in process because the planner was "
                    "unreachable", ["planner"])
        if _counter is not False:
            _counter.labels(planner=target).inc()
