#!/usr/bin/env python3
"""deploy/k8s renders offline with `kubectl kustomize` for both overlays, and the rendered
objects are what the overlays promise: the expected kinds; a planner with gRPC health probes;
one worker pod per node running one rank per GPU (h100: 8 GPUs, host IPC, memory-backed
/dev/shm, GPU toleration and node selector) or per CPU rank (cpu-demo: --device cpu, no GPUs);
node count and ranks per pod consistent between the StatefulSet, its ports and the PodMonitor's
rank table; the dashboard ConfigMap equal to deploy/grafana/flashcp.json; and the generated
files current (deploy/k8s/generate.py --check). Needs kubectl and PyYAML (python3-yaml)."""
import json
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
EXPECTED_KINDS = {"Namespace", "ConfigMap", "Service", "Deployment", "StatefulSet",
                  "PodDisruptionBudget", "ServiceMonitor", "PodMonitor", "PrometheusRule"}
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def render(overlay):
    res = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        failures.append(f"kubectl kustomize overlays/{overlay} failed:\n{res.stderr}")
        return {}
    objs = {}
    for doc in yaml.safe_load_all(res.stdout):
        if doc:
            objs[(doc["kind"], doc["metadata"]["name"])] = doc
    return objs


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def check_overlay(name, objs, device, ranks_per_node, nodes, gpus):
    where = f"overlays/{name}"
    kinds = {k for k, _ in objs}
    check(kinds == EXPECTED_KINDS, f"{where}: kinds {sorted(kinds)} != {sorted(EXPECTED_KINDS)}")

    dep = objs.get(("Deployment", "flashcp-planner"), {})
    pod = dep.get("spec", {}).get("template", {}).get("spec", {})
    c = (pod.get("containers") or [{}])[0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check("grpc" in c.get(probe, {}), f"{where}: planner {probe} is not a grpc probe")
    check(dep.get("spec", {}).get("replicas") == 1, f"{where}: planner must run one replica")
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: planner not non-root")
    svc = objs.get(("Service", "flashcp-planner"), {})
    ports = {p["name"] for p in svc.get("spec", {}).get("ports", [])}
    check(ports == {"grpc", "metrics"}, f"{where}: planner Service ports {ports}")

    sts = objs.get(("StatefulSet", "flashcp-worker"), {})
    spec = sts.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    c = (pod.get("containers") or [{}])[0]
    env = env_of(c)
    check(spec.get("replicas") == nodes, f"{where}: worker replicas {spec.get('replicas')} != {nodes}")
    check(env.get("FLASHCP_NODES") == str(spec.get("replicas")),
          f"{where}: FLASHCP_NODES {env.get('FLASHCP_NODES')} != replicas {spec.get('replicas')}")
    check(env.get("FLASHCP_RANKS_PER_NODE") == str(ranks_per_node),
          f"{where}: FLASHCP_RANKS_PER_NODE {env.get('FLASHCP_RANKS_PER_NODE')} != {ranks_per_node}")
    check(env.get("FLASHCP_DEVICE") == device, f"{where}: FLASHCP_DEVICE {env.get('FLASHCP_DEVICE')}")
    check(spec.get("podManagementPolicy") == "Parallel", f"{where}: workers must start in parallel")
    mports = sorted(p["containerPort"] for p in c.get("ports", []) if p["name"].startswith("metrics-r"))
    check(mports == [9470 + k for k in range(ranks_per_node)], f"{where}: worker metrics ports {mports}")
    shm = [v for v in pod.get("volumes", []) if v.get("emptyDir", {}).get("medium") == "Memory"]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    check(shm and mounts.get("/dev/shm") == shm[0]["name"], f"{where}: /dev/shm is not a memory emptyDir")
    limits = c.get("resources", {}).get("limits", {})
    if gpus:
        check(limits.get("nvidia.com/gpu") == gpus, f"{where}: nvidia.com/gpu limit {limits.get('nvidia.com/gpu')} != {gpus}")
        check(pod.get("hostIPC") is True, f"{where}: hostIPC not set")
        check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])), f"{where}: no GPU toleration")
        check(any(k.startswith("nvidia.com/gpu") for k in pod.get("nodeSelector", {})), f"{where}: no GPU node selector")
        check("podAntiAffinity" in pod.get("affinity", {}), f"{where}: no one-pod-per-node anti-affinity")
        check("cuda" in c.get("image", ""), f"{where}: GPU workers need the CUDA image, got {c.get('image')}")
    else:
        check("nvidia.com/gpu" not in json.dumps(pod), f"{where}: CPU demo mentions nvidia.com/gpu")
        check(not pod.get("hostIPC"), f"{where}: CPU demo needs no hostIPC")
        check("worker-cpu" in c.get("image", ""), f"{where}: CPU workers need the CPU image, got {c.get('image')}")

    # PodMonitor: one endpoint per local rank, and a rank for every (node, local rank).
    pm = objs.get(("PodMonitor", "flashcp-worker"), {}).get("spec", {})
    check(pm.get("jobLabel") == "app.kubernetes.io/name", f"{where}: PodMonitor jobLabel")
    eps = pm.get("podMetricsEndpoints", [])
    check([e["port"] for e in eps] == [f"metrics-r{k}" for k in range(ranks_per_node)],
          f"{where}: PodMonitor ports {[e['port'] for e in eps]}")
    for k, e in enumerate(eps):
        table = {r["regex"]: r["replacement"] for r in e.get("relabelings", [])
                 if r.get("targetLabel") == "rank"}
        for n in range(nodes):
            check(table.get(str(n)) == str(n * ranks_per_node + k),
                  f"{where}: PodMonitor maps node {n} local {k} to rank {table.get(str(n))}")
        check(any(r.get("targetLabel") == "group" for r in e.get("relabelings", [])),
              f"{where}: PodMonitor endpoint {k} sets no group label")

    cm = objs.get(("ConfigMap", "flashcp-grafana-dashboard"), {})
    check(cm.get("data", {}).get("flashcp.json") == (ROOT / "deploy/grafana/flashcp.json").read_text(),
          f"{where}: dashboard ConfigMap differs from deploy/grafana/flashcp.json")
    check(cm.get("metadata", {}).get("labels", {}).get("grafana_dashboard") == "1",
          f"{where}: dashboard ConfigMap lacks the grafana_dashboard label")
    rule = objs.get(("PrometheusRule", "flashcp"), {})
    check(len(rule.get("spec", {}).get("groups", [])) >= 3, f"{where}: PrometheusRule has too few groups")


def main():
    if not shutil.which("kubectl"):
        print("FAIL: kubectl not found: `kubectl kustomize` renders deploy/k8s. Debian 12 has no "
              "usable kubectl package (kubernetes-client is 1.20 with kustomize v2); install one "
              "from https://kubernetes.io/docs/tasks/tools/", file=sys.stderr)
        return 1
    res = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True)
    check(res.returncode == 0, "generated files are stale: " + res.stderr.strip())
    check_overlay("cpu-demo", render("cpu-demo"), device="cpu", ranks_per_node=2, nodes=2, gpus=None)
    check_overlay("h100", render("h100"), device="cuda", ranks_per_node=8, nodes=2, gpus=8)
    if failures:
        for msg in failures:
            print("FAIL: " + msg, file=sys.stderr)
        return 1
    print("PASS: kustomize renders cpu-demo and h100 with the expected objects")
    return 0


try:
    import yaml
except ImportError:
    print("FAIL: PyYAML missing (Debian package python3-yaml; scripts/install-deps.sh installs it)",
          file=sys.stderr)
    sys.exit(1)

if __name__ == "__main__":
    sys.exit(main())
