"""flashcp.torch's CUDA-runtime check (flashcp/torch/_cuda_check.py), run
without a GPU: ELF DT_NEEDED entries of real shared objects, the mapped
libraries of this process, and the refusal's message."""
import os

import pytest
import torch

from flashcp._native import native
from flashcp.torch import _cuda_check as cc


def test_needed_libraries_read_real_shared_objects():
    mine = cc.needed_libraries(native().__file__)
    assert "libc.so.6" in mine and "libstdc++.so.6" in mine
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    if not os.path.exists(lib):
        pytest.skip("this torch has no libtorch_cuda.so")
    major = torch.version.cuda.split(".")[0]
    assert f"libcudart.so.{major}" in cc.needed_libraries(lib)


def test_needed_libraries_refuses_a_non_elf_file(tmp_path):
    p = tmp_path / "x.so"
    p.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF file"):
        cc.needed_libraries(str(p))


def test_mapped_libraries_of_a_maps_text():
    maps = ("7f00-7f10 r--p 00000000 08:01 12 /usr/local/cuda/lib64/libcudart.so.13.0.96\n"
            "7f10-7f20 r-xp 00001000 08:01 12 /usr/local/cuda/lib64/libcudart.so.13.0.96\n"
            "7f20-7f30 rw-p 00000000 00:00 0 [heap]\n"
            "7f30-7f40 r--p 00000000 08:01 13 /venv/nvidia/cuda_runtime/lib/libcudart.so.12\n")
    assert cc.mapped_libraries(maps) == ["libcudart.so.13.0.96", "libcudart.so.12"]


def test_a_second_cuda_runtime_is_refused_naming_both():
    msg = cc.cuda_runtime_mismatch(["libc.so.6", "libcudart.so.13.0.96", "libcudart.so.12"],
                                   "12.4")
    assert msg == (f"flashcp's native module links the CUDA 13 runtime (libcudart.so.13) but "
                   f"torch {torch.__version__} runs CUDA 12.4: both runtimes would be loaded "
                   "in one process. Rebuild the module against CUDA 12 (scripts/build.sh with "
                   "that nvcc), or install a torch built for CUDA 13")
    assert cc.cuda_runtime_mismatch(["libcudart.so.12"], "12.4") is None
    assert cc.cuda_runtime_mismatch(["libc.so.6"], "12.4") is None  # a CPU build
    assert cc.cuda_runtime_mismatch(["libcudart.so.12"], None).startswith(
        "flashcp's native module links the CUDA 12 runtime, but this torch")


def test_this_process_is_checked_by_its_own_build():
    # A CPU build's module maps no CUDA runtime and passes; a module built
    # with the toolkit's nvcc (CUDA 13 by default) beside the pinned cu124
    # torch is refused, naming both (docs/gpu.md: what waits).
    with open("/proc/self/maps") as f:
        libs = cc.needed_libraries(native().__file__) + cc.mapped_libraries(f.read())
    want = cc.cuda_runtime_mismatch(libs, torch.version.cuda)
    if want is None:
        cc.check_native_cuda_runtime(native().__file__)
    else:
        assert "both runtimes would be loaded" in want
        with pytest.raises(RuntimeError) as e:
            cc.check_native_cuda_runtime(native().__file__)
        assert str(e.value) == want
