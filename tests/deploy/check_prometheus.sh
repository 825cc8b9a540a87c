#!/usr/bin/env bash
# deploy/prometheus: the scrape config (as shipped and as render-local.sh writes it for
# loopback targets) passes `promtool check config`, the rules pass `promtool check rules`, the
# unit tests pass `promtool test rules`, and those tests cover every rule: each recording rule
# is an evaluated expr and each alert is tested both firing and not firing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
prom=$root/deploy/prometheus
command -v promtool >/dev/null || { echo "FAIL: promtool not found (Debian package 'prometheus'; scripts/install-deps.sh installs it)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

promtool check config "$prom/prometheus.yml"
bash "$prom/render-local.sh" "$tmp/local" --interval 1s --planner 127.0.0.1:1 \
  --worker 127.0.0.1:2=g0/0 --worker 127.0.0.1:3=g0/1 >/dev/null
promtool check config "$tmp/local/prometheus.yml"
grep -q '"rank": "1"' "$tmp/local/targets/worker.json"
if bash "$prom/render-local.sh" "$tmp/bad" --worker 127.0.0.1:2 2>/dev/null; then
  echo "FAIL: render-local.sh accepted a worker without GROUP/RANK" >&2; exit 1
fi
promtool check rules "$prom"/rules/*.yml
(cd "$prom" && promtool test rules tests/*.yml)

fail=0
for rule in $(sed -n 's/^ *- record: *//p' "$prom"/rules/*.yml | sort -u); do
  grep -q -- "- expr: $rule\$" "$prom"/tests/*.yml ||
    { echo "FAIL: recording rule $rule has no promql_expr_test" >&2; fail=1; }
done
for alert in $(sed -n 's/^ *- alert: *//p' "$prom"/rules/*.yml); do
  firing=$(grep -A2 -- "- alertname: $alert\$" "$prom"/tests/*.yml | grep -c 'exp_alerts:$' || true)
  quiet=$(grep -A2 -- "- alertname: $alert\$" "$prom"/tests/*.yml | grep -c 'exp_alerts: \[\]' || true)
  if ((firing < 1 || quiet < 1)); then
    echo "FAIL: alert $alert needs a firing and a not-firing test (has $firing and $quiet)" >&2
    fail=1
  fi
done
((fail == 0)) && echo "PASS: prometheus config, rules and rule tests"
exit $fail
