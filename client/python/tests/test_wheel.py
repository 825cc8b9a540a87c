"""The flashcp wheel builds from a copy of client/python alone (no checkout
around it): setup.py generates the stubs from the proto copy committed in
client/python/proto, which must stay byte-identical to the tree's proto."""
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

PKG = pathlib.Path(__file__).resolve().parents[1]  # client/python
PROTO = pathlib.Path("flashcp/v1/planner.proto")
PROTOS = (PROTO, pathlib.Path("flashcp/v1/global_batch.proto"),
          pathlib.Path("flashcp/v1/plan_many.proto"))
BUILD_TIMEOUT_S = 300


def _copy_package(dest: pathlib.Path, with_proto: bool) -> pathlib.Path:
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache",
                                    *(() if with_proto else ("proto",)))
    shutil.copytree(PKG, dest, ignore=ignore)
    return dest


def _pip_wheel(src: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FLASHCP_PROTO_DIR"}
    # The venv's pinned setuptools and grpcio-tools, no index: nothing is downloaded.
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps",
         "--no-build-isolation", "--no-index", "-w", str(out), str(src)],
        cwd=src.parent, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)


def test_the_packaged_proto_is_the_trees_proto():
    for proto in PROTOS:
        tree = PKG.parents[1] / "proto" / proto
        copy = PKG / "proto" / proto
        assert copy.read_bytes() == tree.read_bytes(), (
            f"{copy} differs from {tree}: cp {tree} {copy}")


def test_a_copy_of_client_python_alone_builds_the_wheel(tmp_path):
    src = _copy_package(tmp_path / "python", with_proto=True)
    out = tmp_path / "dist"
    res = _pip_wheel(src, out)
    assert res.returncode == 0, res.stdout + res.stderr
    wheels = sorted(p.name for p in out.iterdir())
    assert wheels == ["flashcp-0.1.0-py3-none-any.whl"], wheels
    wheel = out / wheels[0]
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in ("flashcp_client/_gen/flashcp/v1/planner_pb2.py",
                 "flashcp_client/_gen/flashcp/v1/planner_pb2_grpc.py",
                 "flashcp_client/_gen/flashcp/v1/global_batch_pb2.py",
                 "flashcp_client/_gen/flashcp/v1/global_batch_pb2_grpc.py",
                 "flashcp_client/_gen/flashcp/v1/plan_many_pb2.py",
                 "flashcp_client/_gen/flashcp/v1/plan_many_pb2_grpc.py",
                 "flashcp_client/client.py", "flashcp/__init__.py",
                 "flashcp/torch/_attention.py"):
        assert want in names, (want, sorted(names))
    # The stubs import from the wheel itself (not from the installed package).
    code = ("import flashcp_client, flashcp_client._gen.flashcp.v1.planner_pb2 as pb;"
            "print(flashcp_client.__file__);"
            "print(pb.PlanRequest.DESCRIPTOR.full_name, pb.PlanResponse.DESCRIPTOR.full_name);"
            "import flashcp_client._gen.flashcp.v1.global_batch_pb2 as gb;"
            "print(gb.__file__, gb.GlobalBatchReplica.DESCRIPTOR.fields_by_name['plan']"
            ".message_type.full_name)")
    got = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(wheel)},
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    where, names_line, global_batch_line = got.stdout.splitlines()
    assert where.startswith(str(wheel)), where
    assert names_line == "flashcp.v1.PlanRequest flashcp.v1.PlanResponse"
    gb_where, gb_plan = global_batch_line.split()
    assert gb_where.startswith(str(wheel)), gb_where
    assert gb_plan == "flashcp.v1.PlanResponse"


def test_a_copy_without_its_proto_fails_naming_the_proto(tmp_path):
    src = _copy_package(tmp_path / "python", with_proto=False)
    res = _pip_wheel(src, tmp_path / "dist")
    assert res.returncode != 0
    assert f"{src / 'proto' / PROTO} not found: build from the FlashCP source tree" in (
        res.stdout + res.stderr), res.stdout + res.stderr
