"""Loads _flashcp_native, the C++ core's binding (client/python/native).

CMake builds it into <build>/python and writes a .pth file naming that folder
into the venv (scripts/build.sh does both), so `import _flashcp_native` works
in .prefix/venv after a build.

A CUDA build of the module links libcudart.so.13 and libcudnn.so.9 with the
system toolkit as its RUNPATH. Loaded before torch, those resolve to the
toolkit's copies, and torch then loads its wheels' copies beside them (two
CUDA runtimes and two cuDNNs of one major in the process). So where the
module links a CUDA runtime and torch is installed, native() imports torch
first: the module's dependencies then resolve, by soname, to torch's.
"""
import importlib
import importlib.util
import struct
import sys
from typing import List


def links_cuda_runtime(path: str) -> bool:
    """Whether the shared object at `path` links a CUDA runtime
    (libcudart.so.*); False for a file that is not an ELF object."""
    try:
        return any(lib.startswith("libcudart.so") for lib in needed_libraries(path))
    except (OSError, ValueError):
        return False


def _torch_first() -> None:
    """Imports torch before a CUDA build of the module (module docstring)."""
    if "_flashcp_native" in sys.modules or "torch" in sys.modules:
        return
    spec = importlib.util.find_spec("_flashcp_native")
    if (spec is not None and spec.origin and links_cuda_runtime(spec.origin)
            and importlib.util.find_spec("torch") is not None):
        import torch  # noqa: F401


def native():
    """The binding module; ImportError saying how to build it if missing."""
    _torch_first()
    try:
        return importlib.import_module("_flashcp_native")
    except ImportError as e:
        raise ImportError(
            "flashcp's native module _flashcp_native is not importable: build it with "
            "`bash scripts/build.sh` (CMake target _flashcp_native; it needs the venv's "
            f"pybind11 and the Python headers): {e}") from e


_SHT_DYNAMIC = 6
_DT_NEEDED = 1


def needed_libraries(path: str) -> List[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared object;
    ValueError for anything else."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    out = []
    for _, typ, _, _, off, size, link, _, _, entsize in sections:
        if typ != _SHT_DYNAMIC:
            continue
        strtab_off = sections[link][4]
        for pos in range(off, off + size, entsize or 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                end = data.index(b"\0", strtab_off + val)
                out.append(data[strtab_off + val:end].decode())
    return out
