#!/usr/bin/env bash
# The test command: installs what is needed, builds with warnings as errors,
# runs every test (unit, integration, end-to-end) through ctest.
# GPU tests carry the label "gpu" and skip cleanly where no device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
