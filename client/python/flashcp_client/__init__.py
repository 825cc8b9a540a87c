"""Python client for the FlashCP planner service (flashcp.v1).

    from flashcp_client import Client, Prefetcher

    client = Client("127.0.0.1:50051")
    plan = client.plan([4096, 100, 30000], cp_size=8, strategy="ring")
    future = client.plan_async([4096, 100], cp_size=2)       # grpc.Future
    for batch, plan in Prefetcher(client, loader, cp_size=8, depth=4, doc_lens=lambda b: b["lens"]):
        ...

Errors are grpc.RpcError with the server's code (e.g. INVALID_ARGUMENT naming
the field). Calls retry UNAVAILABLE with backoff (RetryPolicy, as the C++
RetryingPlannerClient; RetriesExhausted when they run out); a Prefetcher's
failed plan raises PrefetchError naming the item. A document length that is
not an integer is refused with TypeError. Messages are the generated
flashcp.v1 protos (planner_pb2; global_batch_pb2 for plan_global_batch;
plan_many_pb2 for plan_many).
"""
from flashcp_client._gen.flashcp.v1 import (global_batch_pb2, global_batch_pb2_grpc,
                                            plan_many_pb2, plan_many_pb2_grpc, planner_pb2,
                                            planner_pb2_grpc)
from flashcp_client.client import (NO_RETRY, PREFETCH_RETRY, Client, ItemError, PrefetchError,
                                   Prefetcher, RetriesExhausted, RetryPolicy)

__all__ = ["Client", "ItemError", "NO_RETRY", "PREFETCH_RETRY", "PrefetchError", "Prefetcher",
           "RetriesExhausted", "RetryPolicy", "global_batch_pb2", "global_batch_pb2_grpc",
           "plan_many_pb2", "plan_many_pb2_grpc", "planner_pb2", "planner_pb2_grpc"]
