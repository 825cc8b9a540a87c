"""DP x CP training on real gloo ranks (flashcp.torch.dp_cp) and its
single-process reference. Importable by the ranks (harness)."""
import torch
import torch.distributed as dist

import hf_cases

LR = 0.5


def _params(model):
    """Parameters by name (DDP's module. prefix dropped), as numpy copies;
    FSDP2's sharded DTensors gathered whole (a collective: every rank calls)."""
    from torch.distributed.tensor import DTensor
    out = {}
    for k, p in model.named_parameters():
        p = p.detach()
        if isinstance(p, DTensor):
            p = p.full_tensor()
        out[k.removeprefix("module.")] = p.numpy().copy()
    return out


def train_rank(rank, n, kind, arch, seed, steps, dp, cp):
    """steps: per step, each replica's documents. Returns (global losses,
    final parameters) from rank 0, the replica and cp rank of each rank, and
    whether every parameter is a DTensor (sharded by FSDP2)."""
    import flashcp.torch.dp_cp as dpcp
    import flashcp.torch.hf as fhf
    mesh = dpcp.mesh(dp, cp)
    replica = mesh.get_local_rank(dpcp.DP)
    model = dpcp.data_parallel(hf_cases.model(arch, seed, fhf.ATTN_IMPLEMENTATION), mesh, kind)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for docs in steps:
        batch = fhf.cp_batch(docs[replica], dpcp.cp_group(mesh),
                             count_group=dpcp.dp_cp_group(mesh),
                             plan_fields=dict(min_shard_tokens=8))
        loss = model(**batch).loss
        (loss * dpcp.loss_scale(mesh)).backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    from torch.distributed.tensor import DTensor
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    params = _params(model)
    return (losses, params if rank == 0 else None, replica, mesh.get_local_rank(dpcp.CP),
            sharded)


def train_reference(arch, seed, steps):
    """One process, no CP, no DP: each step's documents of every replica,
    loss = mean over all their labelled tokens, the same SGD."""
    torch.set_num_threads(1)
    model = hf_cases.model(arch, seed, "eager")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for docs in steps:
        every = [d for replica in docs for d in replica]
        count = torch.tensor(sum(len(d) - 1 for d in every))
        total = 0.0
        for d in every:
            ids = torch.tensor([d])
            out = model(input_ids=ids, labels=ids, num_items_in_batch=count, use_cache=False)
            out.loss.backward()
            total += out.loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, {k: p.detach().numpy().copy() for k, p in model.named_parameters()}
