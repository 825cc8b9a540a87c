#!/usr/bin/env bash
# Every program's command line (core/flags.h): --help exits 0 and lists every
# flag the program's sources define (ABSL_FLAG) and no other; an unknown flag,
# a value the flag's type refuses and a value out of range exit 2 (a usage
# error, every program alike) naming the flag; the dashed spelling of one release ago still works, with a
# one-line warning naming the new spelling.
#   tool_flags_test.sh BIN_DIR bench|nobench SRC_DIR   (nobench: bench/ was not built)
set -uo pipefail
bin=$1
benches=${2:-bench}
src=${3:-$(dirname "$0")/..}
failed=0

# flags_of FILE...: the names of the flags FILE... define, one a line, sorted.
flags_of() {
  grep -ohP 'ABSL_FLAG\(\s*[\w:<>, ]+?,\s*\K\w+(?=,)' "$@" | sort -u
}

# help PROGRAM SOURCE...: `PROGRAM --help` exits 0 and lists exactly the flags
# SOURCE... define, each as "  --name=DEFAULT".
help() {
  local prog=$1 out rc want got
  shift
  out=$(timeout 20 "$bin/$prog" --help 2>&1); rc=$?
  want=$(cd "$src" && flags_of "$@")
  got=$(grep -oP '^  --\K\w+(?==)' <<<"$out" | sort -u)
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $prog --help exited $rc: $out"; failed=1
  elif [[ -z $want ]]; then
    echo "FAIL: $prog: no ABSL_FLAG found in $*"; failed=1
  elif [[ $got != "$want" ]]; then
    echo "FAIL: $prog --help lists other flags than $* define:"
    diff <(echo "$want") <(echo "$got"); failed=1
  else
    echo "ok: $prog --help lists its $(wc -l <<<"$want") flags"
  fi
}

# bad PROGRAM FLAG_NAME ARGS...: PROGRAM ARGS exits 2 naming --FLAG_NAME.
bad() {
  local prog=$1 name=$2 out rc
  shift 2
  out=$(timeout 20 "$bin/$prog" "$@" 2>&1 </dev/null); rc=$?
  if [[ $rc -ne 2 ]]; then
    echo "FAIL: $prog $* exited $rc, not 2: $out"; failed=1
  elif [[ $out != *"$name"* ]]; then
    echo "FAIL: $prog $* does not name $name: $out"; failed=1
  else
    echo "ok: $prog $* exits $rc naming $name"
  fi
}

# warn PROGRAM OLD NEW ARGS...: PROGRAM ARGS (ARGS spell --OLD) writes one
# line to stderr saying --OLD is deprecated for --NEW, and takes the value
# (the run then fails at a later check or succeeds; either is fine here).
warn() {
  local prog=$1 old=$2 new=$3 err rc lines
  shift 3
  err=$(timeout 20 "$bin/$prog" "$@" 2>&1 >/dev/null </dev/null); rc=$?
  lines=$(grep -c -- "--$old is deprecated; use --$new" <<<"$err")
  if [[ $rc -eq 124 ]]; then
    echo "FAIL: $prog $* timed out"; failed=1
  elif [[ $lines -ne 1 ]]; then
    echo "FAIL: $prog $* warns $lines times for --$old: $err"; failed=1
  elif [[ $err == *"unknown flag"* ]]; then
    echo "FAIL: $prog $* refuses --$old: $err"; failed=1
  else
    echo "ok: $prog $* warns once: --$old -> --$new"
  fi
}

help flashcp-planner planner_service/main.cc core/runtime/metrics_endpoint/endpoint_flags.cc
help flashcp-worker worker/worker_main.cc client/internal/tls_flags.cc \
  core/runtime/metrics_endpoint/endpoint_flags.cc
help flashcp-plan core/cli_args.cc core/cluster_flags.cc
help flashcp-client client/client_main.cc client/internal/tool_flags.cc client/internal/tls_flags.cc
help flashcp-loadgen client/loadgen_main.cc client/internal/tool_flags.cc \
  client/internal/tls_flags.cc
help flashcp-cpstep worker/cpstep_main.cc
if [[ -x $bin/flashcp-gpu-bench ]]; then
  help flashcp-gpu-bench worker/cuda/gpu_bench_main.cc
  bad flashcp-gpu-bench "--mode" --mode=bogus
fi

for prog in flashcp-planner flashcp-worker flashcp-plan flashcp-client flashcp-loadgen \
            flashcp-cpstep; do
  bad "$prog" "--no_such_flag" --no_such_flag=1
  bad "$prog" "--no-such-flag" --no-such-flag=1
done
bad flashcp-planner "--threads" --threads=abc
bad flashcp-planner "--threads" --threads=1.5
bad flashcp-planner "stray" stray
bad flashcp-planner "--handshake_timeout" --handshake_timeout=0
bad flashcp-planner "--serve" --serve=store
bad flashcp-worker "--world_size" --world_size=two
bad flashcp-worker "--world_size" --world-size=two
bad flashcp-worker "--heads" --heads=0
bad flashcp-worker "--dataset" --dataset=c4
bad flashcp-worker "--attention_mask" --attention_mask=bidirectional
bad flashcp-worker "--block_size" --attention_mask=block_diffusion
bad flashcp-worker "--block_size" --attention_mask=block_diffusion --block_size=0
bad flashcp-worker "--block_size" --block_size=4
bad flashcp-loadgen "--dataset" --server 127.0.0.1:1 --dataset=c4
bad flashcp-client "--batches" --server 127.0.0.1:1 --dataset=pile --batches=0
bad flashcp-plan "--cp" --cp=abc
bad flashcp-plan "--cp" --cp -3 8 8
bad flashcp-plan "--min_shard_tokens" --min_shard_tokens=-1 8 8
bad flashcp-plan "--target_imbalance" --target-imbalance x 8 8
bad flashcp-plan "--cp" --cp
bad flashcp-client "--cp" --server 127.0.0.1:1 --cp=abc
bad flashcp-client "--cp" --server 127.0.0.1:1 --cp=-3
bad flashcp-client "--min_shard_tokens" --server 127.0.0.1:1 --min_shard_tokens=-1
bad flashcp-client "--server" --cp 2
bad flashcp-loadgen "--duration" --server 127.0.0.1:1 --duration x
bad flashcp-loadgen "--max_requests" --server 127.0.0.1:1 --max-requests=0
bad flashcp-cpstep "--cp" --cp=abc
bad flashcp-cpstep "--cp" --cp=-3 --strategy ring --scheme targeted --heads 1 --head_dim 8
bad flashcp-cpstep "--head_dim" --cp 2 --strategy ring --scheme targeted --heads 1

warn flashcp-planner queue-size queue_size --queue-size=5 --serve=bogus
warn flashcp-worker world-size world_size --world-size=1 --dataset=bogus
warn flashcp-plan target-imbalance target_imbalance --target-imbalance 1.05 --cp 2 --quiet 8 8
warn flashcp-client connect-timeout connect_timeout --connect-timeout=0 --server 127.0.0.1:1 \
  --cp=0
warn flashcp-loadgen max-requests max_requests --max-requests=1 --server 127.0.0.1:1 --cp=0
warn flashcp-cpstep head-dim head_dim --head-dim 8 --cp 0 --strategy ring --scheme targeted \
  --heads 1

if [[ $benches == bench ]]; then
  help engine_step_bench bench/engine_step_bench.cc
  help plan_quality bench/plan_quality.cc core/cluster_flags.cc
  help planner_soak bench/planner_soak.cc
  help rank_cost_fit bench/rank_cost_fit.cc
  help service_overhead bench/service_overhead.cc
  # Google Benchmark's own flags (--benchmark_*), spelled with underscores too.
  for prog in plan_latency_bench engine_kernel_bench; do
    out=$(timeout 20 "$bin/$prog" --help 2>&1)
    if [[ $out == *"--benchmark_filter"* ]]; then
      echo "ok: $prog --help lists --benchmark_filter"
    else
      echo "FAIL: $prog --help: $out"; failed=1
    fi
  done
  for prog in engine_step_bench plan_quality planner_soak rank_cost_fit service_overhead; do
    bad "$prog" "--no_such_flag" --no_such_flag=1
  done
  bad engine_step_bench "--heads" --heads=x
  bad engine_step_bench "--cps" --cps=2,x
  bad engine_step_bench "--heads" --heads=0
  bad plan_quality "--batches" --batches x
  bad plan_quality "--batches" --batches=-1
  bad plan_quality "--ilp_cps" --ilp-cps=0
  bad planner_soak "--baseline_s" --baseline_s=x
  bad rank_cost_fit "--cp" --cp=-3
  bad rank_cost_fit "--reps" --reps=abc
  bad service_overhead "--batches" --batches=0
  bad service_overhead "--passes" --passes=x
  bad service_overhead "--cells" --cells=pile:131072
  warn engine_step_bench head-dim head_dim --head-dim=8 --heads=0
  warn plan_quality min-shard-tokens min_shard_tokens --min-shard-tokens=1 --batches=-1
  warn planner_soak baseline-s baseline_s --baseline-s=1 --abuse=bogus
  warn rank_cost_fit head-dim head_dim --head-dim 0
fi
exit $failed
