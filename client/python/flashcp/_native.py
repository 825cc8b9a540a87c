"""Loads _flashcp_native, the C++ core's binding (client/python/native).

CMake builds it into <build>/python and writes a .pth file naming that folder
into the venv (scripts/build.sh does both), so `import _flashcp_native` works
in .prefix/venv after a build.
"""
import importlib


def native():
    """The binding module; ImportError saying how to build it if missing."""
    try:
        return importlib.import_module("_flashcp_native")
    except ImportError as e:
        raise ImportError(
            "flashcp's native module _flashcp_native is not importable: build it with "
            "`bash scripts/build.sh` (CMake target _flashcp_native; it needs the venv's "
            f"pybind11 and the Python headers): {e}") from e
