#!/usr/bin/env bash
# Configures and builds FlashCP into build/ (binaries in build/bin, tests in build/tests).
# Installs the Debian packages first, then the Python client's venv (.prefix/venv,
# scripts/setup-python.sh). Extra arguments go to cmake's configure step.
# FLASHCP_SETUP_PYTHON=0 skips the venv (a C++-only build, as the worker images do: CMake then
# skips the Python native module); BUILD_TARGETS="t1 t2" builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[[ ${FLASHCP_SETUP_PYTHON:-1} == 0 ]] || bash scripts/setup-python.sh
# The GPU backend's header-only cuDNN frontend (.prefix/cudnn-frontend), where
# CMake would find nvcc (FLASHCP_CUDA=AUTO looks in PATH and /usr/local/cuda).
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  # Offline without the carried .prefix: CMake (AUTO) warns and skips worker/cuda.
  bash scripts/setup-cudnn-frontend.sh || echo "build.sh: cuDNN frontend setup failed" >&2
fi
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASHCP_WERROR="${FLASHCP_WERROR:-ON}" "$@"
read -r -a targets <<<"${BUILD_TARGETS:-}"
cmake --build "$BUILD_DIR" -j "$JOBS" ${targets[@]:+--target "${targets[@]}"}
