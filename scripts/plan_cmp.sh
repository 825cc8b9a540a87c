#!/usr/bin/env bash
# Plan-neutrality check: flashcp's plans of 15 cells (3 data sets x 5 CP sizes,
# 64 sampled batches each, default flags) written by one build and compared
# byte for byte (cmp) with another's.
#   scripts/plan_cmp.sh save DIR [BIN]    writes DIR/<dataset>_<N>.json
#   scripts/plan_cmp.sh check DIR [BIN]   plans again and cmp's each cell with DIR
# BIN defaults to build/bin/flashcp-plan. Exit status 1 where any cell differs;
# check then prints which plans of the cell changed and how
# (scripts/plan_diff.py: shards, moved tokens, imbalance, targeted bottleneck,
# before -> after). PLAN_CMP_FLAGS adds flashcp-plan flags to both modes
# (e.g. PLAN_CMP_FLAGS="--strategy zigzag" for a strategy the fingerprint
# test names).
set -euo pipefail
mode=${1:?save or check}
dir=${2:?directory}
bin=${3:-build/bin/flashcp-plan}
datasets=(wlbllm pile redpajama)
sizes=(4 8 16 32 64)
read -r -a flags <<<"${PLAN_CMP_FLAGS:-}"
here=$(dirname "$0")
mkdir -p "$dir"
status=0
for d in "${datasets[@]}"; do
  for n in "${sizes[@]}"; do
    out="$dir/${d}_${n}.json"
    if [[ $mode == save ]]; then
      "$bin" --dataset "$d" --cp "$n" --batches 64 --quiet ${flags[@]+"${flags[@]}"} >"$out"
    else
      now=$(mktemp)
      "$bin" --dataset "$d" --cp "$n" --batches 64 --quiet ${flags[@]+"${flags[@]}"} >"$now"
      if cmp -s "$now" "$out"; then
        echo "same  $d N=$n ($(wc -c <"$out") bytes)"
      else
        echo "DIFF  $d N=$n"
        python3 "$here/plan_diff.py" "$out" "$now" || true
        status=1
      fi
      rm -f "$now"
    fi
  done
done
exit $status
