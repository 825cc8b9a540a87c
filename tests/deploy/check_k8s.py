#!/usr/bin/env python3
"""deploy/k8s renders offline with `kubectl kustomize` for both overlays, and the rendered
objects are what the overlays promise: the expected kinds; planning replicas (>= 2, rolling
updates, --serve=planning, a budget that lets a drain evict one) and a rendezvous of its own
(one replica, Recreate, --serve=rendezvous, --rendezvous_require_job_secret, its Service), both
with gRPC startup and readiness probes and a liveness probe on the metrics port's /healthz;
workers with the pod IP as their Gloo host, the rendezvous address, the job's own secret
(FLASHCP_JOB_SECRET from a Secret that deploy/k8s/new-job-secret.sh makes anew per job: no
render without it, two jobs never the same), gRPC startup and readiness probes on the control
port and liveness on local rank 0's /healthz, seccomp RuntimeDefault and a read-only root (h100: NCCL's socket interface and
IB HCAs, IPC_LOCK);
one worker pod per node running one rank per GPU (h100: 8 GPUs, host IPC, memory-backed
/dev/shm, GPU toleration and node selector) or per CPU rank (cpu-demo: --device cpu, no GPUs);
node count and ranks per pod consistent between the StatefulSet, its ports and the PodMonitor's
rank table; the dashboard ConfigMap equal to deploy/grafana/flashcp.json; and the generated
files current (deploy/k8s/generate.py --check). Needs kubectl and PyYAML (python3-yaml)."""
import base64
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Rendered from a copy of deploy/ (main() makes it), with a job secret of its own.
K8S = ROOT / "deploy/k8s"
EXPECTED_KINDS = {"Namespace", "ConfigMap", "Secret", "Service", "Deployment", "StatefulSet",
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


def env_field_of(container):
    """name -> the downward API fieldPath of env entries set from one."""
    return {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            for e in container.get("env", []) if "valueFrom" in e}


def check_grpc_probes(where, what, c, port, metrics_port):
    for probe in ("startupProbe", "readinessProbe"):
        check(c.get(probe, {}).get("grpc", {}).get("port") == port,
              f"{where}: {what} {probe} is not a grpc probe on port {port}")
    # Liveness on the metrics port's /healthz, which a flood of the gRPC port cannot exhaust.
    live = c.get("livenessProbe", {}).get("httpGet", {})
    check(live.get("path") == "/healthz" and live.get("port") == metrics_port,
          f"{where}: {what} livenessProbe is not GET /healthz on port {metrics_port}: {live}")


def job_secret(where, objs, c):
    """The worker's FLASHCP_JOB_SECRET value, from the Secret its secretKeyRef names."""
    refs = [e["valueFrom"]["secretKeyRef"] for e in c.get("env", [])
            if e["name"] == "FLASHCP_JOB_SECRET" and "secretKeyRef" in e.get("valueFrom", {})]
    check(len(refs) == 1, f"{where}: workers get no FLASHCP_JOB_SECRET from a Secret")
    if not refs:
        return None
    secret = objs.get(("Secret", refs[0]["name"]), {})
    value = secret.get("data", {}).get(refs[0]["key"])
    check(value is not None, f"{where}: FLASHCP_JOB_SECRET names a missing Secret key {refs[0]}")
    if value is None:
        return None
    value = base64.b64decode(value).decode()
    check(re.fullmatch("[0-9a-f]{64}", value) is not None,
          f"{where}: the job secret is not 64 hex digits")
    return value


def check_overlay(name, objs, device, ranks_per_node, nodes, gpus):
    where = f"overlays/{name}"
    kinds = {k for k, _ in objs}
    check(kinds == EXPECTED_KINDS, f"{where}: kinds {sorted(kinds)} != {sorted(EXPECTED_KINDS)}")

    dep = objs.get(("Deployment", "flashcp-planner"), {})
    pod = dep.get("spec", {}).get("template", {}).get("spec", {})
    c = (pod.get("containers") or [{}])[0]
    check_grpc_probes(where, "planner", c, 50051, 9464)
    replicas = dep.get("spec", {}).get("replicas", 0)
    check(replicas >= 2, f"{where}: planning must run >= 2 replicas, got {replicas}")
    strategy = dep.get("spec", {}).get("strategy", {})
    check(strategy.get("type") == "RollingUpdate" and
          strategy.get("rollingUpdate", {}).get("maxUnavailable") == 0,
          f"{where}: planner must roll out with RollingUpdate, maxUnavailable 0: {strategy}")
    check("--serve=planning" in c.get("args", []), f"{where}: planner lacks --serve=planning")
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: planner not non-root")
    svc = objs.get(("Service", "flashcp-planner"), {})
    ports = {p["name"] for p in svc.get("spec", {}).get("ports", [])}
    check(ports == {"grpc", "metrics"}, f"{where}: planner Service ports {ports}")
    pdb = objs.get(("PodDisruptionBudget", "flashcp-planner"), {}).get("spec", {})
    allowed = pdb.get("maxUnavailable", replicas - pdb.get("minAvailable", replicas))
    check(isinstance(allowed, int) and allowed >= 1,
          f"{where}: the planner's PodDisruptionBudget lets no drain evict a replica: {pdb}")

    rdv = objs.get(("Deployment", "flashcp-rendezvous"), {})
    rpod = rdv.get("spec", {}).get("template", {}).get("spec", {})
    rc = (rpod.get("containers") or [{}])[0]
    check(rdv.get("spec", {}).get("replicas") == 1, f"{where}: the rendezvous must run one replica")
    check(rdv.get("spec", {}).get("strategy", {}).get("type") == "Recreate",
          f"{where}: the rendezvous must roll out with Recreate")
    check("--serve=rendezvous" in rc.get("args", []), f"{where}: rendezvous lacks --serve=rendezvous")
    check_grpc_probes(where, "rendezvous", rc, 50051, 9464)
    check("--rendezvous_require_job_secret" in rc.get("args", []),
          f"{where}: rendezvous lacks --rendezvous_require_job_secret")
    check(rpod.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: rendezvous not non-root")
    rsvc = objs.get(("Service", "flashcp-rendezvous"), {})
    # One ServiceMonitor scrapes both as job="flashcp-planner" (the rules' and alerts' job).
    sm = objs.get(("ServiceMonitor", "flashcp-planner"), {}).get("spec", {})
    sel = sm.get("selector", {}).get("matchLabels", {})
    for s in (svc, rsvc):
        labels = s.get("metadata", {}).get("labels", {})
        check(sel and all(labels.get(k) == v for k, v in sel.items()) and
              labels.get(sm.get("jobLabel")) == "flashcp-planner",
              f"{where}: ServiceMonitor does not scrape {s.get('metadata', {}).get('name')} "
              f"as job flashcp-planner")
    check(any(p.get("name") == "grpc" and p.get("port") == 50051
              for p in rsvc.get("spec", {}).get("ports", [])),
          f"{where}: no flashcp-rendezvous Service on 50051")

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
    check(env.get("FLASHCP_PLANNER") == "flashcp-planner:50051", f"{where}: FLASHCP_PLANNER")
    check(env.get("FLASHCP_RENDEZVOUS") == "flashcp-rendezvous:50051",
          f"{where}: FLASHCP_RENDEZVOUS {env.get('FLASHCP_RENDEZVOUS')}")
    check(env_field_of(c).get("FLASHCP_GLOO_HOST") == "status.podIP",
          f"{where}: FLASHCP_GLOO_HOST is not the pod IP (downward API status.podIP)")
    control = int(env.get("FLASHCP_CONTROL_BASE_PORT") or 0)
    check({p["name"]: p["containerPort"] for p in c.get("ports", [])}.get("control-r0") == control,
          f"{where}: no control-r0 port at FLASHCP_CONTROL_BASE_PORT {control}")
    check_grpc_probes(where, "worker", c, control, int(env.get("FLASHCP_METRICS_BASE_PORT") or 0))
    secret = job_secret(where, objs, c)
    check(pod.get("securityContext", {}).get("seccompProfile", {}).get("type") == "RuntimeDefault",
          f"{where}: workers lack seccomp RuntimeDefault")
    csec = c.get("securityContext", {})
    check(csec.get("readOnlyRootFilesystem") is True, f"{where}: worker root filesystem not read-only")
    check(csec.get("allowPrivilegeEscalation") is False, f"{where}: workers may escalate privileges")
    check(any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts", [])),
          f"{where}: read-only workers need a writable /tmp")
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
        check(env.get("NCCL_SOCKET_IFNAME") and env.get("NCCL_IB_HCA"),
              f"{where}: NCCL_SOCKET_IFNAME / NCCL_IB_HCA not set")
        check("IPC_LOCK" in csec.get("capabilities", {}).get("add", []), f"{where}: no IPC_LOCK")
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
    return secret


def check_planner_only(objs):
    """overlays/planner-only: the planner alone (no workers, no rendezvous), serving TLS from
    the Secret flashcp-planner-tls, with TCP probes (grpc probes cannot speak TLS)."""
    where = "overlays/planner-only"
    kinds = {k for k, _ in objs}
    check(kinds == EXPECTED_KINDS - {"StatefulSet", "PodMonitor"},
          f"{where}: kinds {sorted(kinds)}")
    check(not any("rendezvous" in n or "worker" in n for _, n in objs),
          f"{where}: worker or rendezvous objects left: {sorted(n for _, n in objs)}")
    dep = objs.get(("Deployment", "flashcp-planner"), {})
    pod = dep.get("spec", {}).get("template", {}).get("spec", {})
    c = (pod.get("containers") or [{}])[0]
    args = c.get("args", [])
    check("--serve=planning" in args, f"{where}: planner args {args}")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    secrets = {v["name"]: v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])}
    tls = [n for n, s in secrets.items() if s == "flashcp-planner-tls"]
    check(len(tls) == 1 and mounts.get(tls[0]) == "/etc/flashcp/tls",
          f"{where}: Secret flashcp-planner-tls not mounted at /etc/flashcp/tls")
    for flag, f in (("--tls_cert", "tls.crt"), ("--tls_key", "tls.key")):
        check(f"{flag}=/etc/flashcp/tls/{f}" in args, f"{where}: no {flag}=/etc/flashcp/tls/{f}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check(c.get(probe, {}).get("tcpSocket", {}).get("port") == 50051 and
              "grpc" not in c.get(probe, {}), f"{where}: {probe} is not a TCP probe of 50051")
    return objs


def check_training_job(planner_objs):
    """examples/training-job.yaml: a Job running the tiny example against the planner-only
    overlay's Service over TLS, every flag one the example has, each rank's metrics port
    declared and scraped by its PodMonitor as job flashcp-worker."""
    where = "examples/training-job.yaml"
    docs = {(d["kind"], d["metadata"]["name"]): d
            for d in yaml.safe_load_all((K8S / "examples/training-job.yaml").read_text()) if d}
    check({k for k, _ in docs} == {"Job", "PodMonitor"}, f"{where}: kinds {sorted(docs)}")
    job = next((d for (k, _), d in docs.items() if k == "Job"), {})
    mon = next((d for (k, _), d in docs.items() if k == "PodMonitor"), {})
    ns = next((n for k, n in planner_objs if k == "Namespace"), None)
    check(job.get("metadata", {}).get("namespace") == ns, f"{where}: Job not in namespace {ns}")
    tmpl = job.get("spec", {}).get("template", {})
    pod, labels = tmpl.get("spec", {}), tmpl.get("metadata", {}).get("labels", {})
    c = (pod.get("containers") or [{}])[0]
    flags = dict(a.split("=", 1) for a in c.get("args", []))
    known = set(re.findall(r'add_argument\("(--[a-z_]+)"', (ROOT / "client/python/examples/"
                                                             "train_tiny.py").read_text()))
    check(set(flags) <= known, f"{where}: flags the example lacks: {sorted(set(flags) - known)}")
    svc = planner_objs.get(("Service", "flashcp-planner"), {})
    grpc_port = next((p["port"] for p in svc.get("spec", {}).get("ports", [])
                      if p["name"] == "grpc"), None)
    check(flags.get("--planner_address") == f"flashcp-planner.{ns}.svc:{grpc_port}",
          f"{where}: --planner_address {flags.get('--planner_address')}")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    check(any(flags.get("--tls_ca", "").startswith(p + "/") for p in mounts.values()),
          f"{where}: --tls_ca {flags.get('--tls_ca')} not under a mounted volume")
    cp, base = int(flags.get("--cp", "0")), int(flags.get("--metrics_port", "0"))
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(cp >= 1 and ports == {f"metrics-r{r}": base + r for r in range(cp)},
          f"{where}: ports {ports} for --cp {cp} --metrics_port {base}")
    eps = [e["port"] for e in mon.get("spec", {}).get("podMetricsEndpoints", [])]
    check(sorted(eps) == sorted(ports), f"{where}: PodMonitor scrapes {eps}, pod has {sorted(ports)}")
    sel = mon.get("spec", {}).get("selector", {}).get("matchLabels", {})
    check(sel and all(labels.get(k) == v for k, v in sel.items()),
          f"{where}: PodMonitor selector {sel} does not match the pod {labels}")
    check(labels.get(mon.get("spec", {}).get("jobLabel", "")) == "flashcp-worker",
          f"{where}: the PodMonitor's job label is not flashcp-worker")


def main():
    global K8S
    if not shutil.which("kubectl"):
        # 77: ctest's SKIP_RETURN_CODE for this test (tests/CMakeLists.txt).
        print("SKIP: kubectl not found: `kubectl kustomize` renders deploy/k8s. Debian 12 has no "
              "usable kubectl package (kubernetes-client is 1.20 with kustomize v2); install one "
              "from https://kubernetes.io/docs/tasks/tools/", file=sys.stderr)
        return 77
    res = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True)
    check(res.returncode == 0, "generated files are stale: " + res.stderr.strip())
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "deploy", pathlib.Path(tmp) / "deploy")
        K8S = pathlib.Path(tmp) / "deploy/k8s"
        (K8S / "base/job-secret").unlink(missing_ok=True)
        res = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays/cpu-demo")],
                             capture_output=True, text=True)
        check(res.returncode != 0 and "job-secret" in res.stderr,
              "the overlays render without a job secret (deploy/k8s/new-job-secret.sh)")
        secrets = []
        for _ in range(2):  # two jobs
            subprocess.run([str(K8S / "new-job-secret.sh")], check=True, capture_output=True)
            secrets.append(check_overlay("cpu-demo", render("cpu-demo"), device="cpu",
                                         ranks_per_node=2, nodes=2, gpus=None))
        check(secrets[0] is not None and secrets[0] != secrets[1],
              "two jobs' secrets are the same")
        check_overlay("h100", render("h100"), device="cuda", ranks_per_node=8, nodes=2, gpus=8)
        check_training_job(check_planner_only(render("planner-only")))
    if failures:
        for msg in failures:
            print("FAIL: " + msg, file=sys.stderr)
        return 1
    print("PASS: kustomize renders cpu-demo, h100 and planner-only with the expected objects; "
          "the training Job example matches the example and the planner-only overlay")
    return 0


try:
    import yaml
except ImportError:
    print("FAIL: PyYAML missing (Debian package python3-yaml; scripts/install-deps.sh installs it)",
          file=sys.stderr)
    sys.exit(1)

if __name__ == "__main__":
    sys.exit(main())
