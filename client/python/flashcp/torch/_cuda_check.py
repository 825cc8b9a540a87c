"""Whether the native module's CUDA runtime is the one of the torch it runs in.

The native module's CUDA hook links the CUDA runtime it was built with
(libcudart.so.MAJOR); torch links its own. Where the majors differ, both
runtimes end up mapped in one process and CUDA objects (streams, memory)
cross between them: refuse the CUDA path then, with what to rebuild, instead
of failing later in a kernel. Read from the module's ELF dynamic section
(DT_NEEDED) and the libraries mapped in this process (/proc/self/maps: what
the module's own libraries pulled in too), no CUDA call: it runs, and is
tested, on a machine without GPUs.
The pinned torch (2.11.0+cu130) and the system toolkit that builds the
module are both CUDA 13, so they agree. cuDNN is not checked here: module
and torch share one soname (libcudnn.so.9), so one cuDNN is loaded, torch's
(9.19.0 in the pinned wheel, the system's 9.19.0 too); cuDNN runs an
application built against an older or equal minor, not a newer one
(docs/gpu.md).
"""
import re
from typing import List, Optional

import torch

from flashcp._native import needed_libraries  # noqa: F401  (the ELF reader, used below)

def mapped_libraries(maps: str) -> List[str]:
    """The file names of the objects mapped in a /proc/PID/maps text."""
    names = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            name = parts[5].rsplit("/", 1)[-1]
            if name not in names:
                names.append(name)
    return names


def cuda_runtime_mismatch(libs: List[str], torch_cuda: Optional[str]) -> Optional[str]:
    """A message where a CUDA runtime among `libs` (file names:
    libcudart.so.MAJOR[.minor...]) is not torch's CUDA major
    (torch.version.cuda, e.g. "12.4"); None where every one agrees, or where
    there is none (a CPU build)."""
    majors = sorted({int(m.group(1)) for lib in libs
                     for m in [re.fullmatch(r"libcudart\.so\.(\d+)(\.[0-9.]*)?", lib)] if m})
    if not majors:
        return None
    if torch_cuda is None:
        return (f"flashcp's native module links the CUDA {majors[0]} runtime, but this torch "
                f"({torch.__version__}) has no CUDA: install a CUDA build of torch")
    want = int(torch_cuda.split(".")[0])
    other = [m for m in majors if m != want]
    if other:
        return (f"flashcp's native module links the CUDA {other[0]} runtime "
                f"(libcudart.so.{other[0]}) but torch {torch.__version__} runs CUDA "
                f"{torch_cuda}: both runtimes would be loaded in one process. Rebuild the "
                f"module against CUDA {want} (scripts/build.sh with that nvcc), or install "
                f"a torch built for CUDA {other[0]}")
    return None


_checked: Optional[str] = None


def check_native_cuda_runtime(module_path: str) -> None:
    """RuntimeError where cuda_runtime_mismatch finds one in the module's
    DT_NEEDED or this process's mapped libraries (checked once)."""
    global _checked
    if _checked is None:
        try:
            with open("/proc/self/maps") as f:
                mapped = mapped_libraries(f.read())
        except OSError:  # not Linux: the module's own entries only
            mapped = []
        _checked = cuda_runtime_mismatch(needed_libraries(module_path) + mapped,
                                         torch.version.cuda) or ""
    if _checked:
        raise RuntimeError(_checked)
