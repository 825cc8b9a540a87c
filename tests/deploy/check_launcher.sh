#!/usr/bin/env bash
# docker/flashcp-launch-ranks.sh, with a stub in place of flashcp-worker: global ranks,
# devices and ports per local index, the pod IP (FLASHCP_GLOO_HOST) as every rank's --gloo_host
# and the rendezvous address, NCCL's settings reaching every rank's environment, SIGTERM
# forwarded to every rank, one failing rank stopping the others with its exit status, and bad
# settings (a multi-node group without a pod IP) refused with status 2.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
launch=$root/docker/flashcp-launch-ranks.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The stub logs its arguments, exits 0 on SIGTERM (finishing "its step"), exits 7 if it is
# STUB_FAIL_RANK, and otherwise sleeps STUB_SLEEP seconds.
cat > "$tmp/stub" <<'STUB'
#!/usr/bin/env bash
rank=$2
echo "$*" >> "$STUB_LOG"
env | grep -E '^(NCCL_|FLASHCP_JOB_SECRET=)' | sort | sed "s/^/env $rank /" >> "$STUB_LOG" || true
if [[ -n ${STUB_IGNORE_TERM:-} ]]; then
  trap 'echo "ignored term $rank" >> "$STUB_LOG"' TERM
else
  trap 'echo "term $rank" >> "$STUB_LOG"; kill "$sleeper" 2>/dev/null; exit 0' TERM
fi
[[ ${STUB_FAIL_RANK:-} == "$rank" ]] && { sleep 0.2; exit 7; }
# In the background with no inherited output, so that SIGTERM interrupts the wait and a
# leftover sleep cannot hold ctest's output pipe open.
sleep "${STUB_SLEEP:-0}" >/dev/null 2>&1 &
sleeper=$!
# A trapped signal ends `wait` early; a stub ignoring SIGTERM goes back to waiting.
while ! wait "$sleeper" && [[ -n ${STUB_IGNORE_TERM:-} ]] && kill -0 "$sleeper" 2>/dev/null; do :; done
STUB
chmod +x "$tmp/stub"
export STUB_LOG=$tmp/log FLASHCP_WORKER=$tmp/stub FLASHCP_PLANNER=planner:50051

# 1. Pod 1 of 2 with 4 GPUs: ranks 4..7, cuda:0..3, the pod IP as --gloo_host, the
# rendezvous, control 50061..50064, metrics 9470..9473; args passed through; NCCL's settings in
# every rank's environment. (10.1.2.3 is only an argument: the stub contacts nothing.)
: > "$tmp/log"
FLASHCP_NODES=2 FLASHCP_RANKS_PER_NODE=4 HOSTNAME=flashcp-worker-1 FLASHCP_GROUP=g7 \
  FLASHCP_GLOO_HOST=10.1.2.3 FLASHCP_RENDEZVOUS=rdv:50052 NCCL_SOCKET_IFNAME=eth0 \
  NCCL_IB_HCA=mlx5_0,mlx5_1 bash "$launch" --strategy flashcp --steps 3 2>"$tmp/err" ||
  fail "launcher exited $? with healthy ranks"
for k in 0 1 2 3; do
  want="--rank $((4 + k)) --world_size 8 --group g7 --planner planner:50051 --rendezvous rdv:50052 --gloo_host 10.1.2.3 --control 0.0.0.0:$((50061 + k)) --metrics 0.0.0.0:$((9470 + k)) --device cuda:$k --local_rank $k --strategy flashcp --steps 3"
  grep -qxF -- "$want" "$tmp/log" || fail "no worker started as: $want"$'\n'"$(cat "$tmp/log")"
  grep -qxF -- "env $((4 + k)) NCCL_IB_HCA=mlx5_0,mlx5_1" "$tmp/log" &&
    grep -qxF -- "env $((4 + k)) NCCL_SOCKET_IFNAME=eth0" "$tmp/log" ||
    fail "rank $((4 + k)) lacks NCCL's settings: $(cat "$tmp/log")"
done
[[ $(grep -vc '^env ' "$tmp/log") -eq 4 ]] || fail "expected 4 workers: $(cat "$tmp/log")"
grep -qF "gloo host 10.1.2.3, rendezvous rdv:50052, no job secret, NCCL_IB_HCA=mlx5_0,mlx5_1 NCCL_SOCKET_IFNAME=eth0" \
  "$tmp/err" || fail "settings not logged: $(cat "$tmp/err")"

# 1b. One node: loopback Gloo and the planner as the rendezvous by default.
: > "$tmp/log"
FLASHCP_NODES=1 FLASHCP_RANKS_PER_NODE=1 FLASHCP_NODE_RANK=0 FLASHCP_DEVICE=cpu \
  bash "$launch" 2>/dev/null || fail "single-node launch failed"
grep -qxF -- "--rank 0 --world_size 1 --group flashcp --planner planner:50051 --rendezvous planner:50051 --gloo_host 127.0.0.1 --control 0.0.0.0:50061 --metrics 0.0.0.0:9470 --device cpu --local_rank 0" \
  "$tmp/log" || fail "single node: $(cat "$tmp/log")"

# 1c. The job secret (issue 31): none made for a group across pods (test 1: a warning, the
# open namespace); one node without one: a secret made per launch, the same for its ranks,
# never logged; a given one reaches every rank unchanged.
: > "$tmp/log"
FLASHCP_NODES=2 FLASHCP_RANKS_PER_NODE=2 FLASHCP_NODE_RANK=0 FLASHCP_DEVICE=cpu \
  FLASHCP_GLOO_HOST=10.1.2.3 bash "$launch" 2>"$tmp/err" || fail "multi-node launch failed"
! grep -q "FLASHCP_JOB_SECRET" "$tmp/log" || fail "a multi-node rank got a made-up secret"
grep -qF "FLASHCP_JOB_SECRET is not set: the group forms in the rendezvous' open namespace" \
  "$tmp/err" || fail "no warning for a multi-node group without a secret: $(cat "$tmp/err")"
secrets=()
for launch_no in 1 2; do
  : > "$tmp/log"
  FLASHCP_NODES=1 FLASHCP_RANKS_PER_NODE=2 FLASHCP_NODE_RANK=0 FLASHCP_DEVICE=cpu \
    bash "$launch" 2>"$tmp/err" || fail "single-node launch $launch_no failed"
  mapfile -t got < <(grep -oP '^env [01] FLASHCP_JOB_SECRET=\K.*' "$tmp/log")
  [[ ${#got[@]} -eq 2 && ${got[0]} == "${got[1]}" && ${got[0]} =~ ^[0-9a-f]{64}$ ]] ||
    fail "launch $launch_no: ranks got secrets '${got[*]}'"
  ! grep -qF "${got[0]}" "$tmp/err" || fail "the made secret was logged"
  grep -qF "job secret made here" "$tmp/err" || fail "not logged as made: $(cat "$tmp/err")"
  secrets+=("${got[0]}")
done
[[ ${secrets[0]} != "${secrets[1]}" ]] || fail "two launches made the same secret"
: > "$tmp/log"
FLASHCP_NODES=2 FLASHCP_RANKS_PER_NODE=2 FLASHCP_NODE_RANK=0 FLASHCP_DEVICE=cpu \
  FLASHCP_GLOO_HOST=10.1.2.3 FLASHCP_JOB_SECRET=s3cret-of-job-7 bash "$launch" 2>"$tmp/err" ||
  fail "launch with a secret failed"
[[ $(grep -cxF "env 0 FLASHCP_JOB_SECRET=s3cret-of-job-7" "$tmp/log") -eq 1 &&
  $(grep -cxF "env 1 FLASHCP_JOB_SECRET=s3cret-of-job-7" "$tmp/log") -eq 1 ]] ||
  fail "the given secret did not reach every rank: $(cat "$tmp/log")"
grep -qF "job secret given" "$tmp/err" || fail "not logged as given: $(cat "$tmp/err")"

# 2. CPU device and an explicit node rank.
: > "$tmp/log"
FLASHCP_NODES=3 FLASHCP_RANKS_PER_NODE=2 FLASHCP_NODE_RANK=2 FLASHCP_DEVICE=cpu \
  FLASHCP_GLOO_HOST=10.1.2.4 bash "$launch" 2>/dev/null || fail "cpu launch failed"
grep -q -- "--rank 5 --world_size 6 .* --device cpu --local_rank 1$" "$tmp/log" || fail "cpu rank 5: $(cat "$tmp/log")"

# 3. A failing rank stops the others and its status is the launcher's.
: > "$tmp/log"
set +e
STUB_SLEEP=30 STUB_FAIL_RANK=1 FLASHCP_NODES=1 FLASHCP_RANKS_PER_NODE=3 FLASHCP_NODE_RANK=0 \
  timeout 20 bash "$launch" 2>/dev/null
rc=$?
set -e
[[ $rc -eq 7 ]] || fail "launcher exited $rc after rank 1 failed with 7"
grep -q "term 0" "$tmp/log" && grep -q "term 2" "$tmp/log" || fail "other ranks not stopped: $(cat "$tmp/log")"

# 3b. A rank that ignores SIGTERM gets SIGKILL after FLASHCP_STOP_GRACE_SECONDS.
: > "$tmp/log"
set +e
STUB_IGNORE_TERM=1 STUB_SLEEP=30 STUB_FAIL_RANK=1 FLASHCP_STOP_GRACE_SECONDS=1 FLASHCP_NODES=1 \
  FLASHCP_RANKS_PER_NODE=2 FLASHCP_NODE_RANK=0 timeout 20 bash "$launch" 2>/dev/null
rc=$?
set -e
[[ $rc -eq 7 ]] || fail "launcher exited $rc with a rank ignoring SIGTERM (want 7, not a timeout)"
grep -q "ignored term 0" "$tmp/log" || fail "rank 0 never got SIGTERM: $(cat "$tmp/log")"

# 4. SIGTERM reaches every rank; all exit 0, so the launcher exits 0.
: > "$tmp/log"
STUB_SLEEP=30 FLASHCP_NODES=1 FLASHCP_RANKS_PER_NODE=2 FLASHCP_NODE_RANK=0 \
  bash "$launch" 2>/dev/null &
pid=$!
for _ in $(seq 100); do [[ $(wc -l < "$tmp/log") -ge 2 ]] && break; sleep 0.05; done
sleep 0.2 # let the stubs install their TERM traps
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
[[ $rc -eq 0 ]] || fail "launcher exited $rc after SIGTERM"
grep -q "term 0" "$tmp/log" && grep -q "term 1" "$tmp/log" || fail "SIGTERM not forwarded: $(cat "$tmp/log")"

# 5. Bad settings: status 2 and a message, no worker started.
: > "$tmp/log"
for bad in "FLASHCP_NODES=2 FLASHCP_NODE_RANK=2" "FLASHCP_RANKS_PER_NODE=x" "FLASHCP_DEVICE=tpu FLASHCP_NODE_RANK=0" "FLASHCP_PLANNER= FLASHCP_NODE_RANK=0" "FLASHCP_CONTROL_BASE_PORT=-1 FLASHCP_NODE_RANK=0"; do
  set +e
  env $bad bash "$launch" 2>"$tmp/err"
  rc=$?
  set -e
  [[ $rc -ne 0 && -s $tmp/err ]] || fail "'$bad' gave status $rc and no message"
done
[[ ! -s $tmp/log ]] || fail "a worker started despite bad settings: $(cat "$tmp/log")"
set +e
FLASHCP_NODES=2 FLASHCP_NODE_RANK=1 bash "$launch" 2>"$tmp/err"
rc=$?
set -e
[[ $rc -eq 2 ]] && grep -qF "FLASHCP_GLOO_HOST (this pod's IP" "$tmp/err" ||
  fail "2 nodes without a pod IP: status $rc, $(cat "$tmp/err")"
[[ ! -s $tmp/log ]] || fail "a worker started without a pod IP: $(cat "$tmp/log")"
echo "PASS: flashcp-launch-ranks"
