#!/usr/bin/env bash
# Writes a new job secret (64 hex digits, 256 random bits) to deploy/k8s/base/job-secret, which
# the base kustomization turns into the Secret flashcp-job-secret-<hash> and every worker rank
# reads as FLASHCP_JOB_SECRET: the CP group's rendezvous namespace (docs/deploy.md,
# "Rendezvous"). Run it once per job, before `kubectl apply -k deploy/k8s/overlays/...`: a new
# secret is a new Secret name (kustomize's hash suffix), so the workers restart into a new group.
# The file is git-ignored and never committed; without it the overlays do not render, so no two
# jobs share a secret by default.
#   deploy/k8s/new-job-secret.sh [FILE]   (FILE defaults to base/job-secret beside this script)
set -euo pipefail
out=${1:-"$(cd "$(dirname "$0")" && pwd)/base/job-secret"}
umask 077
secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
if ((${#secret} != 64)); then
  echo "new-job-secret: could not read 32 bytes from /dev/urandom" >&2
  exit 1
fi
printf '%s' "$secret" >"$out.tmp"
mv "$out.tmp" "$out"
echo "new-job-secret: wrote $out"
