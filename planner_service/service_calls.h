// What every call of the Planner service (service.h) goes through, shared by
// its reactors (service.cc, plan_stream.cc, service_info.cc): who the caller
// is, a PlanRequest made ready to plan (size, parse, validation, the ILP
// switch, bounds), the pool and ILP budget it plans under, why a dropped
// call ended, and a response serialized for gRPC. Internal to the service.
#ifndef FLASHCP_PLANNER_SERVICE_SERVICE_CALLS_H_
#define FLASHCP_PLANNER_SERVICE_SERVICE_CALLS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/strategies.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "planner_service/calibration.h"
#include "planner_service/planning_pool.h"
#include "planner_service/service.h"
#include "proto/convert.h"

namespace flashcp::planner_service {

// Why a call that nobody waits for any more ended: its deadline passed, or the
// client cancelled it. `received`: when the call arrived.
absl::Status DroppedStatus(const grpc::CallbackServerContext& context, const core::Clock& clock,
                           absl::Time received);

// Whose calibration a call reads or feeds (calibration.h), and the key its
// reports are rate-limited by: the peer's mTLS identity where it presented
// one (its identities, each length-prefixed so that no two lists collide);
// else the connection (tenant) and its host (rate limit).
struct Caller {
  CalibrationCaller calibration;
  std::string rate_key;
};
Caller CallerOf(const grpc::CallbackServerContext& context);

// One PlanRequest message read off the wire and made ready to plan.
struct Prepared {
  proto::PlanInput input;
  int64_t response_bound = 0;  // bytes its answer may take (CheckPlanBounds)
};

// Size check, parse, validation, the ILP switch and the plan's bounds, in
// this order. `batch_id` is set once the message parsed.
absl::StatusOr<Prepared> Prepare(grpc::ByteBuffer* bytes, const ServiceDeps& deps,
                                 const std::string& tenant, uint64_t* batch_id);

// The same for a message already parsed (an item of PlanMany): validation,
// the ILP switch and the plan's bounds.
absl::StatusOr<Prepared> PrepareParsed(const v1::PlanRequest& request, const ServiceDeps& deps,
                                       const std::string& tenant);

// The StopToken of a call's plans: stop once the call is cancelled or its
// deadline passes (gRPC cancels it then), with DroppedStatus's reason.
// `context` and `clock` must outlive the plans (until the call finishes).
core::StopToken CallStopToken(const grpc::CallbackServerContext* context,
                              const core::Clock* clock, absl::Time received);

// The pool `strategy` plans on: the ILP has its own, so that its long plans
// never hold the threads the other strategies' quick ones need.
PlanningPool* PoolFor(const ServiceDeps& deps, core::Strategy strategy);

// The ILP's time limit counts from the call's arrival (`received`), setup
// and queueing included: CBC stops when it is spent.
void SetIlpBudget(const ServiceDeps& deps, absl::Time received, proto::PlanInput& input);

template <typename Message>
absl::StatusOr<grpc::ByteBuffer> Serialize(const Message& response) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  const grpc::Status s =
      grpc::SerializationTraits<Message>::Serialize(response, &bytes, &own_buffer);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("planner: cannot serialize the response: ",
                                            s.error_message()));
  }
  return bytes;
}

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_SERVICE_CALLS_H_
