"""A training run as operators see it: the tiny example (CP N = 2 over gloo,
plans from the real flashcp-planner) serves each rank's flashcp_worker_*
metrics (prometheus_client), a real Prometheus (Debian's binary, the config
deploy/prometheus/render-local.sh writes) scrapes them and the planner, and
the example reports its step times to the planner (ReportStepTimes): the
scraped series equal what the run measured, and the planner's calibration
window holds the run's samples. Ports: all picked by the OS."""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

import flashcp.planner_process

pytest.importorskip("prometheus_client")

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "client/python/examples/train_tiny.py"
STEPS = 12
PROFILE = "cpu-fp32"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def _values(base, expr):
    return sorted(float(s["value"][1]) for s in _query(base, expr))


def _start_prometheus(prom, tmp):
    for _ in range(3):  # a free port can be taken between picking and binding
        port = _free_port()
        log = open(f"{tmp}/prometheus.log", "w")
        proc = subprocess.Popen([prom, f"--config.file={tmp}/p/prometheus.yml",
                                 f"--storage.tsdb.path={tmp}/data",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2).close()
                return proc, f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.2)
        proc.kill()
        proc.wait()
    raise RuntimeError("prometheus did not start:\n" + pathlib.Path(f"{tmp}/prometheus.log")
                       .read_text()[-2000:])


def test_a_training_run_is_scraped_by_prometheus_and_feeds_calibration(planner_bin):
    prom = shutil.which("prometheus")
    if not prom:
        pytest.fail("prometheus not found (Debian package 'prometheus'; scripts/install-deps.sh)")
    planner, addrs = flashcp.planner_process.launch_listening(planner_bin)
    example = prometheus = None
    try:
        with tempfile.TemporaryDirectory(prefix="flashcp-train-metrics-") as tmp:
            subprocess.run(["bash", str(ROOT / "deploy/prometheus/render-local.sh"), f"{tmp}/p",
                            "--interval", "1s", "--planner", addrs["metrics"]],
                           check=True, stdout=subprocess.DEVNULL)
            prometheus, base = _start_prometheus(prom, tmp)
            ports, hold = f"{tmp}/ports", f"{tmp}/release"
            example = subprocess.Popen(
                [sys.executable, str(EXAMPLE), "--planner_address", addrs["grpc"], "--cp", "2",
                 "--planners", "service", "--steps", str(STEPS), "--json",
                 "--metrics_ports_file", ports, "--report_profile", PROFILE,
                 "--report_every", "4", "--hold_file", hold, "--hold_s", "150"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # The ranks announce their exporters: give them to Prometheus (file_sd).
            deadline = time.monotonic() + 120
            lines = []
            while len(lines) < 2 and time.monotonic() < deadline and example.poll() is None:
                time.sleep(0.1)
                if os.path.exists(ports):
                    lines = [x.split() for x in pathlib.Path(ports).read_text().splitlines()
                             if x.strip()]
            assert len(lines) == 2, f"ranks announced {lines}; example rc {example.poll()}"
            targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"group": "train",
                                                                     "rank": rank}}
                       for rank, port in sorted(lines)]
            tmp_json = f"{tmp}/p/targets/worker.json.new"
            pathlib.Path(tmp_json).write_text(json.dumps(targets))
            os.replace(tmp_json, f"{tmp}/p/targets/worker.json")
            # Training ends (the ranks then hold); wait for the scrapes to see the last step.
            run_steps = 'flashcp_worker_steps_total{job="flashcp-worker",group="train"}'
            reported = f'flashcp_planner_cost_reported_samples_total{{profile="{PROFILE}"}}'
            want = {run_steps: [STEPS, STEPS], reported: [2 * STEPS]}
            got = {}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    got = {e: _values(base, e) for e in want}
                except OSError:
                    got = {}
                if got == want:
                    break
                time.sleep(0.5)
            assert got == want
            # Every rank's exporter is up, and its series carry the run's labels.
            up = _query(base, 'up{job="flashcp-worker"}')
            assert sorted((s["metric"]["rank"], s["value"][1]) for s in up) == \
                [("0", "1"), ("1", "1")]
            series = _query(base, 'flashcp_worker_bytes_sent_total{group="train"}')
            assert {(s["metric"]["strategy"], s["metric"]["scheme"], s["metric"]["device"])
                    for s in series} == {("flashcp", "targeted", "cpu")}
            scraped_bytes = sum(float(s["value"][1]) for s in series)
            scraped_attention = sum(_values(base, 'flashcp_worker_attention_seconds_total'
                                                  '{group="train"}'))
            comm_count = _values(base, 'flashcp_worker_comm_duration_seconds_count'
                                       '{group="train"}')
            ratios = _values(base, 'flashcp_worker_attention_time_ratio{group="train"}')
            predicted = _values(base, 'flashcp_worker_predicted_imbalance_ratio{group="train"}')
            samples = _values(base, f'flashcp_planner_cost_samples{{profile="{PROFILE}"}}')
            pathlib.Path(hold).touch()
            out, err = example.communicate(timeout=120)
            assert example.returncode == 0, out + err
    finally:
        for p in (example, prometheus):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        flashcp.planner_process.stop(planner)
    run = json.loads(out.strip().splitlines()[-1])["runs"][0]
    ops = run["operations"]
    assert run["cp"] == 2 and run["max_rel"] <= 1e-4  # still equal to training without CP
    assert ops["steps"] == 2 * STEPS
    # The scrape adds up to what the ranks measured: bytes exactly, seconds to rounding.
    assert ops["bytes_sent"] > 0 and scraped_bytes == ops["bytes_sent"]
    assert scraped_attention == pytest.approx(ops["attention_seconds"], rel=1e-9)
    assert comm_count == [STEPS, STEPS]
    assert len(ratios) == 2 and sum(ratios) == pytest.approx(2.0, rel=1e-9)
    assert len(predicted) == 2 and predicted[0] == predicted[1] >= 1.0
    # The calibration window took every rank-step (one tenant: the example's connection).
    assert ops["accepted_samples"] == 2 * STEPS
    assert ops["profile_samples"] >= 2 * STEPS
    assert samples and max(samples) >= 2 * STEPS
