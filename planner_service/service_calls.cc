#include "planner_service/service_calls.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/ilp/ilp.h"
#include "core/ilp_deadline.h"
#include "core/status_macros.h"
#include "proto/plan_batch.h"
#include "proto/rpc/raw_message.h"

namespace flashcp::planner_service {
namespace {

// A client whose deadline passes cancels the call itself, and that reaches us
// before our copy of the deadline (arrival time + the grpc-timeout header)
// passes: by the request's transit time, milliseconds on a loaded machine.
// A cancellation this close to the deadline is
// counted as the deadline's: within 50 ms, and within a tenth of the call's
// budget, so that an explicit cancel of a short call still counts as one.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(50);

// The host of a gRPC peer string ("ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1",
// "ipv6:[::1]:5000" -> "ipv6:[::1]"); other forms as they are.
std::string PeerHost(const std::string& peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return peer;
  const size_t colon = peer.rfind(':');
  return colon <= 4 ? peer : peer.substr(0, colon);
}

}  // namespace

// Why a call that nobody waits for any more ended: its deadline passed, or the
// client cancelled it. `received`: when the call arrived.
absl::Status DroppedStatus(const grpc::CallbackServerContext& context, const core::Clock& clock,
                           absl::Time received) {
  const absl::Time deadline = absl::FromChrono(context.deadline());
  const absl::Duration slack = std::min(kDeadlineSlack, (deadline - received) / 10);
  if (deadline <= clock.Now() + slack) {
    return absl::DeadlineExceededError("planner: the deadline passed before the plan was made");
  }
  return absl::CancelledError("planner: the call was cancelled before the plan was made");
}

Caller CallerOf(const grpc::CallbackServerContext& context) {
  Caller c;
  const std::string peer = context.peer();
  c.calibration.reporter = peer;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    std::string id = "id:";
    for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
      absl::StrAppend(&id, name.size(), ":", absl::string_view(name.data(), name.size()), ";");
    }
    c.calibration.tenant = id;
    c.rate_key = id;
  } else {
    c.calibration.tenant = absl::StrCat("conn:", peer);
    c.rate_key = absl::StrCat("host:", PeerHost(peer));
  }
  return c;
}

// Size check, parse, validation, the ILP switch and the plan's bounds, in
// this order. `batch_id` is set once the message parsed.
absl::StatusOr<Prepared> Prepare(grpc::ByteBuffer* bytes, const ServiceDeps& deps,
                                 const std::string& tenant, uint64_t* batch_id) {
  const ServiceConfig& config = deps.config;
  const int64_t max_bytes = proto::MaxRequestBytes(config.limits);
  if (static_cast<int64_t>(bytes->Length()) > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request: ", bytes->Length(), " bytes, above the largest valid flashcp.v1.PlanRequest "
        "at this server's --max_docs, --max_tokens and --max_cp_size (", max_bytes, " bytes)"));
  }
  v1::PlanRequest request;
  FLASHCP_RETURN_IF_ERROR(proto::rpc::ParseRaw(bytes, &request));
  *batch_id = request.batch_id();
  return PrepareParsed(request, deps, tenant);
}

absl::StatusOr<Prepared> PrepareParsed(const v1::PlanRequest& request, const ServiceDeps& deps,
                                       const std::string& tenant) {
  const ServiceConfig& config = deps.config;
  // A named profile is planned with the caller's calibrated fit where it has
  // one, and validated against it (rank_speed), once.
  proto::CostResolver resolve;
  if (deps.calibration != nullptr) {
    resolve = [&](absl::string_view profile) {
      return deps.calibration->Resolve(tenant, profile);
    };
  }
  FLASHCP_ASSIGN_OR_RETURN(proto::PlanInput input,
                           proto::RequestFromProto(request, config.limits, resolve));
  if (input.strategy == core::Strategy::kIlp && !config.allow_ilp) {
    return absl::UnimplementedError(
        "strategy: ilp is disabled on this server (start it with --allow_ilp)");
  }
  // The planner links the ILP (core/ilp, CBC) and hands it to PlanBatch here.
  input.options.ilp.solver = core::ilp::Solve;
  FLASHCP_ASSIGN_OR_RETURN(const int64_t bound, proto::CheckPlanBounds(input, config.bounds));
  return Prepared{std::move(input), bound};
}

core::StopToken CallStopToken(const grpc::CallbackServerContext* context,
                              const core::Clock* clock, absl::Time received) {
  return core::StopToken([context, clock, received] {
    return context->IsCancelled() ? DroppedStatus(*context, *clock, received) : absl::OkStatus();
  });
}

// The pool `strategy` plans on: the ILP has its own, so that its long plans
// never hold the threads the other strategies' quick ones need.
PlanningPool* PoolFor(const ServiceDeps& deps, core::Strategy strategy) {
  return strategy == core::Strategy::kIlp ? deps.ilp_pool : deps.pool;
}

// The ILP's time limit counts from the call's arrival (`received`), setup
// and queueing included: CBC stops when it is spent.
void SetIlpBudget(const ServiceDeps& deps, absl::Time received, proto::PlanInput& input) {
  if (input.strategy != core::Strategy::kIlp) return;
  core::SetIlpDeadline(deps.config.ilp_time_limit, received, deps.clock, input.options.ilp);
}

}  // namespace flashcp::planner_service
