"""Fixtures of the flashcp / flashcp.torch tests: the real flashcp-planner
(port 0) and the flashcp-plan binary, from --planner-bin / --plan-bin
(the options, planner_bin, plan_bin and closing clients:
../testing/flashcp_pytest.py)."""
import os
import pathlib
import sys

import pytest

import flashcp.planner_process

sys.path.insert(0, os.path.dirname(__file__))  # harness, cases: importable by the ranks
# The shared plugin: only its folder goes on sys.path, so flashcp and
# flashcp_client still come from the installed copy.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "testing"))
pytest_plugins = ["flashcp_pytest"]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")


# flashcp_client's channel options set grpc.min_reconnect_backoff_ms to 100,
# which gRPC core also takes as the minimum connect timeout: on a loaded
# machine a connection's handshake can take longer and the call fails
# UNAVAILABLE ("timed out before receiving SETTINGS frame"). These tests give
# the connection 5 s (the caller's options come first; gRPC takes the first).
CLIENT_OPTIONS = (("grpc.min_reconnect_backoff_ms", 5000),)


@pytest.fixture(scope="session")
def planner_address(planner_bin):
    # --allow_ilp: test_plan compares the in-process ILP with the service's.
    with flashcp.planner_process.start(planner_bin, ["--allow_ilp"]) as address:
        yield address
