"""torch.compile of a model that calls flashcp.torch.attention: no graph
break, one graph for steps of different plans, the eager path's numbers."""
import pytest

import flashcp
import cases
import harness

# Two batches of 234 tokens: C/N equal at each N, plans different.
STEPS = [[37, 1, 60, 5, 100, 1, 1, 29], [100, 34, 100]]


@pytest.mark.parametrize("n", [2])
def test_compiled_attention_has_no_graph_break_and_matches_eager(n):
    steps = [(lens, flashcp.plan_view(flashcp.plan(lens, n, s, min_shard_tokens=8)))
             for lens, s in zip(STEPS, ["flashcp", "zigzag"])]
    for rank, r in enumerate(harness.run(cases.compile_case, n, dict(steps=steps),
                                         timeout_s=240)):
        assert r["explain_breaks"] == 0 and r["explain_graphs"] == 1, (rank, r)
        assert r["graph_breaks"] == 0, (rank, r)
        # A new context (plan) each step is a new input, not a recompile.
        assert r["unique_graphs"] == 1, (rank, r)
        assert max(r["diffs"]) < 1e-5, (rank, r)


def test_the_ops_have_cuda_kernels_and_their_fake_shapes():
    # Without a GPU: the CUDA kernels are registered (the dispatcher's CUDA
    # key, beside CPU), and the fake implementations give a compiled graph
    # the CUDA shapes and dtypes (o in q's bf16, lse fp32, gradients in the
    # inputs' dtypes), on FakeTensors of device cuda (no CUDA call).
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import flashcp.torch  # noqa: F401  (registers torch.ops.flashcp.*)
    for op in ("flashcp::cp_attention", "flashcp::cp_attention_backward"):
        for key in ("CPU", "CUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op, key), (op, key)
    with FakeTensorMode():
        q = torch.empty(10, 4, 8, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(10, 2, 8, dtype=torch.bfloat16, device="cuda")
        handle = torch.empty(1, dtype=torch.int64)  # op_handle stays on the CPU
        o, lse = torch.ops.flashcp.cp_attention(q, k, k, handle, "targeted", 0.5)
        dq, dk, dv = torch.ops.flashcp.cp_attention_backward(o, q, k, k, o, lse, handle,
                                                             "targeted", 0.5)
        qc = torch.empty(10, 4, 8, dtype=torch.bfloat16)
        oc, _ = torch.ops.flashcp.cp_attention(qc, qc[:, :2], qc[:, :2], handle, "targeted", 0.5)
    got = [(tuple(t.shape), t.dtype, t.device.type) for t in (o, lse, dq, dk, dv)]
    assert got == [((10, 4, 8), torch.bfloat16, "cuda"), ((10, 4), torch.float32, "cuda"),
                   ((10, 4, 8), torch.bfloat16, "cuda"), ((10, 2, 8), torch.bfloat16, "cuda"),
                   ((10, 2, 8), torch.bfloat16, "cuda")]
    assert (tuple(oc.shape), oc.dtype, oc.device.type) == ((10, 4, 8), torch.float32, "cpu")
