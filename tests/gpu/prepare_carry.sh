#!/usr/bin/env bash
# Run HERE (a machine with a package registry and the Debian build deps), not
# on the lent GPU machine: builds the device check's programs for sm_90a
# (Release) and collects them, with the shared libraries they need that a CUDA
# image lacks (abseil, Gloo, CBC...), into .gpu-carry/ (git-ignored). The lent
# machine has nvcc, CMake and PyTorch but not the project's Debian packages,
# so tests/gpu/device_check.sh builds there when it can and otherwise runs
# these. CUDA's own libraries (cudart, cuDNN, NCCL, NVRTC, the driver) are NOT
# carried: the machine's are used.
#
#   bash tests/gpu/prepare_carry.sh        # then carry: .gpu-carry .prefix/cudnn-frontend
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build-gpu-carry}
JOBS=${JOBS:-$(nproc)}
DEST=.gpu-carry
TARGETS=(flashcp-gpu-bench worker_cuda_attention_test worker_cuda_communicator_test
         worker_cuda_cp_step_test worker_cuda_rank_backend_test worker_cuda_graph_cache_test)

bash scripts/setup-cudnn-frontend.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCP_WERROR=ON \
  -DFLASHCP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
cp "$BUILD_DIR/bin/flashcp-gpu-bench" "$DEST/bin/"
for t in "${TARGETS[@]:1}"; do cp "$BUILD_DIR/tests/$t" "$DEST/bin/"; done
strip --strip-debug "$DEST"/bin/*
# Shared libraries outside glibc and the CUDA stack.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda\.so|libcudart|libcudnn|libnccl|libnvrtc|libcublas)'
for b in "$DEST"/bin/*; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then cp -L "$path" "$DEST/lib/$name"; fi
done
git rev-parse HEAD > "$DEST/COMMIT"
du -sh "$DEST"
echo "prepare_carry: carry .gpu-carry and .prefix/cudnn-frontend (64 MiB in all)" >&2
