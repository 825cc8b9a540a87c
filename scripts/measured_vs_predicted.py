#!/usr/bin/env python3
"""The main job's measured-against-predicted table (issue 29): each CPU configuration's
measured step time beside the step-time model's prediction (core/step_time.h) for the same
plans, with the ratio and the ranking of the configurations by each.

  measured_vs_predicted.py RUNS PRED...
    RUNS: the workers' RUN JSON objects, one a line, one per configuration, in order;
    PRED: per configuration, in the same order, flashcp-plan's JSON lines (one per step's
          batch) with the predicted step of every exchange (metrics.predicted_exchanges).
  env (printed in the header): LINK ("BANDWIDTH_GBPS=... LATENCY_US=..."), COMPUTE_SCALE.
"""
import json
import os
import sys

SCHEME_EXCHANGE = {"full_kv": "full_kv", "allgather": "allgather", "targeted": "targeted",
                   "all_to_all": "all_to_all"}


def predicted(path, scheme):
    """Mean predicted step and compute seconds over a configuration's batches, both of
    the run's exchange (the compute: its step less its exposed exchange, so a ring
    strategy run with full_kv is not given the ring model's per-hop compute)."""
    step = compute = 0.0
    n = 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            m = json.loads(line)["metrics"]
            by_name = {e["exchange"]: e for e in m["predicted_exchanges"]}
            e = by_name[SCHEME_EXCHANGE[scheme]]
            if e.get("inapplicable"):  # no time predicted: not a 0 to average in
                raise SystemExit("measured_vs_predicted: %s: %s does not apply: %s" %
                                 (path, scheme, e["inapplicable"]))
            step += e["step_seconds"]
            compute += e["step_seconds"] - e["exposed_exchange_seconds"]
            n += 1
    if n == 0:
        raise SystemExit("measured_vs_predicted: no predictions in %s" % path)
    return step / n, compute / n


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0] * len(values)
    for place, i in enumerate(order):
        r[i] = place + 1
    return r


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        runs = [json.loads(l) for l in f if l.strip()]
    preds = argv[2:]
    if len(preds) != len(runs):
        print("measured_vs_predicted: %d runs, %d prediction files" % (len(runs), len(preds)),
              file=sys.stderr)
        return 2
    rows = []
    for run, path in zip(runs, preds):
        step, compute = predicted(path, run["scheme"])
        # The CPU engine's forward + backward wall time, its collectives inside.
        measured = run["attention_seconds"]
        rows.append((run, step, compute, measured))
    meas_rank = ranks([r[3] for r in rows])
    pred_rank = ranks([r[1] for r in rows])
    print("Measured against predicted (core/step_time.h), per configuration: the model's mean "
          "predicted step for the same batches and strategy (flashcp-plan, the run's scheme, one "
          "layer, no overlap as the CPU engine runs), on the cpu-fp32 profile x %s (ranks "
          "sharing the cores) and the loopback link measured now (%s, scripts/loopback_link.py, "
          "as NVLink, one node). Measured: the driver's mean forward + backward wall time "
          "per step, its collectives inside (step ms: the whole step). Host load average "
          "now: %.1f on %d cores (other work on a shared host slows the measured side only). "
          "Rows with a cost profile plan "
          "on the planner's fit; their prediction is of the pairs plan of the same batches." %
          (os.environ.get("COMPUTE_SCALE", "1"), os.environ.get("LINK", "?"),
           os.getloadavg()[0], os.cpu_count()))
    hdr = ("strategy", "scheme", "cost", "steps", "step ms", "measured fwd+bwd ms",
           "predicted ms", "measured / predicted", "predicted compute ms", "rank measured",
           "rank predicted")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" for _ in hdr) + "|")
    for i, (run, step, compute, measured) in enumerate(rows):
        print("| %s | %s | %s | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %d | %d |" % (
            run["strategy"], run["scheme"], run["cost_profile"], run["steps"],
            1e3 * run["step_seconds"], 1e3 * measured, 1e3 * step,
            measured / step if step > 0 else float("nan"), 1e3 * compute, meas_rank[i],
            pred_rank[i]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
