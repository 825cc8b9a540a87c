#!/usr/bin/env bash
# Prints, one per line, the Debian/Ubuntu packages that own the shared libraries the given
# binaries load (per ldd), so a runtime image installs exactly those and no -dev packages.
# Fails if a library is missing or owned by no package, except the GPU driver's libraries
# (libcuda, libnvidia-*), which the NVIDIA container runtime mounts into the container, and
# those under a --ship DIR, which the image copies itself (the CUDA wheels' lib/).
#   usage: runtime-packages.sh [--ship DIR]... BINARY...
set -euo pipefail
ship=()
while [[ ${1:-} == --ship ]]; do
  [[ -d ${2:-} ]] || { echo "runtime-packages: --ship needs a directory" >&2; exit 2; }
  ship+=("$(readlink -f "$2")")
  shift 2
done
(($#)) || { echo "usage: $0 [--ship DIR]... BINARY..." >&2; exit 2; }

declare -A pkgs=()
fail=0
while read -r name path; do
  case $name in libcuda.so* | libnvidia-*) continue ;; esac
  if [[ $path == "not found" ]]; then
    echo "runtime-packages: $name: not found" >&2
    fail=1
    continue
  fi
  real=$(readlink -f "$path")
  for dir in "${ship[@]}"; do
    [[ $real == "$dir"/* ]] && continue 2
  done
  owner=
  # usrmerge: dpkg may list a file under /lib while ldd reports /usr/lib, or the reverse.
  for cand in "$path" "$real" "${path#/usr}" "${real#/usr}" "/usr$path" "/usr$real"; do
    if owner=$(dpkg-query -S "$cand" 2>/dev/null | head -n1); then
      [[ -n $owner ]] && break
    fi
  done
  if [[ -z $owner ]]; then
    echo "runtime-packages: $path ($name) belongs to no package" >&2
    fail=1
    continue
  fi
  pkgs[${owner%%:*}]=1
done < <(ldd "$@" | awk '$2 == "=>" { print $1, ($3 == "not" ? "not found" : $3) }')
((fail == 0)) || exit 1
if ((${#pkgs[@]})); then printf '%s\n' "${!pkgs[@]}" | sort; fi
