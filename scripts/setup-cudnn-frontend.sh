#!/usr/bin/env bash
# Installs NVIDIA's header-only cuDNN C++ frontend into the project-local prefix
# .prefix/cudnn-frontend (git-ignored; never system-wide). The PyPI wheel
# `nvidia-cudnn-frontend` ships the headers under include/; we take only those.
# Idempotent: does nothing when the pinned version is already there.
#
# Pinned to 1.32.0: compiles against the cuDNN 9.19 headers and CUDA 13.0 here
# (it loads cuDNN's libraries through their C API, so the newer frontend runs
# on older 9.x libraries, which refuse the features they lack at graph build).
#
# The lent GPU machine has no registry: run this where there is one and carry
# the folder `.prefix` with the call.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${CUDNN_FRONTEND_VERSION:-1.32.0}
PREFIX=${CUDNN_FRONTEND_PREFIX:-$PWD/.prefix/cudnn-frontend}
STAMP="$PREFIX/.version"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$VERSION" && -f "$PREFIX/include/cudnn_frontend.h" ]]; then
  echo "setup-cudnn-frontend: $VERSION already in $PREFIX" >&2
  exit 0
fi

PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup-cudnn-frontend: fetching nvidia-cudnn-frontend==$VERSION" >&2
# Any platform wheel carries the same headers; --no-deps keeps it to one file.
"$PY" -m pip download --quiet --no-deps --only-binary=:all: \
  "nvidia-cudnn-frontend==$VERSION" -d "$tmp"
wheel=$(ls "$tmp"/nvidia_cudnn_frontend-"$VERSION"-*.whl | head -n1)
mkdir -p "$tmp/x"
"$PY" - "$wheel" "$tmp/x" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    members = [n for n in z.namelist() if n.startswith("include/")]
    if not members:
        sys.exit("setup-cudnn-frontend: wheel has no include/ folder")
    z.extractall(sys.argv[2], members)
PYEOF
test -f "$tmp/x/include/cudnn_frontend.h"
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
mv "$tmp/x/include" "$PREFIX/include"
echo "$VERSION" > "$STAMP"
echo "setup-cudnn-frontend: installed $VERSION into $PREFIX" >&2
