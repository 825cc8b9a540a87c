#!/usr/bin/env bash
# The main job's tables (scripts/run-cluster.sh) on a tiny run: two CPU
# configurations of 4 ranks, a few steps each; the measured-against-predicted
# table is printed with one row per configuration, its measured and predicted
# times positive and its ranks a permutation of 1..2 (issue 29).
#   run_cluster_test.sh BIN_DIR SRC_DIR
set -uo pipefail
bin=$1
src=$2
out=$(STEPS=3 CONTEXT=1024 QUALITY_STRATEGIES=llama3 QUALITY_CONTEXT=8192 QUALITY_CP=4 \
      QUALITY_BATCHES=2 CONFIGS="llama3:full_kv flashcp:allgather" TIMEOUT_S=60 \
      bash "$src/scripts/run-cluster.sh" "$bin" 2>"${TMPDIR:-/tmp}/run_cluster_test.$$.err")
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "FAIL: run-cluster.sh exited $rc"; cat "${TMPDIR:-/tmp}/run_cluster_test.$$.err"
  rm -f "${TMPDIR:-/tmp}/run_cluster_test.$$.err"; exit 1
fi
rm -f "${TMPDIR:-/tmp}/run_cluster_test.$$.err"
python3 - "$out" <<'PY'
import sys
text = sys.argv[1]
lines = text.splitlines()
head = [i for i, l in enumerate(lines) if l.startswith("Measured against predicted")]
if len(head) != 1:
    sys.exit("FAIL: no measured-against-predicted table in:\n" + text)
table = [l for l in lines[head[0] + 1:] if l.startswith("| ")]
hdr = [c.strip() for c in table[0].strip("|").split("|")]
rows = [dict(zip(hdr, (c.strip() for c in l.strip("|").split("|")))) for l in table[1:]]
want = [("llama3", "full_kv"), ("flashcp", "allgather")]
got = [(r["strategy"], r["scheme"]) for r in rows]
if got != want:
    sys.exit("FAIL: rows %s, want %s" % (got, want))
for r in rows:
    m, p = float(r["measured fwd+bwd ms"]), float(r["predicted ms"])
    ratio = float(r["measured / predicted"])
    if not (m > 0 and p > 0 and 0 < ratio < float("inf")):
        sys.exit("FAIL: bad row %s" % r)
if sorted(int(r["rank measured"]) for r in rows) != [1, 2] or \
   sorted(int(r["rank predicted"]) for r in rows) != [1, 2]:
    sys.exit("FAIL: ranks not a permutation: %s" % rows)
print("\n".join(lines[head[0]:]))
print("PASS")
PY
