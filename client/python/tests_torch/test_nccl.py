"""The CUDA path on NCCL: one process per GPU (2, and 4 where there are 4),
attention() in bf16 over an NCCL group (the grouped batch_isend_irecv
exchange, the plan check's all-gather, CUDA tensors as they are, no host
staging; all_to_all's head exchange the same grouped call; two_level's
over two nodes of n / 2, its KV exchange across them grouped too), forward
and backward, against dense document-masked attention in
fp32 on the same bf16 inputs. Marked gpu; skipped with fewer
than 2 CUDA devices (CI, the build machines, a one-GPU lease): it has not
run yet (docs/gpu.md). Tolerance as test_cuda.py's."""
import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import traceback

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2 or
                                 not torch.distributed.is_nccl_available(),
                                 reason="needs 2 CUDA devices and NCCL")]

DOCS = [37, 1, 60, 5, 100, 1, 1, 29]  # 234 tokens


def _rank(rank, n, store_path, scheme, out):
    try:
        import torch.distributed as dist

        import cases
        import flashcp
        import flashcp.torch as ft
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", store=dist.FileStore(store_path, n), rank=rank,
                                world_size=n, timeout=datetime.timedelta(seconds=60))
        hq, hkv, d = 4, 2, 64
        plan = flashcp.plan(DOCS, n, "flashcp", min_shard_tokens=8, heads=hkv, head_dim=d,
                            dtype_bytes=2)
        # two_level: the plan's one rank group of n over two nodes (the
        # all-to-all within each node's half, the KV across them).
        per_node = n // 2 if scheme == "two_level" else 0
        ctx = ft.CpContext(plan, rank, doc_lens=DOCS, ranks_per_node=per_node)
        assert not ctx.host_staged
        q, k, v, dout = cases.global_inputs(sum(DOCS), hq, hkv, d, 3, torch.bfloat16)
        want = [ft.dispatch(t, ctx) for t in cases.reference(q, k, v, dout, DOCS)]
        dev = torch.device("cuda", rank)
        ql, kl, vl = (ft.dispatch(t, ctx).to(dev).requires_grad_() for t in (q, k, v))
        o = ft.attention(ql, kl, vl, ctx, scheme=[(list(range(n)), scheme)] if per_node
                         else scheme)
        o.backward(ft.dispatch(dout, ctx).to(dev))
        torch.cuda.synchronize()
        got = [t.detach().float().cpu() for t in (o, ql.grad, kl.grad, vl.grad)]
        err = [float((a - b).abs().max()) for a, b in zip(got, want)]
        ref = [float(b.abs().max()) for b in want]
        out.put((rank, "ok", {"err": err, "ref": ref}))
        dist.destroy_process_group()
    except BaseException as e:
        out.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


@pytest.mark.parametrize("scheme", ["targeted", "allgather", "all_to_all", "two_level"])
@pytest.mark.parametrize("n", [2, 4])
def test_attention_over_nccl_matches_dense_attention(n, scheme):
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA devices")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    here = os.path.dirname(os.path.abspath(__file__))  # cases, importable by the ranks
    if here not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = here + os.pathsep + os.environ.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="flashcp-nccl-") as tmp:
        procs = [ctx.Process(target=_rank, args=(r, n, os.path.join(tmp, "store"), scheme, out))
                 for r in range(n)]
        for p in procs:
            p.start()
        results = {}
        try:
            while len(results) < n:
                rank, status, value = out.get(timeout=240)
                results[rank] = (status, value)
        except queue.Empty:
            pass
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    assert sorted(results) == list(range(n)), f"ranks that reported: {sorted(results)}"
    for rank, (status, value) in sorted(results.items()):
        assert status == "ok", f"rank {rank}: {value}"
        for name, err, ref in zip(("o", "dq", "dk", "dv"), value["err"], value["ref"]):
            assert err <= 2e-2 + 2e-2 * ref, \
                f"{scheme} n={n} rank {rank} {name}: max abs error {err} (|ref| {ref})"
