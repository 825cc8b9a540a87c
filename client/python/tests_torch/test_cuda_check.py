"""flashcp.torch's CUDA-runtime check (flashcp/torch/_cuda_check.py), run
without a GPU: ELF DT_NEEDED entries of real shared objects, the mapped
libraries of this process, and the refusal's message."""
import os
import shutil
import subprocess

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


def _stub_elf(tmp_path, needed: str) -> str:
    """A real shared object made by the C compiler whose one CUDA runtime
    DT_NEEDED entry is `needed` (a stub library of that soname)."""
    cc_bin = shutil.which("cc") or shutil.which("gcc")
    if cc_bin is None:
        pytest.skip("no C compiler to make the ELF files")
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "x.c"
    src.write_text("int flashcp_stub(void) { return 0; }\n")
    stub = tmp_path / needed
    subprocess.run([cc_bin, "-shared", "-fPIC", f"-Wl,-soname,{needed}", "-o", str(stub),
                    str(src)], check=True)
    mod = tmp_path / "_module.so"
    subprocess.run([cc_bin, "-shared", "-fPIC", "-o", str(mod), str(src), "-Wl,--no-as-needed",
                    str(stub)], check=True)
    return str(mod)


def test_a_module_of_torch_cuda_major_is_accepted_another_refused(tmp_path):
    # The pinned torch (2.11.0+cu130) runs CUDA 13, as the system toolkit
    # (/usr/local/cuda, nvcc 13) that builds the module: a module linking
    # libcudart.so.13 is accepted; one linking libcudart.so.12 (a CUDA 12
    # toolkit's) is refused. Real ELF files, read as the check reads them.
    assert torch.version.cuda is not None and torch.version.cuda.startswith("13."), \
        f"the pinned torch is a CUDA 13 build, not {torch.__version__}"
    want = torch.version.cuda.split(".")[0]
    same = cc.needed_libraries(_stub_elf(tmp_path / "a", f"libcudart.so.{want}"))
    assert f"libcudart.so.{want}" in same
    assert cc.cuda_runtime_mismatch(same, torch.version.cuda) is None
    older = cc.needed_libraries(_stub_elf(tmp_path / "b", "libcudart.so.12"))
    assert cc.cuda_runtime_mismatch(older, torch.version.cuda) == (
        f"flashcp's native module links the CUDA 12 runtime (libcudart.so.12) but torch "
        f"{torch.__version__} runs CUDA {torch.version.cuda}: both runtimes would be loaded in "
        f"one process. Rebuild the module against CUDA {want} (scripts/build.sh with that "
        f"nvcc), or install a torch built for CUDA 12")


def test_check_native_cuda_runtime_refuses_a_cuda_12_module(tmp_path, monkeypatch):
    # The check itself (the module's DT_NEEDED and this process's maps) on
    # a CUDA 12 module beside this torch (its cached answer reset, then
    # restored by monkeypatch).
    monkeypatch.setattr(cc, "_checked", None)
    with pytest.raises(RuntimeError, match=r"links the CUDA 12 runtime \(libcudart\.so\.12\)"):
        cc.check_native_cuda_runtime(_stub_elf(tmp_path, "libcudart.so.12"))


def test_this_process_is_checked_by_its_own_build():
    # A CPU build's module maps no CUDA runtime and passes; a module built
    # with the toolkit's nvcc (CUDA 13) beside the pinned cu130 torch passes
    # too (one libcudart.so.13 in the process). Only another major is refused.
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


def test_links_cuda_runtime_reads_the_module_s_elf(tmp_path):
    # native() imports torch before a module that links a CUDA runtime, so
    # that its libcudart / libcudnn resolve to torch's copies (flashcp/_native.py).
    from flashcp import _native
    assert _native.links_cuda_runtime(_stub_elf(tmp_path / "a", "libcudart.so.13"))
    assert _native.links_cuda_runtime(native().__file__) == native().cuda_built
    p = tmp_path / "x.so"
    p.write_bytes(b"#!/bin/sh\n")
    assert not _native.links_cuda_runtime(str(p))
    assert not _native.links_cuda_runtime(str(tmp_path / "missing.so"))
