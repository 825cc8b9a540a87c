#!/usr/bin/env bash
# Sets up the project-local Python environment .prefix/venv (never the system
# Python): the exact pins of client/python/requirements.txt (grpcio,
# grpcio-tools, protobuf, pytest, ...), then the flashcp_client package, whose
# gRPC stubs grpcio-tools generates from proto/ while it installs.
# Idempotent; re-run after the proto changes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.prefix/venv
if [[ ! -x $VENV/bin/python ]]; then
  echo "setup-python: creating $VENV" >&2
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -r client/python/requirements.txt
# --no-build-isolation: build with the venv's pinned setuptools and
# grpcio-tools (no second download); --no-deps: the pins above are the deps.
"${PIP[@]}" install --no-build-isolation --no-deps --force-reinstall ./client/python
# setuptools leaves its build tree beside the sources; it is not ours to keep.
rm -rf client/python/build client/python/flashcp_client.egg-info
"$VENV/bin/python" -c "import flashcp_client" >&2
echo "setup-python: $VENV ready (flashcp_client installed)" >&2
