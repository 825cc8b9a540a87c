#!/usr/bin/env bash
# Builds the planner and CPU worker images on a machine that has no container registry (only
# Debian's mirror and PyPI reachable), then smoke-tests them on loopback. This is how the images
# were verified for docs/deploy.md; with Docker Hub reachable, plain `docker build` (README.md
# in this folder) is all there is to it.
#
#   sudo bash docker/build-local.sh            # from the repository root; about 20 min on 2 cores
#
# What it does, and why:
#   1. Installs docker.io and debootstrap (Debian 12 packages) if missing, and starts dockerd
#      (vfs storage, no iptables, no bridge: what works inside a sandbox) if none answers.
#   2. Makes the base image `debian:12` (also tagged `debian:12-slim`) with debootstrap from the
#      Debian mirror, since Docker Hub is unreachable. It copies the host's extra CA
#      certificates (/usr/local/share/ca-certificates) into it, so that pip inside the build
#      trusts an egress proxy that re-signs TLS, as this workplace's does; a stock debian:12
#      needs none of that.
#   3. Builds from a clean copy of HEAD (`git archive`), with each Dockerfile's
#      `<name>.Dockerfile.dockerignore` as the context's .dockerignore: the legacy builder, used
#      here because BuildKit's `# syntax=` line would fetch its frontend from Docker Hub.
#   4. Smoke test: the planner image serves on 127.0.0.1 (host network, port 0, read back); the
#      planner image's own flashcp-client must print exactly flashcp-plan's JSON for a batch;
#      a worker-cpu container runs a 2-rank CPU group for 3 steps and must exit 0; `docker stop`
#      must drain the planner and exit 0.
# The CUDA image is built and started by tests/deploy/check_cuda_image.sh (docker/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "build-local: $*" >&2; }
((EUID == 0)) || { log "run as root (apt-get, dockerd)"; exit 2; }

if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (log: /tmp/flashcp-dockerd.log); it keeps running after this script"
  dockerd --storage-driver=vfs --iptables=false --bridge=none >/tmp/flashcp-dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { log "dockerd did not start; see /tmp/flashcp-dockerd.log"; exit 1; }
fi

work=$(mktemp -d /tmp/flashcp-docker.XXXXXX)
trap 'rm -rf "$work"' EXIT

if ! docker image inspect debian:12 >/dev/null 2>&1; then
  log "debootstrap bookworm (minbase) -> debian:12"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$work/rootfs/usr/local/share/ca-certificates/"
  fi
  tar -C "$work/rootfs" -c . | docker import - debian:12 >/dev/null
  rm -rf "$work/rootfs"
fi
docker tag debian:12 debian:12-slim

mkdir "$work/ctx"
git archive HEAD | tar -x -C "$work/ctx"
for image in planner worker-cpu; do
  # Dockerfile and ignore list from the same commit as the context.
  cp "$work/ctx/docker/$image.Dockerfile.dockerignore" "$work/ctx/.dockerignore"
  log "docker build flashcp/$image:dev (log: /tmp/flashcp-docker-$image.log)"
  if ! DOCKER_BUILDKIT=0 docker build --network host -f "$work/ctx/docker/$image.Dockerfile" \
      -t "flashcp/$image:dev" "$work/ctx" >"/tmp/flashcp-docker-$image.log" 2>&1; then
    tail -30 "/tmp/flashcp-docker-$image.log" >&2
    exit 1
  fi
done
docker images flashcp/planner:dev --format 'flashcp/planner:dev {{.Size}}' >&2
docker images flashcp/worker-cpu:dev --format 'flashcp/worker-cpu:dev {{.Size}}' >&2

# ---- Smoke test -------------------------------------------------------------
planner=
cleanup() { [[ -z $planner ]] || docker rm -f "$planner" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
planner=$(docker run -d --network host flashcp/planner:dev --listen 127.0.0.1:0 --metrics 127.0.0.1:0)
addr=
for _ in $(seq 100); do
  addr=$(docker logs "$planner" 2>/dev/null | sed -n 's/^LISTENING grpc=\([^ ]*\).*/\1/p')
  [[ -n $addr ]] && break
  sleep 0.2
done
[[ -n $addr ]] || { docker logs "$planner" >&2; log "planner printed no LISTENING line"; exit 1; }
[[ $(docker inspect -f '{{.Config.User}}' flashcp/planner:dev) == 10001:10001 ]] ||
  { log "planner image does not run as 10001:10001"; exit 1; }
log "planner container serves $addr"

batch="60000 30000 20000 21072"
want=$(echo "$batch" | docker run --rm -i --network host --entrypoint flashcp-plan flashcp/planner:dev \
  --cp 4 --strategy flashcp --input -)
got=$(echo "$batch" | docker run --rm -i --network host --entrypoint flashcp-client flashcp/planner:dev \
  --server "$addr" --cp 4 --strategy flashcp)
[[ -n $want && $want == "$got" ]] || { log "flashcp-client through the container differs from flashcp-plan"; exit 1; }
log "flashcp-client via the planner container == flashcp-plan"

# Rank k serves metrics on base + k: a base whose next port is free too (checked, then
# released, so another process could still take them before the workers bind).
metrics_port=$(python3 - <<'PY'
import socket
for _ in range(100):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); base = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", base + 1))
    except (OSError, OverflowError):  # taken, or base + 1 past 65535
        continue
    finally:
        a.close(); b.close()
    print(base); break
PY
)
docker run --rm --network host --ipc host \
  -e FLASHCP_DEVICE=cpu -e FLASHCP_RANKS_PER_NODE=2 -e FLASHCP_NODE_RANK=0 \
  -e FLASHCP_PLANNER="$addr" -e FLASHCP_METRICS_HOST=127.0.0.1 \
  -e FLASHCP_METRICS_BASE_PORT="$metrics_port" -e FLASHCP_GROUP=docker-smoke \
  flashcp/worker-cpu:dev --steps 3 --context 4096 --dataset pile --strategy flashcp \
  --scheme targeted --timeout_s 60 || { log "worker-cpu group failed (exit $?)"; exit 1; }
log "worker-cpu container: 2-rank CPU group ran 3 steps, exit 0"

docker stop -t 30 "$planner" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$planner")
[[ $code == 0 ]] || { docker logs "$planner" >&2; log "planner exited $code after SIGTERM"; exit 1; }
log "planner drained on SIGTERM, exit 0"
log "OK"
