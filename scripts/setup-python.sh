#!/usr/bin/env bash
# Sets up the project-local Python environment .prefix/venv (never the system
# Python): the exact pins of client/python/requirements.txt (grpcio,
# grpcio-tools, protobuf, pytest, torch, pybind11, ...; torch 2.11.0+cu130
# and its CUDA 13 libraries are a download of a few GB the first time), then the flashcp distribution (packages flashcp,
# flashcp.torch, flashcp_client), whose gRPC stubs grpcio-tools generates from
# proto/ while it installs. The native module (_flashcp_native) is CMake's
# (client/python/native, scripts/build.sh).
# Idempotent; re-run after the proto changes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.prefix/venv
if [[ ! -x $VENV/bin/python ]]; then
  echo "setup-python: creating $VENV" >&2
  python3 -m venv "$VENV"
fi
# --no-cache-dir: the wheels (torch and its CUDA libraries, a few GB) are
# installed once into .prefix; a second copy in ~/.cache would only double
# the disk this needs.
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-cache-dir -q)
# A first install needs about 9 GiB free (downloaded wheels plus the unpacked
# venv); say so up front rather than leave pip's "No space left on device".
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  avail_kib=$(df --output=avail -k .prefix | tail -1)
  if (( avail_kib < 9 * 1024 * 1024 )); then
    echo "setup-python: warning: $((avail_kib / 1024)) MiB free under .prefix; installing" \
         "torch needs about 9 GiB (df -h .prefix)" >&2
  fi
fi
"${PIP[@]}" install -r client/python/requirements.txt
# The distribution was named flashcp-client before it held flashcp too; the
# old one's files overlap (flashcp_client/).
"${PIP[@]}" uninstall -y flashcp-client 2>/dev/null || true
# --no-build-isolation: build with the venv's pinned setuptools and
# grpcio-tools (no second download); --no-deps: the pins above are the deps.
"${PIP[@]}" install --no-build-isolation --no-deps --force-reinstall ./client/python
# setuptools leaves its build tree beside the sources; it is not ours to keep.
rm -rf client/python/build client/python/flashcp.egg-info client/python/flashcp_client.egg-info
"$VENV/bin/python" -c "import flashcp, flashcp_client, torch" >&2
echo "setup-python: $VENV ready (flashcp, flashcp_client, torch installed)" >&2
