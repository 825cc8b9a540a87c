#!/usr/bin/env bash
# The main job. Part one builds flashcp-plan (only that target, so the job does
# not wait on the rest of the tree), then compares every sharding strategy on a
# built-in Pile-like batch set: 64 batches of 128K tokens drawn from the Pile
# distribution (../shared/datasets/; seed 1), N = 8 ranks. The table goes to
# stdout; build output, notes and progress to stderr. Extra arguments go to
# flashcp-plan (e.g. --cp 4, --dataset wlbllm, --strategy flashcp,ilp).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >&2
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASHCP_WERROR="${FLASHCP_WERROR:-ON}" >&2
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target flashcp-plan >&2
"$BUILD_DIR/bin/flashcp-plan" --dataset pile --context 131072 --cp 8 --batches 64 --seed 1 \
  --summary "$@"
# Part two (skip with RUN_CLUSTER=0): the planner, 4 CPU workers and the driver
# on loopback, a few hundred steps, the measured per-strategy table
# (scripts/run-cluster.sh; STEPS, CONTEXT, CONFIGS... tune it).
if [[ ${RUN_CLUSTER:-1} != 0 ]]; then
  cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target flashcp-planner flashcp-worker >&2
  echo >&2
  bash scripts/run-cluster.sh "$BUILD_DIR/bin"
fi
