// The Rendezvous gRPC service: a thin adapter from the callback API to
// RendezvousState, and RendezvousHost.
#include "planner_service/rendezvous_service.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/echo.h"
#include "core/status_macros.h"
#include "planner_service/rendezvous_internal.h"
#include "proto/rpc/grpc_status.h"
#include "proto/rpc/raw_message.h"

namespace flashcp::planner_service {

using rendezvous_internal::Aborted;
using rendezvous_internal::EntryBytes;
using rendezvous_internal::GroupKey;
using rendezvous_internal::NameSome;
using rendezvous_internal::NotAMember;
using rendezvous_internal::Quoted;
using rendezvous_internal::ShuttingDown;
using rendezvous_internal::ValidateKey;
using rendezvous_internal::ValidateTimeoutMs;

namespace {

Caller CallerOf(const grpc::CallbackServerContext& context) {
  std::vector<std::string> ids;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& id : auth->GetPeerIdentity()) ids.emplace_back(id.data(), id.size());
  }
  const std::string identity = JoinIdentities(ids);
  return Caller{PeerKey(context.peer(), identity), identity};
}

// A wait's reactor: finished by the state's callback (which fills the
// response first); a cancelled call cancels its wait, which then finishes
// it with CANCELLED. Deletes itself when gRPC is done with it.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit WaitReactor(RendezvousState* state) : state_(state) {}
  void Started(RendezvousState::WaitId id) { id_.store(id); }
  // Keeps an answer's charge (RendezvousState::Values) until gRPC is done
  // sending it; call before Finish.
  void Hold(std::shared_ptr<const void> charge) { charge_ = std::move(charge); }
  void OnCancel() override {
    const RendezvousState::WaitId id = id_.load();
    if (id != 0) state_->Cancel(id);
  }
  void OnDone() override { delete this; }

 private:
  RendezvousState* const state_;
  std::atomic<RendezvousState::WaitId> id_{0};
  std::shared_ptr<const void> charge_;
};

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                   const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(proto::rpc::ToGrpcStatus(status));
  return reactor;
}

// now + timeout_ms, but no later than the call's own deadline. A call
// without a deadline reports system_clock::time_point::max(); libstdc++'s
// system_clock counts int64 nanoseconds, so that is 2262-04-11T23:47:16Z,
// which absl::FromChrono converts exactly to a finite absl::Time centuries
// past any timeout_ms (<= 1 h): std::min needs no special case for it.
absl::Time WaitDeadline(const grpc::CallbackServerContext& context, const core::Clock& clock,
                        int64_t timeout_ms) {
  return std::min(clock.Now() + absl::Milliseconds(timeout_ms),
                  absl::FromChrono(context.deadline()));
}

}  // namespace

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* raw,
                                                  grpc::ByteBuffer* response) {
  v1::JoinRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  const absl::StatusOr<RendezvousState::Joined> joined =
      state_->Join(CallerOf(*context), request.group(), request.rank(), request.world_size(),
                   request.incarnation(),
                   RendezvousState::Secrets{request.job_secret(), request.member_secret()});
  if (!joined.ok()) return Finished(context, joined.status());
  v1::JoinResponse out;
  out.set_world_size(joined->world_size);
  out.set_token(joined->token);
  return Finished(context, proto::rpc::SerializeRaw(out, response));
}

grpc::ServerUnaryReactor* RendezvousService::AwaitMembers(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw,
                                                          grpc::ByteBuffer* response) {
  v1::AwaitMembersRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  if (absl::Status s = ValidateTimeoutMs(request.timeout_ms()); !s.ok()) {
    return Finished(context, s);
  }
  auto* reactor = new WaitReactor(state_);
  reactor->Started(state_->AwaitMembers(
      CallerOf(*context), request.group(), request.token(),
      WaitDeadline(*context, *clock_, request.timeout_ms()),
      [reactor, response](absl::StatusOr<std::vector<int32_t>> ranks) {
        absl::Status status = ranks.status();
        if (ranks.ok()) {
          v1::AwaitMembersResponse out;
          out.mutable_ranks()->Add(ranks->begin(), ranks->end());
          status = proto::rpc::SerializeRaw(out, response);
        }
        reactor->Finish(proto::rpc::ToGrpcStatus(status));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Set(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* response) {
  v1::SetRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = state_->Set(CallerOf(*context), request.group(), request.token(),
                               request.key(), request.value());
  if (s.ok()) s = proto::rpc::SerializeRaw(v1::SetResponse(), response);
  return Finished(context, s);
}

grpc::ServerUnaryReactor* RendezvousService::Get(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* response) {
  v1::GetRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  if (absl::Status s = ValidateTimeoutMs(request.timeout_ms()); !s.ok()) {
    return Finished(context, s);
  }
  auto* reactor = new WaitReactor(state_);
  reactor->Started(state_->Get(
      CallerOf(*context), request.group(), request.token(),
      std::vector<std::string>(request.keys().begin(), request.keys().end()),
      WaitDeadline(*context, *clock_, request.timeout_ms()),
      [reactor, response](absl::StatusOr<RendezvousState::Values> values) {
        absl::Status status = values.status();
        if (values.ok()) {
          // The one copy of the values, outside the state's lock.
          v1::GetResponse out;
          for (const RendezvousState::Value& v : values->values) out.add_values(*v);
          status = proto::rpc::SerializeRaw(out, response);
          reactor->Hold(std::move(values->charge));
        }
        reactor->Finish(proto::rpc::ToGrpcStatus(status));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Abort(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw,
                                                   grpc::ByteBuffer* response) {
  v1::AbortRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = state_->Abort(CallerOf(*context), request.group(), request.token(),
                                 request.rank(), request.reason());
  if (s.ok()) s = proto::rpc::SerializeRaw(v1::AbortResponse(), response);
  return Finished(context, s);
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw,
                                                   grpc::ByteBuffer* response) {
  v1::LeaveRequest request;
  if (absl::Status s = proto::rpc::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = state_->Leave(CallerOf(*context), request.group(), request.token(),
                                 request.rank(), request.incarnation());
  if (s.ok()) s = proto::rpc::SerializeRaw(v1::LeaveResponse(), response);
  return Finished(context, s);
}

RendezvousHost::RendezvousHost(RendezvousOptions options, const core::WaitClock* clock,
                               TokenSource tokens, RendezvousObserver* observer)
    : state_(options, clock != nullptr ? clock : &real_clock_, std::move(tokens), observer),
      service_(&state_, clock != nullptr ? clock : &real_clock_),
      timer_([this] { state_.RunTimer(); }) {}

RendezvousHost::~RendezvousHost() { Shutdown(); }

void RendezvousHost::Shutdown() {
  state_.Shutdown();
  if (timer_.joinable()) timer_.join();
}

}  // namespace flashcp::planner_service
