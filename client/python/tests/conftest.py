"""Starts the real flashcp-planner on port 0 for the tests and reads its
address back from the LISTENING line (every wait has a deadline)."""
import os
import select
import signal
import subprocess
import time

import pytest

STARTUP_TIMEOUT_S = 60.0


def pytest_addoption(parser):
    parser.addoption("--planner-bin", default=os.environ.get("FLASHCP_PLANNER_BIN", ""),
                     help="path to the flashcp-planner binary")


def _read_listening_line(proc: subprocess.Popen, deadline: float) -> str:
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise RuntimeError(f"flashcp-planner exited before listening (code {proc.wait()})")
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"LISTENING "):
                return line.decode()
    raise RuntimeError("flashcp-planner did not print its LISTENING line in time")


@pytest.fixture(scope="session")
def planner_address(request):
    binary = request.config.getoption("--planner-bin")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"--planner-bin {binary!r} is not an executable flashcp-planner")
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        line = _read_listening_line(proc, time.monotonic() + STARTUP_TIMEOUT_S)
        # LISTENING grpc=HOST:PORT metrics=HOST:PORT
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        yield fields["grpc"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
