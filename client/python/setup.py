"""Builds the flashcp distribution (packages flashcp, flashcp.torch and
flashcp_client), generating flashcp_client's gRPC stubs from the proto.

The proto is read from $FLASHCP_PROTO_DIR, else ../../proto (this file's place
in the FlashCP tree: the canonical proto), else ./proto, the copy committed
inside this folder (proto/flashcp/v1/planner.proto, global_batch.proto and
plan_many.proto,
kept byte-identical to the canonical ones by tests/test_wheel.py), so that a
copy of client/python alone, or its sdist, builds the wheel. grpc_tools.protoc
writes <name>_pb2.py and <name>_pb2_grpc.py into flashcp_client/_gen/ inside
the build tree only; the generated import lines are rewritten to point into
the package, so the stubs do not claim a top-level `flashcp` package.
"""
import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
PROTO = "flashcp/v1/planner.proto"
# Every proto the client's stubs come from (global_batch and plan_many import planner).
PROTOS = (PROTO, "flashcp/v1/global_batch.proto", "flashcp/v1/plan_many.proto")


def proto_dir() -> pathlib.Path:
    tree = HERE.parent.parent / "proto"
    default = tree if (tree / PROTO).is_file() else HERE / "proto"
    root = pathlib.Path(os.environ.get("FLASHCP_PROTO_DIR", default))
    if not (root / PROTO).is_file():
        raise RuntimeError(
            f"{root / PROTO} not found: build from the FlashCP source tree "
            "(pip install ./client/python), from a copy of client/python with its proto/ "
            "folder, or set FLASHCP_PROTO_DIR")
    return root


def generate(out_package: pathlib.Path) -> None:
    from grpc_tools import protoc  # build-time dependency (pyproject.toml)
    import grpc_tools

    root = proto_dir()
    out = out_package / "_gen"
    out.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{root}", f"-I{well_known}",
        f"--python_out={out}", f"--grpc_python_out={out}", *(str(root / p) for p in PROTOS),
    ])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {root} {PROTOS} (exit {rc})")
    gen = out / "flashcp" / "v1"
    for d in (out, out / "flashcp", gen):
        (d / "__init__.py").touch()
    for py in sorted(gen.glob("*_pb2*.py")):
        text = py.read_text()
        text = text.replace("from flashcp.v1 import ", "from flashcp_client._gen.flashcp.v1 import ")
        py.write_text(text)


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate(pathlib.Path(self.build_lib) / "flashcp_client")


class SdistWithProto(sdist):
    """Puts the protos into the sdist (proto/flashcp/v1/*.proto of PROTOS)."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for proto in PROTOS:
            dest = pathlib.Path(base_dir) / "proto" / proto
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes((proto_dir() / proto).read_bytes())


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto})
