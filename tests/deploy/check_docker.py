#!/usr/bin/env python3
"""Static checks of docker/*.Dockerfile (no Docker daemon is needed or used): every COPY source
(outside --from) exists in the repository and is not excluded by the Dockerfile's
.dockerignore; the build stage runs the README's scripts/install-deps.sh and scripts/build.sh;
the CUDA image builds with FLASHCP_CUDA=ON and the others with OFF; base images carry explicit
tags; the final stage runs as a non-root user and has an ENTRYPOINT; and the helper scripts
parse (bash -n); the CUDA image takes its CUDA from docker/cuda-wheels.sh's pinned wheels in both
stages. Then docker/runtime-packages.sh runs for real on /bin/ls, with and without --ship.
tests/deploy/check_cuda_image.sh builds the CUDA image and starts it (a container engine needed)."""
import fnmatch
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
IMAGES = {"planner.Dockerfile": "OFF", "worker-cpu.Dockerfile": "OFF", "worker-cuda.Dockerfile": "ON"}
failures = []


def instructions(text):
    """(instruction, argument) pairs with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def ignored(rel, patterns):
    result = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").strip("/")
        if fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel.split("/")[0], pat) or \
                any(fnmatch.fnmatch("/".join(rel.split("/")[:i]), pat) for i in range(1, rel.count("/") + 2)):
            result = not neg
    return result


def check_dockerfile(name, cuda):
    path = DOCKER / name
    text = path.read_text()
    ins = instructions(text)
    ign_path = DOCKER / (name + ".dockerignore")
    patterns = [l.strip() for l in ign_path.read_text().splitlines()
                if l.strip() and not l.startswith("#")] if ign_path.exists() else []
    if not patterns:
        failures.append(f"{name}: no {ign_path.name} (the context is the whole repository)")
    args = {}
    stages = []
    for word, rest in ins:
        if word == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args.setdefault(k, v)
        if word == "FROM":
            image = rest.split()[0]
            for _ in range(5):  # ARG defaults may refer to earlier ARGs
                image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)
            if "$" in image or ":" not in image or image.endswith(":latest"):
                failures.append(f"{name}: base image {image!r} has no explicit tag")
            stages.append([])
        if stages:
            stages[-1].append((word, rest))
        if word == "COPY" and "--from=" not in rest:
            parts = [p for p in rest.split() if not p.startswith("--")]
            for src in parts[:-1]:
                if src == ".":
                    continue
                if not (ROOT / src).exists():
                    failures.append(f"{name}: COPY source {src} does not exist")
                elif ignored(src.rstrip("/"), patterns):
                    failures.append(f"{name}: COPY source {src} is excluded by {ign_path.name}")
    runs = " ".join(r for w, r in ins if w == "RUN")
    for script in ("scripts/install-deps.sh", "scripts/build.sh"):
        if script not in runs:
            failures.append(f"{name}: does not run {script}")
    if f"-DFLASHCP_CUDA={cuda}" not in runs:
        failures.append(f"{name}: must build with -DFLASHCP_CUDA={cuda}")
    if len(stages) < 2:
        failures.append(f"{name}: not multi-stage")
        return
    final = stages[-1]
    users = [r for w, r in final if w == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        failures.append(f"{name}: final stage does not switch to a non-root USER")
    if not any(w == "ENTRYPOINT" for w, _ in final):
        failures.append(f"{name}: final stage has no ENTRYPOINT")
    if any(w == "RUN" and "install-deps.sh" in r for w, r in final):
        failures.append(f"{name}: final stage installs build dependencies")
    # Every build-output directory on this machine must be excluded from the context.
    for d in ROOT.iterdir():
        if d.is_dir() and d.name.startswith("build") and not ignored(d.name, patterns):
            failures.append(f"{name}: {d.name}/ would be sent as build context")
    if ignored("scripts/build.sh", patterns) or ignored("docker/flashcp-launch-ranks.sh", patterns):
        failures.append(f"{name}: .dockerignore excludes files the build needs")


def main():
    for name, cuda in IMAGES.items():
        if not (DOCKER / name).exists():
            failures.append(f"missing docker/{name}")
            continue
        check_dockerfile(name, cuda)
    cuda = (DOCKER / "worker-cuda.Dockerfile").read_text()
    if cuda.count("cuda-wheels.sh devel") != 1 or cuda.count("cuda-wheels.sh runtime") != 1:
        failures.append("worker-cuda.Dockerfile: must run cuda-wheels.sh devel (build) and runtime once each")
    wheels = (DOCKER / "cuda-wheels.sh").read_text()
    pins = re.findall(r"\b(nvidia-[a-z0-9-]+)(==[0-9.]+)?", wheels)
    if not pins or any(not version for _, version in pins):
        failures.append(f"cuda-wheels.sh: every wheel must be pinned name==version: {pins}")
    for script in ("flashcp-launch-ranks.sh", "runtime-packages.sh", "cuda-wheels.sh"):
        res = subprocess.run(["bash", "-n", str(DOCKER / script)], capture_output=True, text=True)
        if res.returncode != 0:
            failures.append(f"bash -n docker/{script}: {res.stderr}")
    res = subprocess.run(["bash", str(DOCKER / "runtime-packages.sh"), "/bin/ls"], capture_output=True, text=True)
    if res.returncode != 0 or "libc6" not in res.stdout.split():
        failures.append(f"runtime-packages.sh /bin/ls: rc {res.returncode}, {res.stdout!r} {res.stderr!r}")
    # Libraries under a --ship directory are the image's own: no package for them.
    res = subprocess.run(["bash", str(DOCKER / "runtime-packages.sh"), "--ship", "/lib/x86_64-linux-gnu", "/bin/ls"],
                         capture_output=True, text=True)
    if res.returncode != 0 or res.stdout != "":
        failures.append(f"runtime-packages.sh --ship /lib/x86_64-linux-gnu /bin/ls: rc {res.returncode}, {res.stdout!r}")
    res = subprocess.run(["bash", str(DOCKER / "runtime-packages.sh"), "--ship", "/nonexistent", "/bin/ls"],
                         capture_output=True, text=True)
    if res.returncode != 2 or "--ship needs a directory" not in res.stderr:
        failures.append(f"runtime-packages.sh --ship /nonexistent: rc {res.returncode}, {res.stderr!r}")
    if failures:
        for msg in failures:
            print("FAIL: " + msg, file=sys.stderr)
        return 1
    print("PASS: Dockerfiles (static checks; tests/deploy/check_cuda_image.sh builds and starts the CUDA image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
