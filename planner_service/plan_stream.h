// The Planner service's PlanStream call (service.h): one reactor per stream,
// items planned on the pools and answered in completion order under flow
// control (plan_stream.cc says how).
#ifndef FLASHCP_PLANNER_SERVICE_PLAN_STREAM_H_
#define FLASHCP_PLANNER_SERVICE_PLAN_STREAM_H_

#include "grpcpp/grpcpp.h"
#include "planner_service/service.h"

namespace flashcp::planner_service {

// A new reactor for one PlanStream call; it deletes itself when done.
// `deps` outlives it.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewPlanStreamReactor(
    const ServiceDeps& deps, grpc::CallbackServerContext* context);

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_PLAN_STREAM_H_
