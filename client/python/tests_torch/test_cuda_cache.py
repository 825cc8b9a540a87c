"""The CUDA attention kept across steps (flashcp/torch/_cuda_cache.py): one
native CudaAttentionCache per (device, shape) reused by every CpContext.

On CPU, with a test double of the native cache (the CUDA calls cannot run
here): CpContexts of different steps share one cache object, each describes
its own layout and hands its tables over, calls get a workspace allocator,
the counters sum. Marked gpu: two steps of different batches of one shape
class on the real cuDNN path build graphs on the first step only, and match
the CPU path (test_cuda.py's tolerance)."""
import math

import pytest
import torch

import cases
import flashcp
import flashcp.torch as ft
import harness
from flashcp._native import native
from flashcp.torch import _cuda_cache


class FakeBatch:
    def __init__(self, layout):
        self.layout = layout
        self.tables = bytes(range(8))  # two int32 entries
        self.table_entries = 2
        self.stage_rows = 0
        self.device_tables = None

    def use_device_tables(self, tensor):
        self.device_tables = tensor


class FakeCache:
    made = []

    def __init__(self, heads_q, heads_kv, head_dim, scale, max_graphs):
        self.args = (heads_q, heads_kv, head_dim, scale, max_graphs)
        self.described = []
        self.calls = []
        self.fallback_reason = ""
        FakeCache.made.append(self)

    def describe(self, layout):
        b = FakeBatch(layout)
        self.described.append(b)
        return b

    def forward(self, batch, *args):
        *bufs, stream, groups, workspace = args
        ws = workspace(1000)
        self.calls.append(("forward", batch, len(bufs), stream, groups, ws.dtype, ws.numel()))

    def backward(self, batch, *args):
        *bufs, stream, groups, workspace = args
        ws = workspace(24)
        self.calls.append(("backward", batch, len(bufs), stream, groups, ws.dtype, ws.numel()))

    @property
    def stats(self):
        return {"hits": 3, "misses": 2, "builds": 2, "rejected": 0, "evictions": 0, "size": 2,
                "capacity": self.args[4]}


class FakeNative:
    CudaAttentionCache = FakeCache


def shared_cache_case(rank, n, spec):
    """Two CpContexts (two steps' batches) and a second attention shape, on
    the test double; what each call saw."""
    _cuda_cache.native = lambda: FakeNative  # the child's own module state
    dev = torch.device("cpu")  # the double's device: tables and workspace on the CPU
    ctxs = [ft.CpContext(flashcp.plan(lens, n, "flashcp"), rank, doc_lens=lens)
            for lens in spec["steps"]]
    kernels = [c.cuda_kernel("targeted", 4, 2, 64, 0.125, dev) for c in ctxs]
    again = ctxs[0].cuda_kernel("targeted", 4, 2, 64, 0.125, dev)
    other_shape = ctxs[1].cuda_kernel("targeted", 8, 2, 64, 0.125, dev)
    buf = (0, 0)
    kernels[1].forward(buf, buf, buf, buf, buf, buf, buf, 7, 1)
    kernels[1].backward(*([buf] * 13), 9, 2)
    made = FakeCache.made
    return {
        "made": [c.args for c in made],
        "same_kernel_on_second_call": again is kernels[0],
        "shared_cache": kernels[0].cache is kernels[1].cache is made[0],
        "other_shape_cache": other_shape.cache is made[1],
        "described": [[b.layout is ctxs[i].layout("targeted").native
                       for i, b in enumerate(made[0].described)]],
        "tables": [b.device_tables.tolist() for b in made[0].described],
        "calls": [(c[0], c[1] is made[0].described[1], *c[2:]) for c in made[0].calls],
        "stats": _cuda_cache.graph_stats(),
        "stats_of_cpu": _cuda_cache.graph_stats(dev),
        "stats_of_cuda": _cuda_cache.graph_stats(torch.device("cuda", 0)),
        "public": ft.cuda_graph_stats is _cuda_cache.graph_stats,
    }


def test_contexts_of_different_steps_share_one_native_cache():
    res = harness.run(shared_cache_case, 1, dict(steps=[[37, 1, 60], [90, 3, 12]]))
    r = res[0]
    assert r["made"] == [(4, 2, 64, 0.125, _cuda_cache.MAX_GRAPHS),
                         (8, 2, 64, 0.125, _cuda_cache.MAX_GRAPHS)]
    assert r["same_kernel_on_second_call"]
    assert r["shared_cache"]
    assert r["other_shape_cache"]
    assert r["described"] == [[True, True]]  # one describe per context, its own layout
    # The tables' bytes 0..7 as two little-endian int32, copied to the device.
    assert r["tables"] == [[0x03020100, 0x07060504]] * 2
    assert r["calls"] == [("forward", True, 7, 7, 1, torch.uint8, 1000),
                          ("backward", True, 13, 9, 2, torch.uint8, 24)]
    want = {"hits": 6, "misses": 4, "builds": 4, "rejected": 0, "evictions": 0, "size": 4,
            "capacity": 2 * _cuda_cache.MAX_GRAPHS}
    assert r["stats"] == want
    assert r["stats_of_cpu"] == want
    assert r["stats_of_cuda"] == dict.fromkeys(_cuda_cache.STAT_FIELDS, 0)
    assert r["public"]


def test_metrics_read_the_counters_at_scrape(monkeypatch):
    prometheus_client = pytest.importorskip("prometheus_client")
    monkeypatch.setattr(_cuda_cache, "native", lambda: FakeNative)
    monkeypatch.setattr(_cuda_cache, "_CACHES", {})
    monkeypatch.setattr(_cuda_cache, "_REGISTERED", True)  # keep the default registry clean
    reg = prometheus_client.CollectorRegistry()
    assert _cuda_cache.register_metrics(reg)
    assert reg.get_sample_value("flashcp_cuda_graph_cache_builds_total") == 0
    _cuda_cache.attention_cache(torch.device("cpu"), 4, 2, 64, 0.125)
    assert reg.get_sample_value("flashcp_cuda_graph_cache_builds_total") == 2
    assert reg.get_sample_value("flashcp_cuda_graph_cache_hits_total") == 3
    assert reg.get_sample_value("flashcp_cuda_graph_cache_capacity") == _cuda_cache.MAX_GRAPHS


@pytest.mark.skipif(native().cuda_built, reason="this build has the CUDA backend")
def test_a_build_without_cuda_refuses_the_cache():
    with pytest.raises(NotImplementedError) as e:
        native().CudaAttentionCache(4, 2, 64, 0.125)
    assert str(e.value) == (
        "this flashcp build has no CUDA backend (CMake found no nvcc or cuDNN frontend, or "
        "FLASHCP_CUDA=OFF): rebuild with CUDA, or pass CPU tensors")


def two_steps_case(rank, n, spec):
    """attention() on cuda:0 for each step's batch (a new CpContext each),
    against the CPU path; the graph counters after each step."""
    hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
    out = []
    for i, lens in enumerate(spec["steps"]):
        ctx = ft.CpContext(flashcp.plan(lens, n, "flashcp"), rank, doc_lens=lens)
        q, k, v, dout = (ft.dispatch(t, ctx) for t in
                         cases.global_inputs(sum(lens), hq, hkv, d, 10 + i, torch.bfloat16))
        runs = {}
        for dev, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
            ql, kl, vl = (t.to(dev, dtype).requires_grad_() for t in (q, k, v))
            o = ft.attention(ql, kl, vl, ctx)
            o.backward(dout.to(dev, dtype))
            runs[dev] = [t.detach().float().cpu() for t in (o, ql.grad, kl.grad, vl.grad)]
        torch.cuda.synchronize()
        out.append({"err": [float((a - b).abs().max()) for a, b in zip(runs["cuda"], runs["cpu"])],
                    "ref": [float(b.abs().max()) for b in runs["cpu"]],
                    "stats": ft.cuda_graph_stats()})
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device (torch.cuda.is_available() is False)")
def test_second_step_of_a_shape_class_builds_no_graph():
    # One rank: every document is a whole shard, so each step's class is
    # (5 sequences, longest rounded up to 128): forward and backward, 2 graphs.
    steps = [[37, 1, 60, 5, 100], [90, 3, 12, 7, 120]]
    res = harness.run(two_steps_case, 1, dict(steps=steps, hq=4, hkv=2, d=64), timeout_s=300)
    first, second = res[0]
    for i, step in enumerate((first, second)):
        for name, err, ref in zip(("o", "dq", "dk", "dv"), step["err"], step["ref"]):
            assert err <= 2e-2 + 2e-2 * ref, f"step {i} {name}: max abs error {err} (|ref| {ref})"
    assert first["stats"]["builds"] == 2, first["stats"]
    assert first["stats"]["misses"] == 2, first["stats"]
    assert second["stats"]["builds"] == 2, second["stats"]  # none on the second step
    assert second["stats"]["misses"] == 2, second["stats"]
    assert second["stats"]["hits"] == first["stats"]["hits"] + 2, (first, second)
    assert second["stats"]["size"] == 2, second["stats"]
