#!/usr/bin/env bash
# The main job: the system running as operators run it, on loopback. Starts
# flashcp-planner; drives it with flashcp-client on a data set and prints the
# plans' quality table per strategy; then for each configuration a CP group of
# 4 CPU flashcp-worker processes (rank 0 is the driver: it streams plans from the
# planner several steps ahead and broadcasts them), runs STEPS steps on a data
# set, and prints the per-strategy table of measured step time, imbalance
# (measured and predicted) and bytes moved against a full-KV exchange. A
# configuration strategy:scheme:PROFILE plans on that cost profile and reports
# step times so the planner calibrates it; a second table shows its measured
# and predicted imbalance before and after the fit took over.
# Then the step-time model's prediction for the same batches beside each measured step
# (scripts/measured_vs_predicted.py, on the loopback link measured by
# scripts/loopback_link.py).
# Progress goes to stderr, the table to stdout. Every process it starts is
# stopped on exit (trap).
#
#   scripts/run-cluster.sh BIN_DIR
#   env: QUALITY_STRATEGIES ("llama3 per_doc zigzag whole_doc flashcp_paper
#        flashcp"), QUALITY_CONTEXT (131072), QUALITY_CP (8), QUALITY_BATCHES (64),
#        STEPS (40 per strategy), CONTEXT (4096), HEADS (2), HEAD_DIM (32),
#        DATASET (pile), RANKS (4), CONFIGS ("llama3:full_kv per_doc:full_kv
#        ring:full_kv zigzag:full_kv magi:targeted whole_doc:allgather
#        flashcp_paper:allgather flashcp:allgather flashcp:targeted
#        flashcp:allgather:cpu-fp32"), CALIBRATION_STEPS (80: steps of a
#        configuration with a cost profile, so that the fit and then the rank
#        speeds take over with steps to spare), TIMEOUT_S (60)
set -euo pipefail
bin=${1:?usage: $0 BIN_DIR}
STEPS=${STEPS:-40}
CONTEXT=${CONTEXT:-4096}
HEADS=${HEADS:-2}
HEAD_DIM=${HEAD_DIM:-32}
DATASET=${DATASET:-pile}
RANKS=${RANKS:-4}
TIMEOUT_S=${TIMEOUT_S:-60}
CALIBRATION_STEPS=${CALIBRATION_STEPS:-80}
CONFIGS=${CONFIGS:-llama3:full_kv per_doc:full_kv ring:full_kv zigzag:full_kv magi:targeted whole_doc:allgather flashcp_paper:allgather flashcp:allgather flashcp:targeted flashcp:allgather:cpu-fp32}

tmp=$(mktemp -d /tmp/flashcp-run.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits (bounded) for a line matching $2 in file $1 and prints it.
await_line() {
  local file=$1 pattern=$2 i
  for i in $(seq 600); do
    if grep -m1 -E "$pattern" "$file" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "run-cluster: no '$pattern' in $file after 60 s" >&2
  cat "$file" >&2 || true
  return 1
}

"$bin/flashcp-planner" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --threads 1 \
  >"$tmp/planner.out" 2>"$tmp/planner.err" &
pids+=($!)
planner=$(await_line "$tmp/planner.out" '^LISTENING ' | sed -E 's/.*grpc=([^ ]+).*/\1/')
echo "run-cluster: planner at $planner; $RANKS CPU ranks per group, $STEPS steps per strategy," \
     "$DATASET, C=$CONTEXT, H=$HEADS, D=$HEAD_DIM" >&2

# Part one: the planner's quality table, every batch planned through the
# service by the client (one server, one table row per strategy).
QUALITY_STRATEGIES=${QUALITY_STRATEGIES:-llama3 per_doc zigzag whole_doc flashcp_paper flashcp}
first=1
for strategy in $QUALITY_STRATEGIES; do
  "$bin/flashcp-client" --server "$planner" --dataset "$DATASET" \
    --context "${QUALITY_CONTEXT:-131072}" --cp "${QUALITY_CP:-8}" \
    --batches "${QUALITY_BATCHES:-64}" --seed 1 --strategy "$strategy" --summary \
    >"$tmp/quality.$strategy" 2>"$tmp/quality.$strategy.err" || {
      echo "run-cluster: flashcp-client failed for $strategy:" >&2
      cat "$tmp/quality.$strategy.err" >&2
      exit 1
    }
  if ((first)); then cat "$tmp/quality.$strategy"; first=0; else tail -n +3 "$tmp/quality.$strategy"; fi
  echo "run-cluster: planned ${QUALITY_BATCHES:-64} $DATASET batches with $strategy" >&2
done
echo

results=()
for config in $CONFIGS; do
  IFS=: read -r strategy scheme profile <<<"$config"
  group="main-${strategy//_/-}-$scheme${profile:+-$profile}"
  group_pids=()
  steps=$STEPS
  if [[ -n $profile && $profile != pairs ]]; then steps=$CALIBRATION_STEPS; fi
  for ((r = 0; r < RANKS; r++)); do
    "$bin/flashcp-worker" --rank "$r" --world_size "$RANKS" --group "$group" --planner "$planner" \
      --dataset "$DATASET" --context "$CONTEXT" --heads "$HEADS" --head_dim "$HEAD_DIM" \
      --strategy "$strategy" --scheme "$scheme" --steps "$steps" --timeout_s "$TIMEOUT_S" \
      --progress_every 25 ${profile:+--cost_profile "$profile"} \
      >"$tmp/$group.$r.out" 2>"$tmp/$group.$r.err" &
    group_pids+=($!)
    pids+=($!)
  done
  echo "run-cluster: $strategy/$scheme${profile:+ (cost $profile)}: group $group started" >&2
  # Progress: the driver's log lines, as they come.
  tail -n +1 -f "$tmp/$group.0.err" --pid "${group_pids[0]}" 2>/dev/null \
    | grep --line-buffered -E 'step [0-9]+/' | sed -u 's/^/  /' >&2 &
  tailer=$!
  failed=0
  for p in "${group_pids[@]}"; do wait "$p" || failed=1; done
  wait "$tailer" 2>/dev/null || true
  if ((failed)); then
    echo "run-cluster: group $group failed:" >&2
    tail -n 5 "$tmp/$group".*.err >&2
    exit 1
  fi
  results+=("$(grep -m1 '^RUN ' "$tmp/$group.0.out" | sed 's/^RUN //')")
done

printf '%s\n' "${results[@]}" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print("Measured on %d CPU ranks (Gloo over loopback): mean per step; bytes are K/V and dK/dV" % int(sys.argv[1]))
print("payload one layer moves, summed over ranks, against a full-KV all-gather of the same steps.")
print("Imbalance: measured on wall time and on the thread CPU time of each rank (the kernel compute,")
print("without the descheduling of 4 ranks on shared cores); predicted by pairs and by the cost profile.")
print("Per step: mean over steps of max/mean over ranks; window: max/mean over ranks of each rank\x27s")
print("sum over the run (as Prometheus rates give it), measured CPU against predicted pairs.")
hdr = ("strategy", "scheme", "cost", "steps", "step ms", "attn fwd+bwd ms", "comm ms", "plan wait ms",
       "imb. meas. wall", "imb. meas. CPU", "imb. pred. pairs", "imb. pred. cost",
       "window: meas. CPU", "window: pred. pairs", "MiB moved/step", "MiB full KV/step", "saving")
print("| " + " | ".join(hdr) + " |")
print("|" + "|".join("---" for _ in hdr) + "|")
for r in rows:
    n = max(1, r["steps"])
    moved, full = r["bytes_sent"] / n / 2**20, r["full_kv_bytes"] / n / 2**20
    w = r["windowed"]
    print("| %s | %s | %s | %d | %.1f | %.1f | %.1f | %.2f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.1f%% |" % (
        r["strategy"], r["scheme"], r["cost_profile"], r["steps"], 1e3 * r["step_seconds"],
        1e3 * r["attention_seconds"], 1e3 * r["comm_seconds"], 1e3 * r["plan_wait_seconds"],
        r["measured_imbalance"], r["measured_cpu_imbalance"], r["predicted_imbalance"],
        r["predicted_cost_imbalance"], w["measured_cpu"], w["predicted"], moved, full,
        100 * (1 - moved / full) if full else 0.0))
cal = [r for r in rows if r["cost_profile"] != "pairs"]
if cal:
    print()
    print("Calibration, per phase: plans on the shipped profile, then on the planner\x27s fit of the")
    print("reported step times (thread CPU time), then on the fit with the driver\x27s rank speeds;")
    print("imbalance measured (CPU) and predicted (the cost model, with the speeds), per step (mean")
    print("of max/mean) and over the phase\x27s window (max/mean of per-rank sums).")
    hdr = ("strategy", "scheme", "cost", "phase", "steps", "first step", "meas. CPU", "pred.", "gap",
           "window: meas. CPU", "window: pred.", "window gap")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" for _ in hdr) + "|")
    for r in cal:
        firsts = (0, r["first_calibrated_step"], r["first_speed_step"])
        for name, key, first in zip(("shipped profile", "fit", "fit + rank speeds"),
                                    ("uncalibrated", "calibrated", "speed_adjusted"), firsts):
            p = r[key]
            if p["steps"] == 0:
                continue
            print("| %s | %s | %s | %s | %d | %d | %.3f | %.3f | %+.3f | %.3f | %.3f | %+.3f |" % (
                r["strategy"], r["scheme"], r["cost_profile"], name, p["steps"], first,
                p["measured_cpu"], p["predicted"], p["measured_cpu"] - p["predicted"],
                p["windowed_measured_cpu"], p["windowed_predicted"],
                p["windowed_measured_cpu"] - p["windowed_predicted"]))
        print("rank speeds at the end (%s): %s" % (r["cost_profile"],
              ", ".join("%.3f" % v for v in r["rank_speed"]) or "none"))
' "$RANKS"

# Part three: the step-time model's prediction for the same batches and strategies
# (core/step_time.h) beside the measured step, on the CPU profile and the loopback link
# measured now (scripts/measured_vs_predicted.py).
here=$(cd "$(dirname "$0")" && pwd)
printf '%s\n' "${results[@]}" >"$tmp/runs.jsonl"
LINK=$(python3 "$here/loopback_link.py")
bw=$(sed -E 's/.*BANDWIDTH_GBPS=([^ ]+).*/\1/' <<<"$LINK")
lat=$(sed -E 's/.*LATENCY_US=([^ ]+).*/\1/' <<<"$LINK")
# The ranks' kernel threads share the host's cores: RANKS / cores when more ranks than cores.
COMPUTE_SCALE=$(python3 -c 'import os, sys; print(max(1.0, int(sys.argv[1]) / os.cpu_count()))' "$RANKS")
preds=()
i=0
for config in $CONFIGS; do
  IFS=: read -r strategy scheme profile <<<"$config"
  steps=$STEPS
  if [[ -n $profile && $profile != pairs ]]; then steps=$CALIBRATION_STEPS; fi
  "$bin/flashcp-plan" --dataset "$DATASET" --context "$CONTEXT" --cp "$RANKS" --batches "$steps" \
    --seed 1 --strategy "$strategy" --heads "$HEADS" --head_dim "$HEAD_DIM" --dtype_bytes 4 \
    --compute_profile cpu-fp32 --profile_query_heads 2 --profile_head_dim 32 \
    --compute_scale "$COMPUTE_SCALE" --overlap_whole_shards=false --ranks_per_node 0 \
    --nvlink_gbytes_per_s "$bw" --nvlink_latency "${lat}us" --quiet >"$tmp/pred.$i.jsonl" || {
      echo "run-cluster: flashcp-plan (prediction) failed for $config" >&2
      exit 1
    }
  preds+=("$tmp/pred.$i.jsonl")
  i=$((i + 1))
done
echo
LINK=$LINK COMPUTE_SCALE=$COMPUTE_SCALE python3 "$here/measured_vs_predicted.py" "$tmp/runs.jsonl" "${preds[@]}"
