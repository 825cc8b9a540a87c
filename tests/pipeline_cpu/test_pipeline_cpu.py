"""The chunked pipeline executed (issue 26): a DPP plan of a small decoder run
by d_p = 2 and 4 real processes over gloo (flashcp.torch.pipeline), each stage
in the plan's 1F1B order with its checkpointing; the fp32 loss and every
parameter's gradient equal training on the whole documents without a
pipeline, to 1e-4 relative."""
import flashcp
import pytest
from flashcp.torch import pipeline as pipe

DOCS = [40, 23, 17, 9, 5, 3]
MODEL = pipe.TinyDecoderConfig(layers=4, hidden=32, heads=2, ffn=64, vocab=64, seed=0)
SHAPE = dict(layers=4, hidden=32, kv_hidden=32, ffn_hidden=64, vocab=64)


def plan_with_some_checkpointing(pp):
    """A DPP plan whose budget lies halfway between no and full
    checkpointing's peaks, so that the checkpointing (in process the
    greedy one: no CBC in the extension) checkpoints some chunks only; K = 3
    cuts the 40- and 23-token documents into split and hybrid chunks."""
    kw = dict(SHAPE, slice_count=3)
    none = flashcp.plan_pipeline(DOCS, pp, "dpp_no_ckpt", **kw)
    full = flashcp.plan_pipeline(DOCS, pp, "dpp_full_ckpt", **kw)
    budget = (max(none["prediction"]["stage_peak_bytes"]) +
              max(full["prediction"]["stage_peak_bytes"])) / 2
    return flashcp.plan_pipeline(DOCS, pp, "dpp", memory_budget_gib=budget / 2**30, **kw)


@pytest.mark.parametrize("pp", [2, 4])
def test_losses_and_gradients_equal_training_without_pp(pp, tmp_path):
    plan = plan_with_some_checkpointing(pp)
    kinds = {c["kind"] for c in plan["chunks"]}
    assert {"split", "hybrid"} <= kinds
    counts = [c for row in plan["ckpt"] for c in row]
    assert 0 < sum(counts) < len(counts) * (MODEL.layers // pp)  # some, not all, checkpointed
    results = pipe.run_plan(plan, DOCS, pp, MODEL, str(tmp_path), timeout_s=240)
    ref_loss, ref_grads = pipe.reference(MODEL, DOCS)
    loss = results[-1]["loss"]
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    seen = set()
    for r in results:
        assert r["ref_loss"] == pytest.approx(ref_loss, rel=1e-6)
        for name, err in r["grad_rel_err"].items():
            assert err <= 1e-4, (r["rank"], name, err)
            seen.add(name)
        assert len(r["ops"]) == 2 * len(plan["chunks"])
        # The heap-sampled iteration: one (chunk, backward, before, after)
        # per op, in the op order, and a peak no lower than any sample.
        assert [(k, b) for k, b, _, _ in r["mem_ops"]] == [(k, b) for k, b, _, _ in r["ops"]]
        assert r["peak_activation_bytes"] > 0
        assert r["peak_activation_bytes"] >= max(max(m[2], m[3]) for m in r["mem_ops"])
    assert seen == set(ref_grads)  # every parameter on exactly one stage, all compared
