#!/usr/bin/env python3
"""The include rules (issue 28): no include runs upward.

1. core/internal in layers, each file (by name) in one; a file includes
   core/internal headers of its own layer or lower only, and the headers
   of core/internal include each other without a cycle:
     0 base             pieces, workload, score, options, tuning
     1 piece edits      the sliver repair primitives
     2 building blocks  Per-Doc, Whole-Doc, re-cut by LP; the baselines;
                        the pipeline mode's planner and replay (core/pipeline.h)
     3 primitives       balancing exchanges, role swaps
     4 judge            the one judge of candidate plans
     5 stages           search, repair, re-cut, grouped, chunk heap, fills,
                        capacity groups, node placement
     6 stage table
     7 orchestrator     flashcp.cc
   core's public headers (core/*.h) include nothing of core/internal.
2. Folders in layers: core includes only core; proto includes core and
   proto; core/runtime (process helpers, the metrics endpoint: a folder
   of its own targets inside core, which core itself never includes) core
   and core/runtime; client (C++) no planner_service or worker (the Python
   extension no planner_service); planner_service no client or worker;
   worker no planner_service. proto/rpc (the gRPC stubs and the status
   mapping) sits above proto: proto never includes it, nor gRPC
   (grpcpp/, grpc/, *.grpc.pb.h). core/ilp (the CBC solvers) is injected:
   only programs (*main.cc), the planner service, tests and bench/
   include it; core's other files, proto and client/python do not.
   Test files (*_test.cc,
   testing/) may include the layers they start (a real planner in a
   worker test). KNOWN lists the upward includes that still exist, each to
   be removed (issue 28, "targets in layers"); an entry that no longer
   exists fails the check too, so the list only shrinks.
3. The engine (worker/'s flashcp_engine target, ENGINE below), the CUDA
   engine (worker/cuda, non-test files) and the Python extension
   (client/python/native, which links the engine, proto and core only)
   include no gRPC, Prometheus, core/runtime, core/ilp, proto/rpc or client
   header, and of worker/ only the engine's headers (and worker/cuda's).

Exit status 1 with one line per violation; run from anywhere:
  python3 scripts/check_includes.py
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

LAYERS = {
    0: ["strategies_internal", "flashcp_pieces", "flashcp_score", "flashcp_options",
        "flashcp_tuning", "pipeline_internal", "targeted_phase"],
    1: ["sliver_repair", "sliver_fix", "flashcp_slivers"],
    2: ["per_doc", "whole_doc_place", "flashcp_util", "recut", "whole_doc", "baselines", "magi", "basp",
        "bdlm", "bdlm_csbp", "bdlm_flashcp",
        "pipeline_model", "pipeline_chunking", "pipeline_plan", "pipeline_sim"],
    3: ["flashcp_balance", "flashcp_roles"],
    4: ["flashcp_judge"],
    5: ["flashcp_search", "flashcp_repair", "flashcp_recut", "flashcp_grouped", "flashcp_kv",
        "flashcp_kvfill", "flashcp_kvgroups", "flashcp_nodes"],
    6: ["flashcp_stages"],
    7: ["flashcp"],
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}

# Folder -> folders it must not include (non-test files); a file follows
# the longest folder that holds it. The Python extension
# (client/python/native) links core, proto and the engine (worker/'s
# kernels and exchange layout), not the planner service.
FORBIDDEN = {
    "core": ["core/runtime", "core/ilp", "proto", "proto/rpc", "client", "planner_service",
             "worker"],
    "core/ilp": ["core/runtime", "proto", "proto/rpc", "client", "planner_service", "worker"],
    "proto": ["core/runtime", "core/ilp", "proto/rpc", "client", "planner_service", "worker",
              "grpc", "grpcpp"],
    "proto/rpc": ["core/runtime", "core/ilp", "client", "planner_service", "worker"],
    "core/runtime": ["proto", "proto/rpc", "client", "planner_service", "worker"],
    "client": ["planner_service", "worker", "core/ilp"],
    "client/python": ["planner_service", "core/ilp", "proto/rpc"],
    "planner_service": ["client", "worker"],
    "worker": ["planner_service", "core/ilp"],
}
# Folders of their own inside another (an include's folder is the longest).
SUBFOLDERS = ("core/runtime", "core/ilp", "proto/rpc")

# Upward includes that still exist: (file, included header). None left: the
# Python extension plans through proto/plan_batch.h (PlanBatch, its bounds,
# kDefaultBatchLimits), not the planner service.
KNOWN = set()


# The files of flashcp_engine (worker/CMakeLists.txt), by stem.
ENGINE = ["thread_pool", "attention_cpu", "attention_reference", "mask_reference",
          "communicator", "gloo_communicator", "engine", "cp_layout", "a2a_layout",
          "two_level_layout", "a2a_step",
          "attention_masked_cpu", "cp_layout_mask",
          "cpstep", "rank_backend", "graph_cache"]
ENGINE_FORBIDDEN = ("grpc/", "grpcpp/", "prometheus/", "core/runtime/", "core/ilp/", "proto/rpc/",
                    "client/")


def sources(folder):
    for path in sorted((ROOT / folder).rglob("*")):
        if path.suffix in (".h", ".cc", ".cu", ".cuh") and "build" not in path.parts:
            yield path


def is_test(rel):
    return rel.endswith("_test.cc") or "/testing/" in rel or rel.startswith("tests/")


def is_program(rel):
    # A program's main (flashcp-plan's, flashcp-planner's, ...): it links the
    # injected parts (core/ilp) and registers them.
    return rel.endswith("main.cc")


def folder_of(inc):
    # The folder an include belongs to: a SUBFOLDER is its own; a generated
    # gRPC stub header (flashcp/v1/*.grpc.pb.h) is proto/rpc's.
    if inc.endswith(".grpc.pb.h"):
        return "proto/rpc"
    for sub in SUBFOLDERS:
        if inc.startswith(sub + "/"):
            return sub
    return inc.split("/", 1)[0]


def includes(path):
    return INCLUDE.findall(path.read_text(errors="replace"))


def check_internal(errors):
    internal = ROOT / "core/internal"
    graph = {}
    for path in sources("core/internal"):
        rel = path.relative_to(ROOT).as_posix()
        layer = LAYER_OF.get(path.stem)
        if layer is None:
            errors.append(f"{rel}: in no layer of scripts/check_includes.py (add it to LAYERS)")
            continue
        for inc in includes(path):
            if not inc.startswith("core/internal/"):
                continue
            target = pathlib.Path(inc).stem
            if path.suffix == ".h":
                graph.setdefault(path.name, []).append(pathlib.Path(inc).name)
            their = LAYER_OF.get(target)
            if their is None:
                errors.append(f"{rel}: includes {inc}, in no layer")
            elif their > layer:
                errors.append(f"{rel} (layer {layer}) includes {inc} (layer {their}): upward")
    # No cycle among the headers.
    state = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                errors.append("core/internal header cycle: " + " -> ".join(stack + [node, nxt]))
            elif state.get(nxt) is None and (internal / nxt).exists():
                visit(nxt, stack + [node])
        state[node] = 2

    for node in sorted(graph):
        if state.get(node) is None:
            visit(node, [])
    for path in sorted((ROOT / "core").glob("*.h")):
        for inc in includes(path):
            if inc.startswith("core/internal/"):
                errors.append(f"core/{path.name}: a public header includes {inc}")


def check_folders(errors):
    seen = set()
    for folder, forbidden in FORBIDDEN.items():
        for path in sources(folder):
            rel = path.relative_to(ROOT).as_posix()
            owner = max((f for f in FORBIDDEN if rel.startswith(f + "/")), key=len)
            if is_test(rel) or owner != folder:
                continue
            for inc in includes(path):
                top = folder_of(inc)
                if top not in forbidden or (top == "core/ilp" and is_program(rel)):
                    continue
                if (rel, inc) in KNOWN:
                    seen.add((rel, inc))
                    continue
                errors.append(f"{rel} ({folder}) includes {inc} ({top}): upward")
    for rel, inc in sorted(KNOWN - seen):
        errors.append(f"KNOWN lists {rel} -> {inc}, which no longer exists: remove it")


def check_engine(errors):
    files = [ROOT / "worker" / f"{stem}{ext}" for stem in ENGINE for ext in (".h", ".cc")]
    files += list(sources("client/python/native"))
    files += list(sources("worker/cuda"))
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if not path.exists() or is_test(rel):
            continue
        for inc in includes(path):
            if inc.startswith("client/python/native/") or inc.startswith("worker/cuda/"):
                continue
            worker_stem = pathlib.Path(inc).stem if inc.startswith("worker/") else None
            if (inc.startswith(ENGINE_FORBIDDEN) or inc.endswith(".grpc.pb.h")
                    or (worker_stem is not None and worker_stem not in ENGINE)):
                errors.append(f"{rel} (engine or extension) includes {inc}: not the engine's")


def main():
    errors = []
    check_internal(errors)
    check_folders(errors)
    check_engine(errors)
    for e in errors:
        print(e)
    if not errors:
        print(f"include rules hold ({len(KNOWN)} known upward includes left)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
