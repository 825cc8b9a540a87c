"""The pytest plugin both test folders (tests/, tests_torch/) load through
their conftest's pytest_plugins: the binaries' options and fixtures, and the
closing of clients a test left open. It lives apart from the packages so that
importing it does not put their sources ahead of the installed copy."""
import os

import pytest


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


def pytest_addoption(parser):
    parser.addoption("--planner-bin", default=os.environ.get("FLASHCP_PLANNER_BIN", ""),
                     help="path to the flashcp-planner binary")
    parser.addoption("--plan-bin", default=os.environ.get("FLASHCP_PLAN_BIN", ""),
                     help="path to the flashcp-plan binary (tests_torch/)")


def _executable(request, option):
    """The path given as `option`; the test fails unless it is executable."""
    path = request.config.getoption(option)
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"{option} {path!r} is not an executable")
    return path


@pytest.fixture(scope="session")
def planner_bin(request):
    return _executable(request, "--planner-bin")


@pytest.fixture(scope="session")
def plan_bin(request):
    return _executable(request, "--plan-bin")
