"""A thin wrapper over the generated flashcp.v1 stubs.

Fork safety: a gRPC channel belongs to the process that made it (its I/O
threads do not survive fork()). A Client therefore creates its channel lazily
in each process: after a fork (a DataLoader worker, multiprocessing), the
first call in the child notices the new pid and makes a fresh channel; the
inherited one is dropped unused, never closed from the child.
"""
import collections
import os
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple

import grpc

from flashcp_client._gen.flashcp.v1 import planner_pb2, planner_pb2_grpc

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


def _reset_after_fork() -> None:
    for client in list(_clients):
        client._forget_channel()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class Client:
    """A connection to one planner. Thread-safe; usable across fork().

    target: "host:port" (or any gRPC target). timeout: default deadline per
    call, seconds. options: extra gRPC channel options. credentials: a
    grpc.ChannelCredentials for TLS; None for plaintext.
    """

    def __init__(self, target: str, *, timeout: float = 30.0,
                 options: Sequence[Tuple[str, Any]] = (),
                 credentials: Optional[grpc.ChannelCredentials] = None):
        self._target = target
        self._timeout = timeout
        # The caller's options first: gRPC takes a repeated argument's first value.
        self._options = list(options) + list(_DEFAULT_CHANNEL_OPTIONS)
        self._credentials = credentials
        self._lock = threading.Lock()
        self._pid: Optional[int] = None
        self._channel: Optional[grpc.Channel] = None
        self._stub: Optional[planner_pb2_grpc.PlannerStub] = None
        _clients.add(self)

    # -- channel per process -------------------------------------------------
    def _forget_channel(self) -> None:
        # In a forked child: the parent's channel and lock are not ours.
        self._lock = threading.Lock()
        self._pid = None
        self._channel = None
        self._stub = None

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

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls -----------------------------------------------------------------
    @staticmethod
    def request(doc_lens: Iterable[int], cp_size: int, strategy: str = "", *,
                target_imbalance: float = 0.0, heads: int = 0, head_dim: int = 0,
                dtype_bytes: int = 0, include_layout: bool = False,
                batch_id: int = 0, min_shard_tokens: int = 0) -> planner_pb2.PlanRequest:
        """A PlanRequest; zero values mean the server's defaults (planner.proto).
        min_shard_tokens: flashcp's minimum cut shard, tokens; -1 turns it off."""
        return planner_pb2.PlanRequest(
            batch_id=batch_id, doc_lens=[int(n) for n in doc_lens], cp_size=cp_size,
            strategy=strategy, target_imbalance=target_imbalance, heads=heads,
            head_dim=head_dim, dtype_bytes=dtype_bytes, include_layout=include_layout,
            min_shard_tokens=min_shard_tokens)

    def plan(self, doc_lens: Iterable[int], cp_size: int, strategy: str = "", *,
             timeout: Optional[float] = None, **fields: Any) -> planner_pb2.PlanResponse:
        """Plans one batch; raises grpc.RpcError with the server's code on failure."""
        req = self.request(doc_lens, cp_size, strategy, **fields)
        return self._get_stub().Plan(req, timeout=self._deadline(timeout))

    def plan_async(self, doc_lens: Iterable[int], cp_size: int, strategy: str = "", *,
                   timeout: Optional[float] = None, **fields: Any) -> grpc.Future:
        """As plan(), returning a grpc.Future: .result() gives the PlanResponse
        or raises grpc.RpcError; .add_done_callback(), .cancel() work too."""
        req = self.request(doc_lens, cp_size, strategy, **fields)
        return self._get_stub().Plan.future(req, timeout=self._deadline(timeout))

    def list_strategies(self, *, timeout: Optional[float] = None) -> list:
        resp = self._get_stub().ListStrategies(planner_pb2.ListStrategiesRequest(),
                                               timeout=self._deadline(timeout))
        return list(resp.strategies)

    def server_info(self, *, timeout: Optional[float] = None) -> planner_pb2.ServerInfo:
        return self._get_stub().GetServerInfo(planner_pb2.GetServerInfoRequest(),
                                              timeout=self._deadline(timeout))

    def _deadline(self, timeout: Optional[float]) -> float:
        return self._timeout if timeout is None else timeout


class Prefetcher:
    """Plans the batches of an iterable ahead of the consumer.

    Iterating yields (item, plan) in the input's order while the plans of the
    next `depth` items are already in flight, so a training loop finds each
    plan ready. `doc_lens(item)` gives an item's document lengths (default: the
    item itself). The first failed plan raises its grpc.RpcError; closing the
    iterator early cancels what is still in flight.
    """

    def __init__(self, client: Client, items: Iterable[Any], cp_size: int,
                 strategy: str = "", *, depth: int = 4,
                 doc_lens: Callable[[Any], Iterable[int]] = lambda item: item,
                 timeout: Optional[float] = None, **fields: Any):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._client = client
        self._items = items
        self._cp_size = cp_size
        self._strategy = strategy
        self._depth = depth
        self._doc_lens = doc_lens
        self._timeout = timeout
        self._fields = fields

    def __iter__(self) -> Iterator[Tuple[Any, planner_pb2.PlanResponse]]:
        items = iter(self._items)
        window: "collections.deque[Tuple[Any, grpc.Future]]" = collections.deque()
        next_id = 0

        def fill() -> None:
            nonlocal next_id
            while len(window) < self._depth:
                try:
                    item = next(items)
                except StopIteration:
                    return
                fut = self._client.plan_async(self._doc_lens(item), self._cp_size,
                                              self._strategy, timeout=self._timeout,
                                              batch_id=next_id, **self._fields)
                next_id += 1
                window.append((item, fut))

        try:
            fill()
            while window:
                item, fut = window.popleft()
                fill()  # keep `depth` in flight while the caller works on this one
                yield item, fut.result()
        finally:
            for _, fut in window:
                fut.cancel()
