"""plan_on_first_rank: one plan per CP group, made once and shared.

Every rank planning its own copy of the batch risks the ranks holding
different plans (two planner replicas of different versions, a fallback to
the in-process planner on one rank only); CpContext then refuses the step.
Here the group's first rank plans (the planner service through a Client, or
in process) and broadcasts the serialized PlanResponse, so the ranks hold the
same bytes.
"""
from typing import Any, Iterable, Optional

import grpc
import torch
import torch.distributed as dist

import flashcp
from flashcp._plan import PlanError
from flashcp.torch._context import ExchangeError, collective_device
from flashcp_client import planner_pb2

# The header every rank receives first: [status, payload bytes].
_OK, _FAILED = 0, 1


def plan_on_first_rank(doc_lens: Optional[Iterable[int]], group: Optional[Any] = None,
                       strategy: str = "", *, client: Optional[flashcp.Client] = None,
                       **fields: Any) -> planner_pb2.PlanResponse:
    """The plan of one batch on every rank of `group` (None: the default
    group), made by the group's rank 0 and broadcast (two broadcasts: an
    8-byte header, then the serialized PlanResponse). A collective: every
    rank calls it.

    doc_lens: the batch's document lengths; read on rank 0 only (the other
    ranks may pass None; CpContext(..., doc_lens=...) checks a rank's batch
    against the plan). cp_size is the group's size. client: plan with the
    planner service (Client.plan, its retries); None: in this process
    (flashcp.plan). strategy and fields: as flashcp.plan / Client.plan.

    Where rank 0 cannot plan, every rank raises: rank 0 the planner's own
    error (flashcp.PlanError, grpc.RpcError), the others flashcp.PlanError
    with the same code, naming rank 0. ExchangeError where a broadcast fails.
    """
    group = group if group is not None else dist.group.WORLD
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
    dev = collective_device(group)
    failure: Optional[BaseException] = None
    payload = b""
    if me == 0:
        try:
            if doc_lens is None:
                raise PlanError("INVALID_ARGUMENT",
                                "doc_lens: rank 0 of the group plans and needs the batch")
            if client is not None:
                resp = client.plan(doc_lens, n, strategy, **fields)
            else:
                resp = flashcp.plan(doc_lens, n, strategy, **fields)
            payload = resp.SerializeToString()
        except (PlanError, grpc.RpcError) as e:
            failure = e
            payload = f"{_code(e)}\n{_message(e)}".encode()
    header = torch.tensor([_FAILED if failure else _OK, len(payload)], dtype=torch.int64,
                          device=dev)
    _broadcast(header, src, group, me, "header")
    status, size = (int(x) for x in header.tolist())
    body = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(dev) if me == 0 and size
            else torch.empty(size, dtype=torch.uint8, device=dev))
    if size:
        _broadcast(body, src, group, me, "plan")
    data = body.cpu().numpy().tobytes() if me != 0 else payload
    if status == _FAILED:
        if failure is not None:
            raise failure
        code, _, message = data.decode(errors="replace").partition("\n")
        raise PlanError(code, f"rank 0 of the group (global rank {src}) could not plan the "
                              f"batch: {message}")
    return planner_pb2.PlanResponse.FromString(data)


def _broadcast(t: torch.Tensor, src: int, group, me: int, what: str) -> None:
    try:
        dist.broadcast(t, src, group=group)
    except RuntimeError as e:
        raise ExchangeError(f"rank {me}: plan_on_first_rank's {what} broadcast from rank 0 "
                            f"failed: {e}") from e


def _code(e: BaseException) -> str:
    if isinstance(e, PlanError):
        return e.code
    code = e.code() if callable(getattr(e, "code", None)) else None
    return code.name if code is not None else "UNKNOWN"


def _message(e: BaseException) -> str:
    if isinstance(e, PlanError):
        return str(e).partition(": ")[2]
    details = e.details() if callable(getattr(e, "details", None)) else None
    return details or str(e)
