#!/usr/bin/env bash
# Installs every Debian 12 package the build, the tests and the main job need.
# Idempotent; run as root (CI and containers are root). Skips apt when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libabsl-dev libprotobuf-dev protobuf-compiler
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc
  prometheus-cpp-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libgloo-dev
  coinor-libcbc-dev
  prometheus
  python3 python3-venv python3-pip python3-yaml
  curl jq
  openssl
  iproute2   # ip netns: the multi-host test (tests/multihost_test.cc)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present" >&2
fi
