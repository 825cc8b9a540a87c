#!/usr/bin/env bash
# Every program's command line: --help exits 0 and lists the program's flags,
# and a bad value for a numeric flag exits non-zero naming the flag.
#   tool_flags_test.sh BIN_DIR bench|nobench   (nobench: bench/ was not built)
set -uo pipefail
bin=$1
benches=${2:-bench}
failed=0

# help PROGRAM EXPECTED_TEXT: `PROGRAM --help` exits 0 and prints EXPECTED_TEXT.
help() {
  local out rc
  out=$(timeout 20 "$bin/$1" --help 2>&1); rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $1 --help exited $rc: $out"; failed=1
  elif [[ $out != *"$2"* ]]; then
    echo "FAIL: $1 --help does not list $2: $out"; failed=1
  else
    echo "ok: $1 --help lists $2"
  fi
}

# bad PROGRAM FLAG_NAME ARGS...: PROGRAM ARGS exits non-zero naming FLAG_NAME.
bad() {
  local prog=$1 name=$2 out rc
  shift 2
  out=$(timeout 20 "$bin/$prog" "$@" 2>&1 </dev/null); rc=$?
  if [[ $rc -eq 0 || $rc -eq 124 ]]; then
    echo "FAIL: $prog $* exited $rc"; failed=1
  elif [[ $out != *"$name"* ]]; then
    echo "FAIL: $prog $* does not name $name: $out"; failed=1
  else
    echo "ok: $prog $* exits $rc naming $name"
  fi
}

help flashcp-planner "--threads=2"
help flashcp-planner "--listen=0.0.0.0:50051"
help flashcp-worker "--world_size=1"
help flashcp-worker "--gloo_host=127.0.0.1"
help flashcp-plan "--cp N"
help flashcp-client "--cp"
help flashcp-loadgen "--duration"
help flashcp-cpstep "--cp N"
if [[ $benches == bench ]]; then
help engine_step_bench "--head_dim=128"
help plan_quality "--batches"
help planner_soak "--baseline_s="
help plan_latency_bench "--benchmark_filter"
help engine_kernel_bench "--benchmark_filter"
fi

bad flashcp-planner "threads" --threads=abc
bad flashcp-worker "world_size" --world_size=two
bad flashcp-plan "--cp" --cp x
bad flashcp-client "--cp" --server 127.0.0.1:1 --cp x
bad flashcp-loadgen "--duration" --server 127.0.0.1:1 --duration x
bad flashcp-cpstep "--cp" --cp x
if [[ $benches == bench ]]; then
bad engine_step_bench "heads" --heads=x
bad engine_step_bench "--cps" --cps=2,x
bad engine_step_bench "--heads" --heads=0
bad plan_quality "--batches" --batches x
bad planner_soak "baseline_s" --baseline_s=x
fi
exit $failed
