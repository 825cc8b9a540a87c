#!/usr/bin/env bash
# The main job. For now: builds, then compares every sharding strategy on a
# built-in Pile-like batch set with flashcp-plan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >&2
exec build/bin/flashcp-plan --dataset pile --context 131072 --cp 8 --batches 64 --seed 1 --summary "$@"
