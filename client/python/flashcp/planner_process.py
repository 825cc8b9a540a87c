"""Starts a local flashcp-planner for examples and tests: loopback, port 0,
the address read back from its LISTENING line (planner_service/server.h's
ListeningLine: "LISTENING grpc=HOST:PORT metrics=HOST:PORT").

    with flashcp.planner_process.start("build/bin/flashcp-planner") as address:
        plan = flashcp.Client(address).plan([4096, 100], cp_size=2)
"""
import contextlib
import os
import select
import signal
import subprocess
import time
from typing import Dict, Iterator, Sequence, Tuple


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


def launch(binary: str, extra_args: Sequence[str] = (), *,
           startup_timeout: float = 60.0) -> Tuple[subprocess.Popen, str]:
    """Runs `binary` on 127.0.0.1:0 (gRPC and metrics; a later --listen in
    extra_args wins, e.g. to restart on a known port) and returns the process
    and its gRPC HOST:PORT once it listens. The caller stops it (stop())."""
    proc, fields = launch_listening(binary, extra_args, startup_timeout=startup_timeout)
    return proc, fields["grpc"]


def launch_listening(binary: str, extra_args: Sequence[str] = (), *,
                     startup_timeout: float = 60.0) -> Tuple[subprocess.Popen, Dict[str, str]]:
    """As launch(), returning the LISTENING line's fields: {"grpc":
    HOST:PORT, "metrics": HOST:PORT} (the metrics endpoint, for a scraper)."""
    if not binary or not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"flashcp-planner {binary!r} is not an executable")
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                             *extra_args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        line = _read_listening_line(proc, time.monotonic() + startup_timeout)
    except BaseException:
        stop(proc)
        raise
    return proc, dict(part.split("=", 1) for part in line.split()[1:])


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    """Sends `sig` (SIGTERM: drain), SIGKILL after 60 s, and returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    proc.stdout.close()
    return code


@contextlib.contextmanager
def start(binary: str, extra_args: Sequence[str] = (), *,
          startup_timeout: float = 60.0) -> Iterator[str]:
    """Runs `binary` on 127.0.0.1:0 (gRPC and metrics) and yields its gRPC
    HOST:PORT; SIGTERM (then SIGKILL after 60 s) on exit."""
    proc, address = launch(binary, extra_args, startup_timeout=startup_timeout)
    try:
        yield address
    finally:
        stop(proc)
