#!/usr/bin/env bash
# Plan-neutrality check: flashcp's plans of 15 cells (3 data sets x 5 CP sizes,
# 64 sampled batches each, default flags) written by one build and compared
# byte for byte (cmp) with another's.
#   scripts/plan_cmp.sh save DIR [BIN]    writes DIR/<dataset>_<N>.json
#   scripts/plan_cmp.sh check DIR [BIN]   plans again and cmp's each cell with DIR
# BIN defaults to build/bin/flashcp-plan. Exit status 1 where any cell differs.
set -euo pipefail
mode=${1:?save or check}
dir=${2:?directory}
bin=${3:-build/bin/flashcp-plan}
datasets=(wlbllm pile redpajama)
sizes=(4 8 16 32 64)
mkdir -p "$dir"
status=0
for d in "${datasets[@]}"; do
  for n in "${sizes[@]}"; do
    out="$dir/${d}_${n}.json"
    if [[ $mode == save ]]; then
      "$bin" --dataset "$d" --cp "$n" --batches 64 --quiet >"$out"
    else
      if "$bin" --dataset "$d" --cp "$n" --batches 64 --quiet | cmp - "$out"; then
        echo "same  $d N=$n ($(wc -c <"$out") bytes)"
      else
        echo "DIFF  $d N=$n"
        status=1
      fi
    fi
  done
done
exit $status
