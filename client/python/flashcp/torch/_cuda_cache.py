"""The CUDA attention a process keeps across training steps.

One native CudaAttentionCache per (device, heads_q, heads_kv, head_dim,
scale), made on first use and reused by every CpContext: it owns the cuDNN
handle and the graphs, cached by shape class (direction, mask, sequences,
max lengths rounded up to a power of two; worker/graph_cache.h), at most
MAX_GRAPHS per cache, least recently used evicted first. Per CpContext (per
step) only the layout's shard tables are described (host, no CUDA call) and
copied into a torch int32 tensor; cuDNN's workspace comes per call from
torch's caching allocator (a uint8 tensor on the call's stream), so a step
of a known shape class builds no graph and calls no cudaMalloc / cudaFree.
graph_stats() reads the caches' counters (a GPU test asserts that the
second step of a shape class built no graph), and where prometheus_client
is installed they are metrics of its default registry (flashcp_cuda_graph_cache_*)."""
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from flashcp._native import native

# Graphs per cache: a run of one attention shape needs about four per
# (whole-shard count, prefixed-shard count, rounded lengths) class its ranks
# meet; an eviction costs one device sync and a rebuild (up to seconds).
MAX_GRAPHS = 64

_CacheKey = Tuple[str, Optional[int], int, int, int, float]
_CACHES: Dict[_CacheKey, Any] = {}
_LOCK = threading.Lock()

STAT_FIELDS = ("hits", "misses", "builds", "rejected", "evictions", "size", "capacity")


def attention_cache(device: torch.device, heads_q: int, heads_kv: int, head_dim: int,
                    scale: float) -> Any:
    """The native CudaAttentionCache of (device, shape), made on first use
    (call with `device` current: the native object binds to the current
    CUDA device)."""
    key = (device.type, device.index, int(heads_q), int(heads_kv), int(head_dim), float(scale))
    first = False
    with _LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = native().CudaAttentionCache(int(heads_q), int(heads_kv), int(head_dim),
                                                float(scale), max_graphs=MAX_GRAPHS)
            _CACHES[key] = cache
            first = len(_CACHES) == 1
    if first:
        register_metrics()
    return cache


def graph_stats(device: Optional[torch.device] = None) -> Dict[str, int]:
    """The graph counters summed over this process's caches (those of
    `device` where given): hits, misses, builds, rejected, evictions, size,
    capacity (worker/graph_cache.h's GraphCacheStats)."""
    with _LOCK:
        caches = [c for k, c in _CACHES.items()
                  if device is None or (k[0], k[1]) == (device.type, device.index)]
    total = dict.fromkeys(STAT_FIELDS, 0)
    for c in caches:
        s = c.stats
        for f in STAT_FIELDS:
            total[f] += int(s[f])
    return total


class _Collector:
    """graph_stats() as Prometheus metrics, read at each scrape:
    flashcp_cuda_graph_cache_{hits,misses,builds,rejected,evictions}_total
    (counters) and flashcp_cuda_graph_cache_{size,capacity} (gauges), this
    process's caches summed."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        s = graph_stats()
        for f in ("hits", "misses", "builds", "rejected", "evictions"):
            yield CounterMetricFamily(f"flashcp_cuda_graph_cache_{f}",
                                      f"cuDNN graph cache {f} (flashcp.torch's CUDA attention)",
                                      value=s[f])
        yield GaugeMetricFamily("flashcp_cuda_graph_cache_size",
                                "cuDNN graphs held by flashcp.torch's CUDA attention",
                                value=s["size"])
        yield GaugeMetricFamily("flashcp_cuda_graph_cache_capacity",
                                "cuDNN graphs flashcp.torch's CUDA attention may hold",
                                value=s["capacity"])


_REGISTERED = False


def register_metrics(registry: Any = None) -> bool:
    """Adds the graph cache's metrics to `registry` (prometheus_client's
    default one where None; done once for it on the first cache). False
    where prometheus_client is not installed."""
    global _REGISTERED
    try:
        import prometheus_client
    except ImportError:
        return False
    if registry is None:
        if _REGISTERED:
            return True
        _REGISTERED = True
        registry = prometheus_client.REGISTRY
    registry.register(_Collector())
    return True


def clear() -> None:
    """Drops every cache (their graphs and handles go with the last
    reference); for tests and for freeing a device."""
    with _LOCK:
        _CACHES.clear()


def _workspace(device: torch.device, stream: int) -> Callable[[int], torch.Tensor]:
    """The allocator of one call's cuDNN workspace: a uint8 tensor from
    torch's caching allocator, made on `stream` (a cudaStream_t as an int),
    so that once the call has enqueued its work and the tensor is dropped,
    torch reuses the block only for later work on that stream."""
    if device.type != "cuda":  # a test double's device
        return lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device)

    def alloc(nbytes: int) -> torch.Tensor:
        if torch.cuda.current_stream(device).cuda_stream == stream:
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
        with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device)):
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
    return alloc


class CachedShardKernel:
    """One CpContext's layout on its device's long-lived cache, with the
    native CudaAttention's interface (forward, backward, stage_rows,
    fallback_reason), so _CudaCpAttention runs either unchanged."""

    def __init__(self, cache: Any, layout: Any, device: torch.device):
        self.cache = cache
        self.device = device
        self.batch = cache.describe(layout)
        tables = torch.frombuffer(bytearray(self.batch.tables), dtype=torch.int32) \
            if self.batch.table_entries else torch.empty(0, dtype=torch.int32)
        if device.type == "cuda" and tables.numel():
            # Pinned and non-blocking: the copy is queued on the current
            # stream (before this step's attention), with no host sync.
            tables = tables.pin_memory().to(device, non_blocking=True)
        else:
            tables = tables.to(device)
        # The batch holds the device copy (torch's memory) from now on.
        self.batch.use_device_tables(tables)

    @property
    def stage_rows(self) -> int:
        return self.batch.stage_rows

    @property
    def fallback_reason(self) -> str:
        return self.cache.fallback_reason

    def forward(self, q, k, v, ks, vs, o, lse, stream: int, groups: int) -> None:
        self.cache.forward(self.batch, q, k, v, ks, vs, o, lse, stream, groups,
                           _workspace(self.device, stream))

    def backward(self, q, k, v, ks, vs, o, lse, dout, dq, dk, dv, dks, dvs, stream: int,
                 groups: int) -> None:
        self.cache.backward(self.batch, q, k, v, ks, vs, o, lse, dout, dq, dk, dv, dks, dvs,
                            stream, groups, _workspace(self.device, stream))


def shard_kernel(layout: Any, heads_q: int, heads_kv: int, head_dim: int, scale: float,
                 device: torch.device) -> CachedShardKernel:
    """This layout (a native RankLayout under the causal mask; under
    all_to_all its head-parallel rows, heads this position's) on the
    device's cache for the shape."""
    return CachedShardKernel(attention_cache(device, heads_q, heads_kv, head_dim, scale), layout,
                             device)
