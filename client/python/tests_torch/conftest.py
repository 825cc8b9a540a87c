"""Fixtures of the flashcp / flashcp.torch tests: the real flashcp-planner
(port 0) and the flashcp-plan binary, from --planner-bin / --plan-bin."""
import os
import sys

import pytest

import flashcp.planner_process

sys.path.insert(0, os.path.dirname(__file__))  # harness, cases: importable by the ranks


@pytest.fixture(autouse=True)
def _close_clients():
    """Closes every Client a test left open, as the test ends: a channel left
    to Python's garbage collector is closed from gRPC's _ChannelCallState
    __del__, which can deadlock on the channel's condition (the suite hung so,
    intermittently, with every test passed)."""
    yield
    from flashcp_client import client as client_module
    for c in list(client_module._clients):
        c.close()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")


def pytest_addoption(parser):
    parser.addoption("--planner-bin", default=os.environ.get("FLASHCP_PLANNER_BIN", ""),
                     help="path to the flashcp-planner binary")
    parser.addoption("--plan-bin", default=os.environ.get("FLASHCP_PLAN_BIN", ""),
                     help="path to the flashcp-plan binary")


def _binary(request, option):
    path = request.config.getoption(option)
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"{option} {path!r} is not an executable")
    return path


@pytest.fixture(scope="session")
def planner_bin(request):
    return _binary(request, "--planner-bin")


@pytest.fixture(scope="session")
def plan_bin(request):
    return _binary(request, "--plan-bin")


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
