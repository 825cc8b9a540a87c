#!/usr/bin/env bash
# Writes a ready-to-run Prometheus directory for FlashCP processes on known addresses (for
# example on loopback in an end-to-end test): OUT_DIR/prometheus.yml (this directory's config
# with the chosen intervals), OUT_DIR/rules/*.yml and OUT_DIR/targets/{planner,worker}.json.
#
#   render-local.sh OUT_DIR [--interval 1s] [--planner HOST:PORT]... [--worker HOST:PORT=GROUP/RANK]...
#   prometheus --config.file=OUT_DIR/prometheus.yml --storage.tsdb.path=OUT_DIR/data \
#              --web.listen-address=127.0.0.1:PORT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: $0 OUT_DIR [--interval DURATION] [--planner HOST:PORT]... [--worker HOST:PORT=GROUP/RANK]..." >&2; exit 2; }
(($#)) || usage
out=$1; shift
interval=15s
planners=()
workers=()
while (($#)); do
  case $1 in
    --interval) interval=${2:?}; shift 2 ;;
    --planner) planners+=("${2:?}"); shift 2 ;;
    --worker) workers+=("${2:?}"); shift 2 ;;
    *) usage ;;
  esac
done
[[ $interval =~ ^[0-9]+(ms|s|m)$ ]] || { echo "render-local: bad --interval '$interval'" >&2; exit 2; }

mkdir -p "$out/rules" "$out/targets"
cp "$here"/rules/*.yml "$out/rules/"
sed -e "s/^  scrape_interval: .*/  scrape_interval: $interval/" \
    -e "s/^  evaluation_interval: .*/  evaluation_interval: $interval/" \
    -e "s/refresh_interval: .*/refresh_interval: 1s/" \
    "$here/prometheus.yml" > "$out/prometheus.yml"

{
  printf '['
  sep=
  for p in "${planners[@]}"; do printf '%s\n  {"targets": ["%s"]}' "$sep" "$p"; sep=,; done
  printf '\n]\n'
} > "$out/targets/planner.json"

{
  printf '['
  sep=
  for w in "${workers[@]}"; do
    if ! [[ $w =~ ^([^=]+)=([A-Za-z0-9_.-]+)/([0-9]+)$ ]]; then
      echo "render-local: --worker wants HOST:PORT=GROUP/RANK, got '$w'" >&2
      exit 2
    fi
    printf '%s\n  {"targets": ["%s"], "labels": {"group": "%s", "rank": "%s"}}' \
      "$sep" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"
    sep=,
  done
  printf '\n]\n'
} > "$out/targets/worker.json"
echo "$out/prometheus.yml"
