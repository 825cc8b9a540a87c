"""flashcp.plan_global_batch: one global batch's documents over DP replicas,
each a CP group (core::PlanGlobalBatch through the native binding;
docs/planner.md, "Global batches")."""
import dataclasses
from typing import Iterable, List, Tuple

from flashcp._native import native
from flashcp._plan import PlanError, PlanView


@dataclasses.dataclass(frozen=True)
class Replica:
    """One DP replica: the pieces it packs (indices into
    GlobalBatch.piece_lens), their lengths (its batch, in that order), its
    attention workload (query-key pairs) and its CP plan (a PlanView that
    flashcp.torch.CpContext takes)."""
    pieces: Tuple[int, ...]
    doc_lens: Tuple[int, ...]
    workload: float
    plan: PlanView


@dataclasses.dataclass(frozen=True)
class GlobalBatch:
    """piece_lens / piece_doc: the documents, those longer than the context
    cut into context-sized pieces (piece i comes from document piece_doc[i]);
    imbalance: max / mean of the replicas' workloads; first_fit_imbalance:
    the same for first fit in arrival order, the baseline."""
    piece_lens: Tuple[int, ...]
    piece_doc: Tuple[int, ...]
    replicas: List[Replica]
    imbalance: float
    first_fit_imbalance: float


def plan_global_batch(doc_lens: Iterable[int], dp_size: int, cp_size: int, context: int,
                      strategy: str = "flashcp") -> GlobalBatch:
    """Which documents each of dp_size replicas packs (at most `context`
    tokens each, documents whole unless longer than `context`), balancing
    the replicas' attention work, and each replica's CP plan over cp_size
    ranks with `strategy`. Raises PlanError: INVALID_ARGUMENT naming the
    field, FAILED_PRECONDITION where the documents do not fit whole."""
    try:
        g = native().plan_global_batch([int(d) for d in doc_lens], int(dp_size), int(cp_size),
                                       int(context), str(strategy))
    except ValueError as e:
        raise PlanError("INVALID_ARGUMENT", str(e)) from None
    except RuntimeError as e:
        code, _, message = str(e).partition(": ")
        raise PlanError(code.upper().replace(" ", "_"), message) from None
    replicas = [Replica(tuple(r["pieces"]), tuple(r["doc_lens"]), float(r["workload"]),
                        PlanView(cp_size=int(cp_size), doc_lens=tuple(r["doc_lens"]),
                                 padding=int(r["padding"]),
                                 shards=tuple(tuple(s) for s in r["shards"]),
                                 strategy=str(strategy)))
                for r in g["replicas"]]
    return GlobalBatch(tuple(g["piece_lens"]), tuple(g["piece_doc"]), replicas,
                       float(g["imbalance"]), float(g["first_fit_imbalance"]))
