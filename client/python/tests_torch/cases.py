"""What each rank runs in the multi-process tests (harness.run)."""
import math

import grpc
import torch
import torch.nn.functional as F

import flashcp
import flashcp.torch as ft


def global_inputs(total, hq, hkv, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(total, hq, d, generator=g).to(dtype)
    k = torch.randn(total, hkv, d, generator=g).to(dtype)
    v = torch.randn(total, hkv, d, generator=g).to(dtype)
    dout = torch.randn(total, hq, d, generator=g).to(dtype)
    return q, k, v, dout


def doc_mask(doc_lens):
    """[total, total] bool: query t sees key j iff same document and j <= t."""
    doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
    idx = torch.arange(len(doc))
    return (doc[:, None] == doc[None, :]) & (idx[None, :] <= idx[:, None])


def reference(q, k, v, dout, doc_lens, scale=None):
    """Dense attention with the document mask (torch SDPA) and its grads, fp32."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
                                       attn_mask=doc_mask(doc_lens), scale=scale).transpose(0, 1)
    o.backward(dout.float())
    return o.detach(), q.grad, k.grad, v.grad


def attention_case(rank, n, spec):
    """One plan, both schemes: max abs errors of O, dQ, dK, dV on this rank
    (padding rows included: their outputs and gradients must be 0)."""
    doc_lens, strategy = spec["doc_lens"], spec["strategy"]
    hq, hkv, d = spec.get("hq", 2), spec.get("hkv", 2), spec.get("d", 16)
    dtype = getattr(torch, spec.get("dtype", "float32"))
    plan = spec.get("plan") or flashcp.plan(doc_lens, n, strategy,
                                            min_shard_tokens=spec.get("min_shard", -1))
    ctx = ft.CpContext(plan, rank, doc_lens=doc_lens)
    total = sum(doc_lens)
    q, k, v, dout = global_inputs(total, hq, hkv, d, spec.get("seed", 1), dtype)
    ref = spec.get("want") or reference(q, k, v, dout, doc_lens)
    want = [ft.dispatch(t, ctx) for t in ref]
    out = {}
    for scheme in spec.get("schemes", ("targeted", "allgather")):
        ql, kl, vl = (ft.dispatch(t, ctx).requires_grad_() for t in (q, k, v))
        o = ft.attention(ql, kl, vl, ctx, scheme=scheme)
        assert o.dtype == dtype and o.shape == ql.shape
        o.backward(ft.dispatch(dout, ctx))
        got = [o.detach(), ql.grad, kl.grad, vl.grad]
        out[scheme] = [float((a.float() - b).abs().max()) for a, b in zip(got, want)]
    return out


def attention_cases(rank, n, specs):
    return {key: attention_case(rank, n, spec) for key, spec in specs.items()}


def with_reference(spec):
    """spec plus "want": the dense reference, computed once by the caller
    instead of on every rank."""
    dtype = getattr(torch, spec.get("dtype", "float32"))
    inputs = global_inputs(sum(spec["doc_lens"]), spec.get("hq", 2), spec.get("hkv", 2),
                           spec.get("d", 16), spec.get("seed", 1), dtype)
    return dict(spec, want=reference(*inputs, spec["doc_lens"]))


def dispatch_case(rank, n, spec):
    """dispatch / undispatch / labels / positions / cu_seqlens on this rank."""
    lens = spec["doc_lens"]
    ctx = ft.CpContext(spec["plan"], rank, doc_lens=lens)
    total = sum(lens)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(total, 3, 2, generator=g)
    xp = torch.cat([x, torch.full((ctx.padding, 3, 2), 5.0)])
    ids = torch.randint(0, 1000, (total,), generator=g)
    local = ft.dispatch(x, ctx)
    local_p = ft.dispatch(xp, ctx)
    pos = torch.cat([torch.arange(n_) for n_ in lens])
    nxt = torch.full((total,), -100)
    ends = torch.tensor(lens).cumsum(0) - 1
    nxt[:-1] = ids[1:]
    nxt[ends] = -100
    segs = ctx.cu_seqlens_q.tolist()
    return dict(
        rows=local.shape[0], local_rows=ctx.local_rows, real_rows=ctx.real_rows,
        round_trip=torch.equal(ft.undispatch(local, ctx), x),
        round_trip_padded=torch.equal(ft.undispatch(local_p, ctx), x),
        pad_rows_zero=bool((local[ctx.real_rows:] == 0).all()),
        pad_rows_taken=bool((local_p[ctx.real_rows:] == 5.0).all()),
        ids_round_trip=torch.equal(ft.undispatch(ft.dispatch(ids, ctx), ctx), ids),
        positions=torch.equal(ctx.position_ids[:ctx.real_rows],
                              ft.dispatch(pos, ctx)[:ctx.real_rows]),
        labels=torch.equal(ctx.labels(ids), ft.dispatch(nxt, ctx, pad_value=-100)),
        cu_q_last=segs[-1], cu_k=ctx.cu_seqlens_k.tolist(), cu_q=segs,
        max_q=ctx.max_seqlen_q, max_k=ctx.max_seqlen_k,
        grad_flows=_dispatch_grad(x, ctx))


def _dispatch_grad(x, ctx):
    xg = x.clone().requires_grad_()
    ft.dispatch(xg, ctx).sum().backward()
    # Each real token lands on exactly one rank: its gradient here is 1 iff local.
    mine = torch.zeros(x.shape[0], dtype=torch.bool)
    mine[ctx.global_rows[ctx.global_rows < ctx.total_tokens]] = True
    return bool((xg.grad[mine] == 1).all() and (xg.grad[~mine] == 0).all())


def _raises(fn):
    try:
        fn()
    except Exception as e:  # the test compares type and message
        return (type(e).__name__, str(e))
    return None


def errors_case(rank, n, spec):
    """Every bad input, on a live group of n: (exception type, message) each,
    raised before any collective (the call returns, no rank waits)."""
    lens = spec["doc_lens"]
    plan = spec["plan"]
    ctx = ft.CpContext(plan, rank)
    rows = ctx.local_rows
    q = torch.randn(rows, 4, 16)
    k = torch.randn(rows, 2, 16)
    out = {
        "group_size": _raises(lambda: ft.CpContext(spec["plan3"], rank)),
        "rank": _raises(lambda: ft.CpContext(plan, 1 - rank)),
        "rank_range": _raises(lambda: ft.CpContext(plan, n)),
        "other_docs": _raises(lambda: ft.CpContext(plan, rank, doc_lens=lens[:-1] + [lens[-1] + 1])),
        "dispatch_rows": _raises(lambda: ft.dispatch(torch.zeros(sum(lens) + 7), ctx)),
        "undispatch_rows": _raises(lambda: ft.undispatch(torch.zeros(rows + 1), ctx)),
        "q_rows": _raises(lambda: ft.attention(q[:-1], k[:-1], k[:-1], ctx)),
        "q_dims": _raises(lambda: ft.attention(q.view(rows, 64), k, k, ctx)),
        "k_rows": _raises(lambda: ft.attention(q, k[:-1], k, ctx)),
        "dtype": _raises(lambda: ft.attention(q.double(), k.double(), k.double(), ctx)),
        "mixed_dtype": _raises(lambda: ft.attention(q, k.bfloat16(), k, ctx)),
        "device": _raises(lambda: ft.attention(q, k.to("meta"), k, ctx)),
        "q_device": _raises(lambda: ft.attention(q.to("meta"), k.to("meta"), k.to("meta"), ctx)),
        "non_contiguous": _raises(lambda: ft.attention(
            torch.randn(4, rows, 16).transpose(0, 1), k, k, ctx)),
        "gqa": _raises(lambda: ft.attention(torch.randn(rows, 3, 16), k, k, ctx)),
        "kv_zero_heads": _raises(lambda: ft.attention(
            q, torch.randn(rows, 0, 16), torch.randn(rows, 0, 16), ctx)),
        "head_dim": _raises(lambda: ft.attention(q, torch.randn(rows, 2, 8),
                                                 torch.randn(rows, 2, 8), ctx)),
        "kv_shapes": _raises(lambda: ft.attention(q, k, torch.randn(rows, 1, 16), ctx)),
        "scheme": _raises(lambda: ft.attention(q, k, k, ctx, scheme="ring")),
        "scale": _raises(lambda: ft.attention(q, k, k, ctx, softmax_scale=-1.0)),
        "ctx": _raises(lambda: ft.attention(q, k, k, object())),
        "bad_plan": _raises(lambda: ft.CpContext(spec["bad_plan"], rank)),
    }
    # The group still works after all of that.
    o = ft.attention(q, k, k, ctx)
    out["still_works"] = tuple(o.shape)
    return out


def dies_case(rank, n, spec):
    """Rank spec["victim"] exits after the forward; the others run the
    backward and must fail, naming it, within the group's timeout."""
    import os
    import time
    ctx = ft.CpContext(spec["plan"], rank)
    rows = ctx.local_rows
    q, k, v = (torch.randn(rows, 2, 16, requires_grad=True) for _ in range(3))
    o = ft.attention(q, k, v, ctx, scheme=spec["scheme"])
    if rank == spec["victim"]:
        os._exit(17)
    t = time.monotonic()
    try:
        o.sum().backward()
        for _ in range(3):  # the next steps' forward, if the backward happened not to need it
            ft.attention(q.detach(), k.detach(), v.detach(), ctx, scheme=spec["scheme"])
    except ft.ExchangeError as e:
        return ("ExchangeError", str(e), time.monotonic() - t)
    except Exception as e:
        return (type(e).__name__, str(e), time.monotonic() - t)
    return ("no error", "", time.monotonic() - t)


def subgroup_case(rank, n, spec):
    """CP groups inside a larger world (DP x CP): ranks {0, 1} and {2, 3}
    each run the plan on their own group; errors as attention_case's."""
    import torch.distributed as dist
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[rank // 2]
    lens = spec["doc_lens"]
    ctx = ft.CpContext(spec["plan"], rank % 2, group, doc_lens=lens)
    q, k, v, dout = global_inputs(sum(lens), 4, 2, 16, 5 + rank // 2)  # different data per group
    want = [ft.dispatch(t, ctx) for t in reference(q, k, v, dout, lens)]
    out = {}
    for scheme in ("targeted", "allgather"):
        ql, kl, vl = (ft.dispatch(t, ctx).requires_grad_() for t in (q, k, v))
        o = ft.attention(ql, kl, vl, ctx, scheme=scheme)
        o.backward(ft.dispatch(dout, ctx))
        out[scheme] = [float((a - b).abs().max()) for a, b in
                       zip([o.detach(), ql.grad, kl.grad, vl.grad], want)]
    out["undispatch"] = torch.equal(ft.undispatch(ft.dispatch(q, ctx), ctx), q)
    return out


def cuda_attention_case(rank, n, spec):
    """attention() on cuda:0 (bf16, the cuDNN path) against the CPU path in
    fp32 on the same bf16 values, one scheme: max abs errors of O, dQ, dK,
    dV and the reference's max abs of each; plus what fp32 CUDA inputs raise."""
    doc_lens = spec["doc_lens"]
    hq, hkv, d = spec["hq"], spec["hkv"], spec["d"]
    plan = flashcp.plan(doc_lens, n, spec["strategy"], min_shard_tokens=spec.get("min_shard", -1))
    ctx = ft.CpContext(plan, rank, doc_lens=doc_lens)
    q, k, v, dout = (ft.dispatch(t, ctx) for t in
                     global_inputs(sum(doc_lens), hq, hkv, d, spec.get("seed", 1), torch.bfloat16))
    runs = {}
    for dev, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
        ql, kl, vl = (t.to(dev, dtype).requires_grad_() for t in (q, k, v))
        o = ft.attention(ql, kl, vl, ctx, scheme=spec["scheme"])
        o.backward(dout.to(dev, dtype))
        runs[dev] = [t.detach().float().cpu() for t in (o, ql.grad, kl.grad, vl.grad)]
    err = [float((a - b).abs().max()) for a, b in zip(runs["cuda"], runs["cpu"])]
    ref = [float(b.abs().max()) for b in runs["cpu"]]
    qc = q.float().cuda()
    return {"err": err, "ref": ref,
            "fp32": _raises(lambda: ft.attention(qc, k.float().cuda(), v.float().cuda(), ctx))}


def plan_agreement_case(rank, n, spec):
    """CpContext on this rank's own plan (spec["plans"][rank]): what its
    plan check raised (type, message, differing ranks, every rank's hash),
    or None; then that the group still works, on the plan of rank 0."""
    # PlanResponses travel serialized (protobuf messages do not pickle).
    plans = [flashcp.planner_pb2.PlanResponse.FromString(p) if isinstance(p, bytes) else p
             for p in spec["plans"]]
    out = {}
    try:
        ft.CpContext(plans[rank], rank, doc_lens=spec["doc_lens"])
        out["error"] = None
    except ft.PlanMismatchError as e:
        out["error"] = (type(e).__name__, str(e), e.differing, e.hashes)
    ctx = ft.CpContext(plans[0], rank)
    x = torch.arange(sum(spec["doc_lens"]), dtype=torch.float32)
    out["still_works"] = torch.equal(ft.undispatch(ft.dispatch(x, ctx), ctx), x)
    out["plan_hash"] = ctx.plan_hash
    return out


def plan_on_first_rank_case(rank, n, spec):
    """flashcp.torch.plan_on_first_rank on this rank (the batch given on
    rank 0 only): the serialized plan, or (type, code, message) of what it
    raised; then a CpContext on the plan runs a step (exact against SDPA)."""
    client = (flashcp.Client(spec["address"], options=(("grpc.min_reconnect_backoff_ms", 5000),))
              if spec.get("address") and rank == 0 else None)
    lens = spec["doc_lens"] if rank == 0 else None
    try:
        plan = ft.plan_on_first_rank(lens, None, spec.get("strategy", ""), client=client,
                                     **spec.get("fields", {}))
    except flashcp.PlanError as e:
        return ("PlanError", e.code, str(e))
    except grpc.RpcError as e:  # rank 0, from the service
        return ("RpcError", e.code().name, e.details())
    finally:
        if client is not None:
            client.close()
    ctx = ft.CpContext(plan, rank, doc_lens=spec["doc_lens"])
    q, k, v, dout = global_inputs(sum(spec["doc_lens"]), 2, 2, 16, 3)
    want = ft.dispatch(reference(q, k, v, dout, spec["doc_lens"])[0], ctx)
    o = ft.attention(ft.dispatch(q, ctx), ft.dispatch(k, ctx), ft.dispatch(v, ctx), ctx)
    return {"plan": plan.SerializeToString(), "err": float((o - want).abs().max())}


def batched_p2p_case(rank, n, spec):
    """attention_case (targeted scheme) with torch.distributed's point-to-point
    calls counted: batch_isend_irecv calls and their ops by kind, and isend /
    irecv posted outside one (ungrouped)."""
    import threading

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    counts = {"batches": 0, "isend": 0, "irecv": 0, "ungrouped": 0}
    inside = threading.local()
    real_batch, real_isend, real_irecv = dist.batch_isend_irecv, c10d.isend, c10d.irecv

    def batch(ops):
        counts["batches"] += 1
        inside.on = True
        try:
            return real_batch(ops)
        finally:
            inside.on = False

    def wrap(real, kind):
        def op(*args, **kwargs):
            counts[kind] += 1
            if not getattr(inside, "on", False):
                counts["ungrouped"] += 1
            return real(*args, **kwargs)
        return op

    isend, irecv = wrap(real_isend, "isend"), wrap(real_irecv, "irecv")
    # P2POp checks its op against c10d's isend / irecv: patch both names.
    dist.batch_isend_irecv, dist.isend, dist.irecv = batch, isend, irecv
    c10d.isend, c10d.irecv = isend, irecv
    try:
        errors = attention_case(rank, n, dict(spec, schemes=("targeted",)))
    finally:
        dist.batch_isend_irecv, dist.isend, dist.irecv = real_batch, real_isend, real_irecv
        c10d.isend, c10d.irecv = real_isend, real_irecv
    ctx = ft.CpContext(spec["plan"], rank, check_plan=False)
    lay = ctx.layout("targeted")
    return {"errors": errors["targeted"], "counts": counts,
            "sends": len(lay.sends), "recvs": len(lay.recvs)}


class TinyAttentionModel(torch.nn.Module):
    """Two attention layers over this rank's rows: x [C/N, W] -> scalar."""

    def __init__(self, width=32, heads=4, kv_heads=2, layers=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, width // heads
        self.q = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.kv = torch.nn.ModuleList(torch.nn.Linear(width, 2 * kv_heads * self.d)
                                      for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

    def forward(self, x, ctx):
        for q_proj, kv_proj, out in zip(self.q, self.kv, self.out):
            rows = x.shape[0]
            q = q_proj(x).view(rows, self.heads, self.d)
            k, v = kv_proj(x).view(rows, 2 * self.kv_heads, self.d).chunk(2, dim=1)
            o = ft.attention(q, k.contiguous(), v.contiguous(), ctx)
            x = x + out(torch.relu(o.reshape(rows, -1)))
        return (x * x).mean()


def compile_case(rank, n, spec):
    """TinyAttentionModel on two steps (two batches, two plans) eager and
    under torch.compile (aot_eager): graph breaks (torch._dynamo.explain and
    the compile counters), graphs compiled, and the largest difference of
    loss and parameter gradients between the two (and the largest magnitude
    of the eager ones). spec["device"]: "cpu" (fp32, default) or "cuda"
    (cuda:0, bf16: the custom op's CUDA kernels)."""
    from torch._dynamo.utils import counters
    dev = spec.get("device", "cpu")
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    model = TinyAttentionModel().to(dev, dtype)
    steps = []
    for lens, plan in spec["steps"]:
        ctx = ft.CpContext(plan, rank, doc_lens=lens)
        x = ft.dispatch(torch.randn(sum(lens), 32, generator=torch.Generator().manual_seed(5)),
                        ctx).to(dev, dtype)
        steps.append((ctx, x))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(steps[0][1], steps[0][0])
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager")
    diffs, mags = [], []
    for ctx, x in steps:
        got = []
        for fn in (model, compiled):
            model.zero_grad()
            loss = fn(x, ctx)
            loss.backward()
            got.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
        diffs.append(max(float((a - b).abs().max()) for a, b in zip(*got)))
        mags.append(max(float(a.abs().max()) for a in got[0]))
    return {"explain_breaks": explained.graph_break_count, "explain_graphs": explained.graph_count,
            "graph_breaks": sum(counters["graph_break"].values()),
            "unique_graphs": counters["stats"]["unique_graphs"], "diffs": diffs, "mags": mags}


def metrics_case(rank, n, spec):
    """One attention step (forward and backward) and flashcp.torch.step_metrics
    on it: the StepMetrics as a dict, what the callback got, and what went to a
    stand-in prometheus_client (the real one is not a dependency)."""
    import dataclasses
    import sys
    import types
    exported = []

    class Metric:
        def __init__(self, name, doc, labels, **kw):
            self.name = name

        def labels(self, **kw):
            def record(op):
                return lambda value=1: exported.append((self.name, op, kw, value))
            return types.SimpleNamespace(inc=record("inc"), observe=record("observe"),
                                         set=record("set"))

    sys.modules["prometheus_client"] = types.SimpleNamespace(Counter=Metric, Gauge=Metric,
                                                             Histogram=Metric)
    plan = flashcp.planner_pb2.PlanResponse.FromString(spec["plan"])
    lens = list(plan.doc_lens)
    ctx = ft.CpContext(plan, rank, doc_lens=lens)
    q, k, v, dout = (ft.dispatch(t, ctx).requires_grad_() for t in
                     global_inputs(sum(lens), 2, 2, 16, 4))
    o = ft.attention(q, k, v, ctx, scheme=spec["scheme"])
    o.backward(dout.detach())
    got = []
    m = ft.step_metrics(ctx, spec["scheme"], callback=got.append, plan=plan)
    return {"metrics": dataclasses.asdict(m), "callback": [dataclasses.asdict(x) for x in got],
            "exported": exported, "stats_after": dataclasses.asdict(ctx.stats)}


def all_to_all_cases(rank, n, specs):
    """attention(scheme="all_to_all") per spec: ("ok", [max abs errors of O,
    dQ, dK, dV], bytes sent, bytes received) on this rank, forward plus
    backward, or ("refused", message) where this rank's group cannot split
    the query heads (raised before any collective). spec["ranks_per_node"]
    (default 0) is the context's (a mixed plan's two_level groups)."""
    out = {}
    for key, spec in specs.items():
        doc_lens = spec["doc_lens"]
        ctx = ft.CpContext(spec["plan"], rank, doc_lens=doc_lens,
                           ranks_per_node=spec.get("ranks_per_node", 0))
        q, k, v, dout = global_inputs(sum(doc_lens), spec["hq"], spec["hkv"], spec["d"],
                                      spec["seed"], getattr(torch, spec.get("dtype", "float32")))
        want = [ft.dispatch(t, ctx) for t in spec["want"]]
        ql, kl, vl = (ft.dispatch(t, ctx).requires_grad_() for t in (q, k, v))
        try:
            o = ft.attention(ql, kl, vl, ctx, scheme=spec.get("scheme", "all_to_all"))
        except RuntimeError as e:
            out[key] = ("refused", str(e))
            continue
        o.backward(ft.dispatch(dout, ctx))
        got = [o.detach(), ql.grad, kl.grad, vl.grad]
        out[key] = ("ok", [float((a.float() - b).abs().max()) for a, b in zip(got, want)],
                    ctx.stats.bytes_sent, ctx.stats.bytes_received)
        # Mixed plans the call refuses, before any exchange: (type, message).
        out[(key, "refused")] = [_raises(lambda b=b: ft.attention(ql, kl, vl, ctx, scheme=b))
                                 for b in spec.get("refuse", ())]
    return out

