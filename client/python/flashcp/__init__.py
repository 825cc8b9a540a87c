"""FlashCP for Python: plans (remote or in process) and, in flashcp.torch,
context-parallel attention inside a PyTorch training step.

    import flashcp
    plan = flashcp.plan([4096, 100, 30000], cp_size=4)            # in process (core/)
    plan = flashcp.Client("127.0.0.1:50051").plan([4096, 100], 4)  # the planner service
    pipe = flashcp.plan_pipeline([4096, 100, 30000], 4)           # pipeline plan (dict)
    g = flashcp.plan_global_batch(lens, dp_size=4, cp_size=8, context=131072)  # DP x CP

Both return a flashcp.v1 PlanResponse (planner_pb2); flashcp.torch.CpContext
takes either, or its JSON (flashcp-plan's output; response_from_json). Every
plan carries plan_hash (core/plan_hash.h) and planner_version; plan_hash(p)
computes the hash of any plan.
flashcp_client (the gRPC client) is part of this distribution; `import
flashcp_client` keeps working.
"""
from flashcp._global_batch import GlobalBatch, Replica, plan_global_batch
from flashcp._pipeline import pipeline_stage_order, plan_pipeline
from flashcp._plan import PlanError, PlanView, plan, plan_hash, plan_view, response_from_json
from flashcp_client import Client, Prefetcher, planner_pb2, planner_pb2_grpc

__all__ = ["Client", "GlobalBatch", "PlanError", "PlanView", "Prefetcher", "Replica",
           "pipeline_stage_order", "plan", "plan_global_batch", "plan_hash", "plan_pipeline",
           "plan_view", "planner_pb2", "planner_pb2_grpc", "response_from_json"]
