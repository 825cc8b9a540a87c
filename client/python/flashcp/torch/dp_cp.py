"""DP x CP: data-parallel replicas, each replica one CP group (a 2-D
DeviceMesh with dims ("dp", "cp"), as torchtitan lays it out).

    mesh = flashcp.torch.dp_cp.mesh(dp=2, cp=2)        # after init_process_group
    model = flashcp.torch.dp_cp.data_parallel(model, mesh, "ddp")   # or "fsdp2"
    batch = flashcp.torch.hf.cp_batch(docs_of_my_replica, cp_group(mesh),
                                      count_group=dp_cp_group(mesh))
    loss = model(**batch).loss
    (loss * loss_scale(mesh)).backward()               # then optimizer.step()

Which group does what, and why the loss is scaled:
- The CP exchange runs on the "cp" group (the ranks of one replica, which
  hold one packed batch's tokens between them); the plan is the cp group's.
- Gradients are reduced over every rank, dp x cp (the flattened mesh): the
  ranks of a CP group hold the gradients of different tokens of one batch,
  so they must be summed over the cp ranks as over the replicas.
- num_items_in_batch is counted over the dp x cp group, so each rank's loss
  is its share of one mean over every labelled token of the step, and the
  right gradient is the plain sum of the ranks' gradients. DDP and FSDP
  average instead (they divide by the dp x cp ranks they span): multiply the
  loss by loss_scale(mesh) = dp x cp. (A loop that normalizes each
  replica's loss by its own replica's count, the usual DP mean of means,
  multiplies by cp_size instead: the average over the replicas is then
  wanted, the sum over each replica's cp ranks still is.)
Equal to single-process training on the union of the replicas' documents:
tests_torch/test_dp_cp.py (DDP and FSDP2, DP 2 x CP 2, gloo on CPU); on
GPUs (NCCL) neither has run yet (docs/gpu.md).
"""
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DP, CP = "dp", "cp"
DP_CP = "dp_cp"


def mesh(dp: int, cp: int, device_type: str = "cpu") -> DeviceMesh:
    """The 2-D mesh (dp, cp) over the default group (world size dp x cp;
    ranks r = d * cp + c: the cp ranks of a replica are consecutive)."""
    world = dist.get_world_size()
    if dp < 1 or cp < 1 or dp * cp != world:
        raise ValueError(f"dp {dp} x cp {cp} must equal the world size {world}")
    return init_device_mesh(device_type, (dp, cp), mesh_dim_names=(DP, CP))


def cp_group(m: DeviceMesh):
    """This rank's CP group (its replica's ranks): CpContext's and cp_batch's."""
    return m[CP].get_group()


def dp_group(m: DeviceMesh):
    """The ranks holding the same CP position in every replica."""
    return m[DP].get_group()


def dp_cp_mesh(m: DeviceMesh) -> DeviceMesh:
    """The flattened 1-D mesh of dp x cp (every rank of the 2-D mesh): the
    one gradients are reduced over."""
    flat = getattr(m, "_flashcp_dp_cp", None)  # made once: a new group is a collective
    if flat is None:
        flat = m[DP, CP]._flatten(DP_CP)
        m._flashcp_dp_cp = flat
    return flat


def dp_cp_group(m: DeviceMesh):
    """The process group of dp_cp_mesh: num_items_in_batch's count_group."""
    return dp_cp_mesh(m).get_group()


def loss_scale(m: DeviceMesh) -> int:
    """dp x cp: what DDP's and FSDP's averaging over dp x cp ranks divides by
    (see the module's docstring)."""
    return m.size()


def data_parallel(model: torch.nn.Module, m: DeviceMesh, kind: str = "ddp") -> Any:
    """The model wrapped for gradient reduction over dp x cp: "ddp"
    (DistributedDataParallel on the flattened group) or "fsdp2" (fully_shard
    of each layer of the model's layer stacks, then the root, on the
    flattened mesh; parameters become DTensors: p.full_tensor() gathers one,
    a collective). Both run on a CPU (gloo) mesh as on a CUDA one."""
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, process_group=dp_cp_group(m))
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        flat = dp_cp_mesh(m)
        for layer in _layers(model):
            fully_shard(layer, mesh=flat)
        fully_shard(model, mesh=flat)
        return model
    raise ValueError(f"kind: {kind!r}; expected 'ddp' or 'fsdp2'")


def _layers(model: torch.nn.Module):
    """The modules of the model's layer stacks (every nn.ModuleList's items)."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList):
            yield from mod


__all__ = ["DP", "CP", "DP_CP", "cp_group", "data_parallel", "dp_cp_group", "dp_cp_mesh",
           "dp_group", "loss_scale", "mesh"]
