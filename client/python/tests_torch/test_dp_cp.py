"""DP x CP (flashcp.torch.dp_cp): 4 gloo ranks as DP 2 x CP 2, a stock
transformers Llama with flashcp.torch.hf, gradients reduced by DDP over
dp x cp: every step's loss and the parameters after the steps equal
single-process training on the union of the replicas' documents. FSDP2
needs CUDA in torch 2.5: refused on a CPU mesh, with the reason."""
import os

import numpy as np
import pytest

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dp_cp_cases  # noqa: E402
import harness  # noqa: E402
import hf_cases  # noqa: E402

SEED = 3
# Per step, per replica: its documents (the replicas' batches differ in size).
LENS = [[[70, 1, 33, 58], [12, 100, 9]], [[44, 44, 3], [150, 2]]]


def steps():
    out = []
    for s, step in enumerate(LENS):
        out.append([hf_cases.documents(SEED * 100 + 10 * s + r, lens)
                    for r, lens in enumerate(step)])
    return out


@pytest.fixture(scope="module")
def reference():
    return dp_cp_cases.train_reference("llama", SEED, steps())


def test_fsdp2_is_refused_on_a_cpu_mesh_with_the_reason():
    msgs = harness.run(dp_cp_cases.fsdp2_on_cpu, 2)
    assert msgs == [msgs[0]] * 2
    assert msgs[0].startswith("kind 'fsdp2': torch ") and "needs CUDA" in msgs[0]


@pytest.mark.parametrize("kind", ["ddp"])
def test_dp2_x_cp2_equals_single_process_training(kind, reference):
    ref_losses, ref_params = reference
    res = harness.run(dp_cp_cases.train_rank, 4, kind, "llama", SEED, steps(), 2, 2,
                      timeout_s=180)
    assert [(r[2], r[3]) for r in res] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    losses, params = res[0][0], res[0][1]
    assert all(r[0] == losses for r in res)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert set(params) == set(ref_params)
    moved = 0.0
    initial = hf_cases.model("llama", SEED, "eager").state_dict()
    for k, want in ref_params.items():
        init = initial[k].numpy()
        step = np.abs(want - init).max()
        assert step > 1e-3, f"{k}: training did not move it; the test could not fail"
        err = np.abs(params[k] - want).max()
        assert err <= 1e-5 * max(step, np.abs(want).max()), f"{kind} {k}: {err:.3e}"
        moved = max(moved, step)
    assert moved > 0
