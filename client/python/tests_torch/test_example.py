"""The training example: CP N = 2 and 4 over gloo, plans from the real
flashcp-planner and in process; every step's loss equals training without CP."""
import json
import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_tiny.py")


def test_train_tiny_matches_training_without_cp(planner_bin):
    r = subprocess.run([sys.executable, EXAMPLE, "--planner_bin", planner_bin, "--cp", "2,4",
                        "--steps", "20", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    ref = summary["reference"]
    assert len(ref) == 20 and ref[-1] < 0.8 * ref[0]  # it learns
    runs = {(run["cp"], run["planner"]): run for run in summary["runs"]}
    assert set(runs) == {(2, "service"), (2, "inprocess"), (4, "service"), (4, "inprocess")}
    for key, run in runs.items():
        assert len(run["losses"]) == 20
        for step, (a, b) in enumerate(zip(run["losses"], ref)):
            assert abs(a - b) <= 1e-4 * abs(b), (key, step, a, b)
        assert run["tokens_per_s"] > 0 and 1.0 <= run["imbalance"] < 1.1
    assert runs[(2, "service")]["losses"] == runs[(2, "inprocess")]["losses"]
