#!/usr/bin/env bash
# The CUDA worker image check (ctest deploy_cuda_image): builds docker/worker-cuda.Dockerfile
# from a clean copy of HEAD (or takes an image already built, FLASHCP_CUDA_IMAGE) and starts it
# without a GPU: `flashcp-worker --help` must run, every library must resolve (the driver's
# libcuda aside), and each GPU test binary (ctest label gpu) must skip cleanly as the tests define
# a skip: exit 0, GoogleTest's "[  SKIPPED ]", FLASHCP_SKIP_WITHOUT_GPU's "needs a CUDA device",
# no failure.
#
# Exit 77 (ctest: skipped) with the reason when there is no container engine (docker or podman),
# or when there is one but neither FLASHCP_CUDA_IMAGE nor FLASHCP_IMAGE_BUILD=1 says what to do:
# the build compiles the worker and its CUDA tests inside the image (about 25 min on 2 cores),
# which a plain `ctest` on a developer's machine should not start by surprise.
#
#   FLASHCP_IMAGE_BUILD=1 bash tests/deploy/check_cuda_image.sh        # build, then check
#   FLASHCP_CUDA_IMAGE=flashcp/worker-cuda:dev bash tests/deploy/check_cuda_image.sh
# Engine: FLASHCP_CONTAINER_ENGINE (a command, e.g. "podman --storage-driver=vfs --runtime=runc"),
# else docker, else podman, whichever answers `info`. Extra flags: FLASHCP_CONTAINER_BUILD_ARGS
# (e.g. --isolation=chroot) and FLASHCP_CONTAINER_RUN_ARGS (e.g. --ulimit nofile=1024:4096), for
# sandboxes like the one docker/README.md describes.
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { echo "check_cuda_image: $*" >&2; }
skip() { echo "SKIP: $*"; exit 77; }

engine=()
if [[ -n ${FLASHCP_CONTAINER_ENGINE:-} ]]; then
  read -r -a engine <<<"$FLASHCP_CONTAINER_ENGINE"
else
  for cand in docker podman; do
    if command -v "$cand" >/dev/null && "$cand" info >/dev/null 2>&1; then
      engine=("$cand")
      break
    fi
  done
fi
((${#engine[@]})) || skip "no container engine: neither docker nor podman answers 'info' (set FLASHCP_CONTAINER_ENGINE)"
"${engine[@]}" info >/dev/null 2>&1 || skip "${engine[*]} does not answer 'info'"
read -r -a build_args <<<"${FLASHCP_CONTAINER_BUILD_ARGS:-}"
read -r -a run_args <<<"${FLASHCP_CONTAINER_RUN_ARGS:-}"

image=${FLASHCP_CUDA_IMAGE:-}
if [[ -z $image ]]; then
  [[ ${FLASHCP_IMAGE_BUILD:-0} == 1 ]] ||
    skip "${engine[0]} is here, but the CUDA image is not built by default (about 25 min on 2 cores): set FLASHCP_IMAGE_BUILD=1 to build it, or FLASHCP_CUDA_IMAGE=TAG to check a built one"
  image=flashcp/worker-cuda:check
  ctx=$(mktemp -d /tmp/flashcp-cuda-image.XXXXXX)
  trap 'rm -rf "$ctx"' EXIT
  git archive HEAD | tar -x -C "$ctx"
  cp docker/worker-cuda.Dockerfile.dockerignore "$ctx/.dockerignore"
  build_log=${FLASHCP_IMAGE_BUILD_LOG:-/tmp/flashcp-cuda-image-build.log}
  log "building $image from HEAD $(git rev-parse --short HEAD) with ${engine[*]} (log: $build_log)"
  start=$SECONDS
  if ! "${engine[@]}" build "${build_args[@]}" --network=host --build-arg JOBS="${JOBS:-2}" \
      -f "$ctx/docker/worker-cuda.Dockerfile" -t "$image" "$ctx" >"$build_log" 2>&1; then
    tail -40 "$build_log" >&2
    log "FAIL: the image did not build"
    exit 1
  fi
  log "built in $((SECONDS - start)) s"
fi
"${engine[@]}" image inspect "$image" >/dev/null 2>&1 || { log "FAIL: no image $image"; exit 1; }

fail=0
bad() { log "FAIL: $*"; fail=1; }
# A container without a GPU: no --gpus, no NVIDIA runtime, so no libcuda inside.
run() { "${engine[@]}" run --rm --network=none "${run_args[@]}" "$@"; }

user=$("${engine[@]}" image inspect -f '{{.Config.User}}' "$image")
[[ $user == 10001:10001 ]] || bad "image runs as '$user', not 10001:10001"

if out=$(run --entrypoint flashcp-worker "$image" --help 2>&1); then
  grep -q '^Usage: flashcp-worker' <<<"$out" || bad "flashcp-worker --help printed no usage: $out"
  grep -q 'cuda:K' <<<"$out" || bad "flashcp-worker --help does not offer --device cuda:K"
  log "flashcp-worker --help: exit 0, $(wc -l <<<"$out") lines"
else
  bad "flashcp-worker --help exited $?: $out"
fi

# Every library resolves inside the image, and the CUDA ones from the wheels' lib/.
libs=$(run --entrypoint /bin/sh "$image" -c \
  'ldd /usr/local/bin/flashcp-worker /usr/local/libexec/flashcp/gpu-tests/* /usr/local/cuda-13.0/lib/*.so*' 2>&1) ||
  bad "ldd in the image failed: $libs"
missing=$(grep 'not found' <<<"$libs" | grep -v -e 'libcuda\.so' -e 'libnvidia-' | sort -u || true)
[[ -z $missing ]] || bad "libraries missing in the image: $missing"
for lib in libcudart.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
  grep -q "$lib => /usr/local/cuda[-0-9.]*/lib/$lib" <<<"$libs" || bad "$lib does not resolve to /usr/local/cuda-13.0/lib"
done

tests=$(run --entrypoint /bin/ls "$image" /usr/local/libexec/flashcp/gpu-tests/ 2>&1) ||
  { bad "no GPU tests in the image: $tests"; tests=; }
want="worker_cuda_attention_test worker_cuda_communicator_test worker_cuda_cp_step_test worker_cuda_rank_backend_test"
[[ $(echo $tests) == "$want" ]] || bad "GPU tests in the image: '$(echo $tests)', want '$want'"
for t in $tests; do
  rc=0
  out=$(run --entrypoint "/usr/local/libexec/flashcp/gpu-tests/$t" "$image" 2>&1) || rc=$?
  skipped=$(grep -c '^\[  SKIPPED \] .*(' <<<"$out" || true)
  summary=$(grep -oE '^\[  (PASSED|SKIPPED|FAILED) *\] [0-9]+ tests?' <<<"$out" | tr -s ' []' ' ' | paste -sd, -)
  if ((rc != 0)) || ((skipped == 0)) || ! grep -q 'needs a CUDA device' <<<"$out" ||
      grep -q '^\[  FAILED  \]' <<<"$out"; then
    bad "$t: exit $rc, not a clean skip:"
    echo "$out" | tail -30 >&2
  else
    log "$t: exit 0,$summary ($(grep -m1 -o 'needs a CUDA device: .*' <<<"$out"))"
  fi
done

((fail == 0)) || exit 1
echo "PASS: $image starts without a GPU (--help, libraries, GPU tests skip)"
