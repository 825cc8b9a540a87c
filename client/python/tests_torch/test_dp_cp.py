"""DP x CP (flashcp.torch.dp_cp): 4 gloo ranks as DP 2 x CP 2, a stock
transformers Llama with flashcp.torch.hf, gradients reduced by DDP over
dp x cp (DDP) or sharded over it (FSDP2's fully_shard): every step's loss
and the parameters after the steps equal single-process training on the
union of the replicas' documents."""
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


def test_an_unknown_kind_is_refused_naming_it():
    import torch

    import flashcp.torch.dp_cp as dpcp
    with pytest.raises(ValueError, match=r"^kind: 'zero3'; expected 'ddp' or 'fsdp2'$"):
        dpcp.data_parallel(torch.nn.Linear(2, 2), None, "zero3")


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_dp2_x_cp2_equals_single_process_training(kind, reference):
    ref_losses, ref_params = reference
    res = harness.run(dp_cp_cases.train_rank, 4, kind, "llama", SEED, steps(), 2, 2,
                      timeout_s=180)
    assert [(r[2], r[3]) for r in res] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r[4] for r in res] == [kind == "fsdp2"] * 4  # FSDP2's parameters are DTensors
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
