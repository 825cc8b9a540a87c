"""The BDLM training example (examples/train_bdlm_tiny.py): CP N = 2 and 4
over gloo under the block-diffusion mask; every step's loss equals training
without CP (dense attention with the mask) within 1e-4 relative."""
import json
import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_bdlm_tiny.py")


def test_train_bdlm_tiny_matches_training_without_cp():
    r = subprocess.run([sys.executable, EXAMPLE, "--cp", "2,4", "--steps", "20", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    ref = summary["reference"]
    assert len(ref) == 20 and ref[-1] < 0.9 * ref[0]  # it learns
    assert [run["cp"] for run in summary["runs"]] == [2, 4]
    for run in summary["runs"]:
        assert len(run["losses"]) == 20
        for step, (a, b) in enumerate(zip(run["losses"], ref)):
            assert abs(a - b) <= 1e-4 * abs(b), (run["cp"], step, a, b)
