#!/usr/bin/env bash
# flashcp-launch-ranks: starts one flashcp-worker process per local device in this pod (or
# host) and supervises them as one unit. Used as the worker container's command.
#
#   global rank = node rank * ranks per node + local index
#   world size  = nodes * ranks per node
#
# Environment (all optional except where noted):
#   FLASHCP_NODES            number of pods (nodes) in the CP group        (default 1)
#   FLASHCP_RANKS_PER_NODE   worker processes in this pod, one per GPU     (default 1)
#   FLASHCP_NODE_RANK        this pod's index; default: the numeric suffix of $HOSTNAME, which
#                            is the StatefulSet ordinal (name-0, name-1, ...)
#   FLASHCP_DEVICE           cuda: rank k uses --device cuda:k; cpu: --device cpu (default cuda)
#   FLASHCP_GROUP            CP group name                                 (default flashcp)
#   FLASHCP_PLANNER          planner address HOST:PORT                     (required)
#   FLASHCP_RENDEZVOUS       rendezvous address HOST:PORT (flashcp-planner --serve=rendezvous)
#                                                                   (default: FLASHCP_PLANNER)
#   FLASHCP_GLOO_HOST        this pod's address, every rank's --gloo_host: the address its Gloo
#                            transport listens on and advertises to the other pods. Set it from
#                            the downward API (status.podIP). Default 127.0.0.1 with one node;
#                            required with more (a loopback address cannot span pods)
#   FLASHCP_CONTROL_HOST     WorkerControl (and gRPC health) bind host     (default 0.0.0.0)
#   FLASHCP_CONTROL_BASE_PORT  local rank k serves WorkerControl on base + k (default 50061)
#   FLASHCP_METRICS_HOST     metrics bind host                             (default 0.0.0.0)
#   FLASHCP_METRICS_BASE_PORT  local rank k serves metrics on base + k     (default 9470)
#   FLASHCP_WORKER           worker binary                                 (default flashcp-worker)
#   FLASHCP_STOP_GRACE_SECONDS  after a rank fails, ranks still running this long after
#                            SIGTERM get SIGKILL                           (default 60)
#   FLASHCP_JOB_SECRET       the job's rendezvous secret, passed to every rank; unset with one
#                            node: one made here (256 random bits) for this launch's ranks;
#                            unset with more: none (a warning), the rendezvous' open namespace
# Each rank gets --local_rank k (its metrics' local_rank label); arguments after the options are
# passed to every worker unchanged (--strategy, --steps, ...). The environment reaches every
# rank as it is: NCCL's own settings (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...; docs/deploy.md,
# "Across nodes") go to NCCL unchanged, and are logged.
#
# Supervision: SIGTERM/SIGINT are forwarded to every rank (each finishes its step in flight).
# When any rank exits non-zero, the others get SIGTERM and the launcher exits with that rank's
# status (SIGKILL after the grace period), so a broken group fails as a unit, never hangs. Exit 0 only if every rank did.
set -euo pipefail

nodes=${FLASHCP_NODES:-1}
per_node=${FLASHCP_RANKS_PER_NODE:-1}
node_rank=${FLASHCP_NODE_RANK:-}
if [[ -z $node_rank ]]; then
  host=${HOSTNAME:-$(hostname)}
  node_rank=${host##*-}
fi
device=${FLASHCP_DEVICE:-cuda}
group=${FLASHCP_GROUP:-flashcp}
planner=${FLASHCP_PLANNER:?FLASHCP_PLANNER (planner HOST:PORT) is required}
metrics_host=${FLASHCP_METRICS_HOST:-0.0.0.0}
metrics_base=${FLASHCP_METRICS_BASE_PORT:-9470}
rendezvous=${FLASHCP_RENDEZVOUS:-$planner}
control_host=${FLASHCP_CONTROL_HOST:-0.0.0.0}
control_base=${FLASHCP_CONTROL_BASE_PORT:-50061}
gloo_host=${FLASHCP_GLOO_HOST:-}
worker=${FLASHCP_WORKER:-flashcp-worker}
grace=${FLASHCP_STOP_GRACE_SECONDS:-60}

for v in nodes per_node node_rank metrics_base control_base grace; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]]; then
    echo "flashcp-launch-ranks: $v must be a non-negative integer, got '${!v}'" >&2
    exit 2
  fi
done
if ((per_node < 1 || nodes < 1)); then
  echo "flashcp-launch-ranks: need at least one node and one rank per node" >&2
  exit 2
fi
if ((node_rank >= nodes)); then
  echo "flashcp-launch-ranks: node rank $node_rank is not below the node count $nodes" >&2
  exit 2
fi
case $device in cuda | cpu) ;; *)
  echo "flashcp-launch-ranks: FLASHCP_DEVICE must be cuda or cpu, got '$device'" >&2
  exit 2
  ;;
esac

if [[ -z $gloo_host ]]; then
  if ((nodes > 1)); then
    echo "flashcp-launch-ranks: FLASHCP_GLOO_HOST (this pod's IP, e.g. from the downward API's" \
      "status.podIP) is required for a group of $nodes nodes" >&2
    exit 2
  fi
  gloo_host=127.0.0.1
fi
# The job's rendezvous secret (docs/deploy.md, "Rendezvous"): the one given, else for a one-pod
# group one made here for all its ranks (256 random bits, never logged). A group across pods
# needs the same secret in every pod (deploy/k8s: a Secret per job), so none is made for it.
if [[ -n ${FLASHCP_JOB_SECRET:-} ]]; then
  secret_note="job secret given"
elif ((nodes == 1)); then
  FLASHCP_JOB_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  export FLASHCP_JOB_SECRET
  secret_note="job secret made here"
else
  secret_note="no job secret"
  echo "flashcp-launch-ranks: warning: FLASHCP_JOB_SECRET is not set: the group forms in the" \
    "rendezvous' open namespace, where any client may join or replace its ranks" >&2
fi
world=$((nodes * per_node))
nccl=$(env | grep -E '^NCCL_' | sort | paste -sd ' ' - || true)
echo "flashcp-launch-ranks: gloo host $gloo_host, rendezvous $rendezvous, $secret_note${nccl:+, $nccl}" >&2
declare -A rank_of=()
pids=()

stop_all() {
  local sig=$1
  for pid in "${pids[@]}"; do kill -s "$sig" "$pid" 2>/dev/null || true; done
}
trap 'echo "flashcp-launch-ranks: forwarding SIGTERM" >&2; stop_all TERM' TERM
trap 'echo "flashcp-launch-ranks: forwarding SIGINT" >&2; stop_all INT' INT

for ((k = 0; k < per_node; k++)); do
  rank=$((node_rank * per_node + k))
  if [[ $device == cuda ]]; then dev="cuda:$k"; else dev=cpu; fi
  "$worker" --rank "$rank" --world_size "$world" --group "$group" --planner "$planner" \
    --rendezvous "$rendezvous" --gloo_host "$gloo_host" \
    --control "$control_host:$((control_base + k))" \
    --metrics "$metrics_host:$((metrics_base + k))" --device "$dev" --local_rank "$k" "$@" &
  pids+=($!)
  rank_of[$!]=$rank
  echo "flashcp-launch-ranks: started rank $rank/$world (local $k, device $dev, pid $!)" >&2
done

status=0
remaining=${#pids[@]}
while ((remaining > 0)); do
  # wait -n returns when any child exits; a trapped signal interrupts it with status > 128,
  # in which case we simply wait again (the children were already signalled).
  set +e
  wait -n -p done_pid "${pids[@]}"
  rc=$?
  set -e
  if [[ -z ${done_pid:-} ]]; then
    continue
  fi
  remaining=$((remaining - 1))
  echo "flashcp-launch-ranks: rank ${rank_of[$done_pid]} exited with status $rc" >&2
  left=()
  for pid in "${pids[@]}"; do [[ $pid == "$done_pid" ]] || left+=("$pid"); done
  pids=("${left[@]}")
  if ((rc != 0 && status == 0)); then
    status=$rc
    echo "flashcp-launch-ranks: stopping the other ranks" >&2
    stop_all TERM
    if ((${#pids[@]})); then
      # Not a child that `wait -n` watches: only the listed rank pids are waited for.
      (sleep "$grace"; for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done) \
        >/dev/null 2>&1 &
      killer=$!
    fi
  fi
  unset done_pid
done
if [[ -n ${killer:-} ]]; then kill "$killer" 2>/dev/null || true; fi
exit "$status"
