#!/usr/bin/env python3
"""The Python extension links core, proto and the engine only (issue 28):
its link command names no gRPC, Prometheus or CBC library, nor the targets
that bring them, and the built module needs none of them at run time.

  check_extension_link.py --build-dir BUILD --module PATH [--make-program NINJA]
      reads the module's link command as the generator wrote it (Ninja:
      `ninja -t commands`, its last line; Makefiles: the target's link.txt)
      and the module's NEEDED entries (`readelf -d`). Exit 1 with one line
      per library named that should not be.
  check_extension_link.py --self-test
      the check against link lines and NEEDED lists made up to fail and to
      pass (a check that cannot fail is a defect).
"""
import argparse
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

# Library names (lib<name>.a / .so, -l<name>) the extension must not link:
# gRPC (grpc, grpc++, grpc++_reflection, gpr), prometheus-cpp, CBC (Cbc,
# CbcSolver and its cut generators, Cgl: CBC alone links them; CLP, Osi and
# CoinUtils are core's LP).
FORBIDDEN_LIBS = re.compile(r"^(grpc|gpr|prometheus|Cbc|Cgl)")
# The project's targets that bring them (flashcp_worker_cuda, the CUDA
# engine, is allowed: its name only starts like the daemon's).
FORBIDDEN_TARGETS = {"flashcp_proto_rpc", "flashcp_ilp", "flashcp_worker",
                     "flashcp_planner_service", "flashcp_client", "flashcp_metrics_endpoint",
                     "flashcp_listener", "flashcp_flags"}


def library_name(token):
    """lib<name>.a, lib<name>.so[.N...] or -l<name> -> name; else None."""
    if token.startswith("-l"):
        return token[2:]
    base = pathlib.PurePosixPath(token).name
    m = re.match(r"^lib(.+?)\.(a|so(\.[0-9.]+)?)$", base)
    return m.group(1) if m else None


def link_violations(command):
    out = []
    for token in shlex.split(command):
        name = library_name(token)
        if name is None:
            continue
        if FORBIDDEN_LIBS.match(name) or name in FORBIDDEN_TARGETS:
            out.append(f"link command names {token}")
    return out


def needed_violations(readelf_text):
    out = []
    for name in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf_text):
        lib = library_name(name)
        if lib is not None and FORBIDDEN_LIBS.match(lib):
            out.append(f"module needs {name}")
    return out


def link_command(build_dir, module, make_program):
    ninja_file = build_dir / "build.ninja"
    if ninja_file.exists():
        rel = pathlib.Path(module).resolve().relative_to(build_dir.resolve()).as_posix()
        lines = subprocess.run([make_program or shutil.which("ninja") or "ninja", "-C",
                                str(build_dir), "-t", "commands", rel],
                               check=True, capture_output=True, text=True).stdout.splitlines()
        link = [line for line in lines if f"-o {rel}" in line]
        if not link:
            raise SystemExit(f"no link command for {rel} in {ninja_file}")
        return link[-1]
    found = sorted(build_dir.rglob("CMakeFiles/_flashcp_native.dir/link.txt"))
    if not found:
        raise SystemExit(f"no build.ninja and no _flashcp_native link.txt under {build_dir}")
    return found[0].read_text()


def self_test():
    bad = ("c++ -shared -o python/m.so a.o proto/libflashcp_proto.a "
           "proto/rpc/libflashcp_proto_rpc.a worker/libflashcp_worker.a "
           "/usr/lib/x86_64-linux-gnu/libgrpc++.so -lCbc /usr/lib/libprometheus-cpp-pull.so.1.0 "
           "core/ilp/libflashcp_ilp.a")
    good = ("c++ -shared -o python/m.so a.o proto/libflashcp_proto.a worker/libflashcp_engine.a "
            "worker/cuda/libflashcp_worker_cuda.a core/libflashcp_core.a -lOsiClp -lClp "
            "-lCoinUtils /usr/lib/x86_64-linux-gnu/libprotobuf.so")
    got = link_violations(bad)
    want = ["link command names proto/rpc/libflashcp_proto_rpc.a",
            "link command names worker/libflashcp_worker.a",
            "link command names /usr/lib/x86_64-linux-gnu/libgrpc++.so",
            "link command names -lCbc",
            "link command names /usr/lib/libprometheus-cpp-pull.so.1.0",
            "link command names core/ilp/libflashcp_ilp.a"]
    errors = []
    if got != want:
        errors.append(f"self-test: bad link line gave {got}, want {want}")
    if link_violations(good):
        errors.append(f"self-test: good link line gave {link_violations(good)}")
    readelf = (" 0x1 (NEEDED)  Shared library: [libprotobuf.so.32]\n"
               " 0x1 (NEEDED)  Shared library: [libgrpc++.so.1.51]\n"
               " 0x1 (NEEDED)  Shared library: [libCbcSolver.so.3]\n")
    got = needed_violations(readelf)
    if got != ["module needs libgrpc++.so.1.51", "module needs libCbcSolver.so.3"]:
        errors.append(f"self-test: NEEDED gave {got}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", type=pathlib.Path)
    ap.add_argument("--module")
    ap.add_argument("--make-program", default="")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        errors = self_test()
    else:
        if a.build_dir is None or a.module is None:
            ap.error("--build-dir and --module, or --self-test")
        errors = link_violations(link_command(a.build_dir, a.module, a.make_program))
        readelf = subprocess.run(["readelf", "-d", a.module], check=True, capture_output=True,
                                 text=True).stdout
        errors += needed_violations(readelf)
    for e in errors:
        print(e)
    if not errors:
        print("self-test passed" if a.self_test else
              "the extension links no gRPC, Prometheus or CBC (link command and NEEDED)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
