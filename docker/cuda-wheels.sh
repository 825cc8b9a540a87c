#!/usr/bin/env bash
# Assembles CUDA 13 from NVIDIA's pinned PyPI wheels into PREFIX, for the CUDA worker image
# (docker/worker-cuda.Dockerfile), on plain Debian 12: no NVIDIA registry or apt repository.
#   devel:   the compiler (nvcc, crt, nvvm, cccl) and the headers and libraries the build links,
#            laid out as a CUDA toolkit (bin/, include/, lib/, lib64 -> lib, nvvm/,
#            targets/x86_64-linux/{include,lib}, the libX.so links the linker looks for), so
#            CMake's CUDA language and FindCUDAToolkit find it at PREFIX/bin/nvcc.
#   runtime: only lib/, the shared libraries flashcp-worker loads (CUDA runtime, NVRTC, cuDNN,
#            NCCL) and the one cuDNN opens at run time (cuBLASLt, libcublasLt.so.13).
# The GPU driver (libcuda.so.1) is in no wheel: the node's NVIDIA container runtime mounts it.
#   usage: cuda-wheels.sh devel|runtime PREFIX
set -euo pipefail
(($# == 2)) && [[ $1 == devel || $1 == runtime ]] || { echo "usage: $0 devel|runtime PREFIX" >&2; exit 2; }
kind=$1 prefix=$2

# One CUDA 13.0 release; the same versions the development machines' /usr/local/cuda-13.0 holds.
common=(nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88
        nvidia-cudnn-cu13==9.19.0.56 nvidia-nccl-cu13==2.28.9)
devel=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
       nvidia-cuda-cccl==13.0.85)
runtime=(nvidia-cublas==13.1.0.3)
if [[ $kind == devel ]]; then pins=("${common[@]}" "${devel[@]}"); else pins=("${common[@]}" "${runtime[@]}"); fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --target installs outside any Python environment; --no-deps: the pins above are the whole set.
python3 -m pip install --disable-pip-version-check --root-user-action=ignore -q --no-cache-dir --no-deps \
  --only-binary=:all: --target "$tmp/site" "${pins[@]}"
mkdir -p "$prefix"
# The wheels share the tree nvidia/<part>/{bin,include,lib,nvvm} (parts cu13, cudnn, nccl).
for part in "$tmp"/site/nvidia/*/; do
  find "$part" \( -name __init__.py -o -name __pycache__ \) -prune -exec rm -rf {} +
  if [[ $kind == devel ]]; then
    cp -a "$part." "$prefix/"
  elif [[ -d ${part}lib ]]; then
    mkdir -p "$prefix/lib"
    cp -a "${part}lib/." "$prefix/lib/"
  fi
done
cd "$prefix/lib"
if [[ $kind == devel ]]; then
  # The wheels ship only the versioned names (libcudart.so.13); the linker wants libcudart.so.
  for lib in *.so.*; do
    [[ -e ${lib%%.so.*}.so ]] || ln -s "$lib" "${lib%%.so.*}.so"
  done
  cd "$prefix"
  ln -sfn lib lib64
  mkdir -p targets/x86_64-linux
  ln -sfn ../../include targets/x86_64-linux/include
  ln -sfn ../../lib targets/x86_64-linux/lib
  "$prefix/bin/nvcc" --version | tail -n 2 >&2
else
  # Nothing loads these: cuDNN opens libcublasLt only, the .alt NVRTC is an ABI variant that
  # neither cuDNN nor the worker names (about 170 MB together), and *.a are for linking.
  rm -f libcublas.so.* libnvblas.so.* libnvrtc.alt.so.* libnvrtc-builtins.alt.so.* ./*.a
fi
echo "cuda-wheels: $kind (${pins[*]}) in $prefix: $(du -sh "$prefix" | cut -f1)" >&2
