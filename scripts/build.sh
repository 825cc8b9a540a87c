#!/usr/bin/env bash
# Configures and builds FlashCP into build/ (binaries in build/bin, tests in build/tests).
# Installs the Debian packages first, then the Python client's venv (.prefix/venv,
# scripts/setup-python.sh). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/setup-python.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASHCP_WERROR="${FLASHCP_WERROR:-ON}" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
