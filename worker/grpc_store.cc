#include "worker/grpc_store.h"

#include <algorithm>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gloo/common/error.h"
#include "grpcpp/grpcpp.h"
#include "proto/rendezvous_limits.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::worker {
namespace {

void SetDeadline(grpc::ClientContext& context, absl::Duration d) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + d));
}

// A wait's timeout_ms: clamped to [0, the server's limit] (a longer wait,
// e.g. one Gloo asks for, would be refused with INVALID_ARGUMENT).
int64_t WaitMillis(absl::Duration d) {
  return std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 0,
                             absl::ToInt64Milliseconds(proto::rendezvous::kMaxTimeout));
}

absl::Status WithContext(const grpc::Status& s, absl::string_view what) {
  const absl::Status status = proto::rpc::FromGrpcStatus(s);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("rendezvous ", what, ": ", status.message()));
}

// kMinMemberSecretBytes from the system's entropy source.
std::string RandomMemberSecret() {
  std::random_device entropy;
  std::string bytes(proto::rendezvous::kMinMemberSecretBytes, '\0');
  for (size_t i = 0; i < bytes.size(); i += 4) {
    const uint32_t r = entropy();
    for (size_t j = 0; j < 4 && i + j < bytes.size(); ++j) {
      bytes[i + j] = static_cast<char>((r >> (8 * j)) & 0xff);
    }
  }
  return bytes;
}

}  // namespace

RendezvousClient::RendezvousClient(std::shared_ptr<v1::Rendezvous::StubInterface> stub,
                                   std::string group, int32_t rank, uint64_t incarnation,
                                   std::string job_secret, absl::Duration rpc_slack)
    : stub_(std::move(stub)),
      group_(std::move(group)),
      rank_(rank),
      incarnation_(incarnation),
      job_secret_(std::move(job_secret)),
      member_secret_(RandomMemberSecret()),
      rpc_slack_(rpc_slack) {}

absl::StatusOr<int32_t> RendezvousClient::Join(int32_t world_size) {
  grpc::ClientContext context;
  SetDeadline(context, rpc_slack_);
  v1::JoinRequest request;
  request.set_group(group_);
  request.set_rank(rank_);
  request.set_world_size(world_size);
  request.set_incarnation(incarnation_);
  request.set_job_secret(job_secret_);
  request.set_member_secret(member_secret_);
  v1::JoinResponse response;
  const absl::Status s = WithContext(stub_->Join(&context, request, &response), "Join");
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  token_ = response.token();
  return response.world_size();
}

std::string RendezvousClient::token() const {
  absl::MutexLock lock(&mu_);
  return token_;
}

absl::StatusOr<std::vector<int32_t>> RendezvousClient::AwaitMembers(absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(context, absl::Milliseconds(WaitMillis(timeout)) + rpc_slack_);
  v1::AwaitMembersRequest request;
  request.set_group(group_);
  request.set_token(token());
  request.set_timeout_ms(WaitMillis(timeout));
  v1::AwaitMembersResponse response;
  const absl::Status s =
      WithContext(stub_->AwaitMembers(&context, request, &response), "AwaitMembers");
  if (!s.ok()) return s;
  return std::vector<int32_t>(response.ranks().begin(), response.ranks().end());
}

absl::Status RendezvousClient::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  SetDeadline(context, rpc_slack_);
  v1::SetRequest request;
  request.set_group(group_);
  request.set_token(token());
  request.set_key(key);
  request.set_value(value);
  v1::SetResponse response;
  return WithContext(stub_->Set(&context, request, &response), "Set");
}

absl::StatusOr<std::vector<std::string>> RendezvousClient::Get(const std::vector<std::string>& keys,
                                                               absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(context, absl::Milliseconds(WaitMillis(timeout)) + rpc_slack_);
  v1::GetRequest request;
  request.set_group(group_);
  request.set_token(token());
  for (const std::string& k : keys) request.add_keys(k);
  request.set_timeout_ms(WaitMillis(timeout));
  v1::GetResponse response;
  const absl::Status s = WithContext(stub_->Get(&context, request, &response), "Get");
  if (!s.ok()) return s;
  if (response.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("rendezvous Get: asked for ", keys.size(),
                                            " keys, got ", response.values_size(), " values"));
  }
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

absl::Status RendezvousClient::Abort(const std::string& reason) {
  grpc::ClientContext context;
  SetDeadline(context, rpc_slack_);
  v1::AbortRequest request;
  request.set_group(group_);
  request.set_token(token());
  request.set_rank(rank_);
  request.set_reason(reason.substr(0, proto::rendezvous::kMaxReasonBytes));
  v1::AbortResponse response;
  return WithContext(stub_->Abort(&context, request, &response), "Abort");
}

absl::Status RendezvousClient::Leave() {
  grpc::ClientContext context;
  SetDeadline(context, rpc_slack_);
  v1::LeaveRequest request;
  request.set_group(group_);
  request.set_token(token());
  request.set_rank(rank_);
  request.set_incarnation(incarnation_);
  v1::LeaveResponse response;
  return WithContext(stub_->Leave(&context, request, &response), "Leave");
}

absl::StatusOr<std::vector<int32_t>> AwaitGroup(RendezvousClient& rdv, int32_t world_size,
                                                absl::Time deadline, const core::Clock& clock) {
  for (int rejoins = 0;; ++rejoins) {
    absl::StatusOr<std::vector<int32_t>> members =
        rdv.AwaitMembers(std::max(deadline - clock.Now(), absl::ZeroDuration()));
    if (members.status().code() != absl::StatusCode::kPermissionDenied ||
        rejoins == kMaxRejoins || clock.Now() >= deadline) {
      return members;
    }
    // Replaced before the group formed: take the rank back.
    FLASHCP_RETURN_IF_ERROR(rdv.Join(world_size).status());
  }
}

GrpcStore::GrpcStore(RendezvousClient* client, absl::Duration timeout)
    : client_(client), timeout_(timeout) {}

void GrpcStore::Throw(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = status;
  }
  // FromException in gloo_communicator.cc reads "Timed out" as a deadline.
  const bool deadline = status.code() == absl::StatusCode::kDeadlineExceeded;
  throw gloo::IoException(absl::StrCat(deadline ? "Timed out: " : "", status.ToString()));
}

void GrpcStore::set(const std::string& key, const std::vector<char>& data) {
  const absl::Status s = client_->Set(key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GrpcStore::get(const std::string& key) {
  const auto values = client_->Get({key}, timeout_);
  if (!values.ok()) Throw(values.status());
  return std::vector<char>(values->front().begin(), values->front().end());
}

void GrpcStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GrpcStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  const auto values = client_->Get(keys, absl::FromChrono(timeout));
  if (!values.ok()) Throw(values.status());
}

absl::Status GrpcStore::first_error() const {
  absl::MutexLock lock(&mu_);
  return first_error_;
}

namespace {

// The peer the first "from rank P" or "to rank P" in `message` names.
std::optional<int32_t> NamedPeer(absl::string_view message) {
  size_t at = absl::string_view::npos;
  size_t len = 0;
  for (absl::string_view marker : {"from rank ", "to rank "}) {
    const size_t i = message.find(marker);
    if (i < at) {
      at = i;
      len = marker.size();
    }
  }
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view digits = message.substr(at + len);
  digits = digits.substr(0, std::min(digits.find_first_not_of("0123456789"), digits.size()));
  int32_t peer = 0;
  if (digits.empty() || !absl::SimpleAtoi(digits, &peer)) return std::nullopt;
  return peer;
}

}  // namespace

std::string FailureKey(int32_t rank) { return absl::StrCat("flashcp.failure.", rank); }

absl::Status TraceGroupFailure(RendezvousClient& rdv, const absl::Status& failure,
                               absl::Duration wait) {
  if (!rdv.Set(FailureKey(rdv.rank()), failure.ToString()).ok()) return failure;
  std::string message(failure.message());
  std::set<int32_t> seen = {rdv.rank()};
  bool timed_out = failure.code() == absl::StatusCode::kDeadlineExceeded;
  std::string link = message;  // the failure whose peer is next
  for (;;) {
    const std::optional<int32_t> peer = NamedPeer(link);
    if (!peer.has_value() || !seen.insert(*peer).second) break;
    absl::StatusOr<std::vector<std::string>> theirs =
        rdv.Get({FailureKey(*peer)}, timed_out ? wait : absl::ZeroDuration());
    if (!theirs.ok()) break;  // published nothing (lost), or the group was aborted
    link = (*theirs)[0];
    absl::StrAppend(&message, "; rank ", *peer, " failed: ", link);
    timed_out = absl::StartsWith(link, "DEADLINE_EXCEEDED");
  }
  return absl::Status(failure.code(), message);
}

}  // namespace flashcp::worker
