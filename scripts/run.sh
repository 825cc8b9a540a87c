#!/usr/bin/env bash
# The main job: builds the service binaries, then on loopback starts
# flashcp-planner, drives it with flashcp-client on Pile-like batches (64
# batches of 128K tokens, N = 8, seed 1) and prints the plans' quality table
# per strategy; then runs a CP group of 4 CPU flashcp-worker processes per
# strategy (a few hundred steps in all) and prints the measured table.
# Tables go to stdout; build output, notes and progress to stderr. Tune it with
# the environment variables scripts/run-cluster.sh lists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >&2
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASHCP_WERROR="${FLASHCP_WERROR:-ON}" >&2
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" \
  --target flashcp-planner flashcp-client flashcp-worker flashcp-plan >&2
exec bash scripts/run-cluster.sh "$BUILD_DIR/bin"
