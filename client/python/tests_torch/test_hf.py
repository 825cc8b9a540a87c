"""flashcp.torch.hf: stock transformers Llama and Qwen2 (GQA, RoPE) with
FlashCP attention on real gloo groups of 2 and 4 ranks; the group's loss and
summed gradients equal the model without CP (eager attention, one document
at a time) within fp32 tolerance."""
import os

import pytest
import torch

# Nothing here reaches the Hub (models come from configs); make sure of it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("transformers")

import harness  # noqa: E402
import hf_cases  # noqa: E402

# 331 tokens: single-token documents, and documents that the plan splits.
LENS = [90, 1, 47, 3, 120, 1, 52, 17]
SEED = 7


def _close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    scale = want.abs().max().item()
    assert scale > 1e-4, f"{name}: reference gradient is ~0; the test could not fail"
    err = (got - want).abs().max().item()
    assert err <= 2e-5 * scale, f"{name}: max |diff| {err:.3e} vs max |ref| {scale:.3e}"


@pytest.mark.parametrize("n", [2, 4])
def test_hf_models_under_cp_equal_the_model_without_cp(n):
    docs = hf_cases.documents(SEED, LENS)
    archs = ["llama", "qwen2"]
    res = harness.run(hf_cases.cp_rank, n, archs, SEED, docs, "targeted", timeout_s=120)
    for arch in archs:
        ref_loss, ref_grads = hf_cases.reference(arch, SEED, docs)
        loss, grads, moved, items, shape = res[0][arch]
        assert items == sum(LENS) - len(LENS)
        assert all(r[arch][3] == items for r in res)
        rows = shape[1]
        assert shape == (1, rows) and rows * n >= sum(LENS)
        assert moved > 0  # the plan split documents: K/V crossed ranks
        assert loss == pytest.approx(ref_loss, rel=1e-5), arch
        assert set(grads) == set(ref_grads)
        for k in ref_grads:
            _close(torch.from_numpy(grads[k]), ref_grads[k], f"{arch} {k}")


def test_what_the_attention_function_refuses_it_names():
    got = harness.run(hf_cases.refusals, 1)[0]
    assert got["ok"] == ((1, 8, 4, 16), None)
    assert got["no context"].startswith("flashcp attention: call the model with "
                                        "flashcp_context=<CpContext>")
    assert got["mask"].startswith("flashcp attention: the model was given an attention mask")
    assert got["dropout"] == ("flashcp attention: attention dropout 0.1 is not supported (set "
                              "the config's attention_dropout to 0)")
    assert got["window"].startswith("flashcp attention: sliding window 4 is not supported")
    assert got["batch"].startswith("flashcp attention: query (2, 4, 8, 16); expected one packed")
