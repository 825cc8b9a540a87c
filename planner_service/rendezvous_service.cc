#include "planner_service/rendezvous_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "proto/grpc_status.h"

namespace flashcp::planner_service {
namespace {

absl::Status ValidateKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: must be 1..", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateTimeoutMs(int64_t timeout_ms) {
  if (timeout_ms < 0 || timeout_ms > absl::ToInt64Milliseconds(kMaxTimeout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms: must be in [0, ", absl::ToInt64Milliseconds(kMaxTimeout), "], got ",
        timeout_ms));
  }
  return absl::OkStatus();
}

// now + timeout_ms, but no later than the call's own deadline. A call
// without a deadline reports system_clock::time_point::max(); libstdc++'s
// system_clock counts int64 nanoseconds, so that is 2262-04-11T23:47:16Z,
// which absl::FromChrono converts exactly to a finite absl::Time centuries
// past any timeout_ms (<= 1 h): std::min needs no special case for it.
absl::Time WaitDeadline(const grpc::ServerContext& context, int64_t timeout_ms) {
  return std::min(absl::Now() + absl::Milliseconds(timeout_ms),
                  absl::FromChrono(context.deadline()));
}

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

}  // namespace

absl::Status ValidateGroupName(absl::string_view group) {
  if (group.empty() || group.size() > kMaxGroupNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("group: must be 1..", kMaxGroupNameBytes,
                                                   " characters [A-Za-z0-9._-], got ",
                                                   group.size(), " bytes"));
  }
  for (const char c : group) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("group: ", Quoted(group), " has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status RendezvousState::Usable(absl::string_view group_name, const Group** group) const {
  if (shut_down_) return absl::UnavailableError("rendezvous: the planner is shutting down");
  const auto it = groups_.find(group_name);
  if (it == groups_.end()) {
    return absl::NotFoundError(
        absl::StrCat("group ", Quoted(group_name), ": no such group (no rank has joined it)"));
  }
  if (it->second.aborted) {
    return absl::AbortedError(
        absl::StrCat("group ", Quoted(group_name), " aborted: ", it->second.abort_reason));
  }
  *group = &it->second;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> RendezvousState::Join(absl::string_view group_name, int32_t rank,
                                              int32_t world_size, uint64_t incarnation) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: must be in [1, ", kMaxWorldSize,
                                                   "], got ", world_size));
  }
  // For a group this call creates or re-forms, world_size is the request's:
  // a bad rank must be refused before that, or it would leave a memberless
  // group that nothing removes (Leave needs a member) or wipe a live abort.
  const auto bad_rank = [&] {
    return absl::InvalidArgumentError(absl::StrCat("rank: must be in [0, ", world_size,
                                                   ") for group ", Quoted(group_name), ", got ",
                                                   rank));
  };
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("rendezvous: the planner is shutting down");
  auto it = groups_.find(group_name);
  if (it == groups_.end()) {
    if (rank < 0 || rank >= world_size) return bad_rank();
    if (groups_.size() >= kMaxGroups) {
      return absl::ResourceExhaustedError(
          absl::StrCat("group ", Quoted(group_name), ": already ", kMaxGroups, " groups"));
    }
    it = groups_.emplace(std::string(group_name), Group{}).first;
    it->second.world_size = world_size;
  }
  Group& g = it->second;
  if (g.aborted) {
    const auto m = g.members.find(rank);
    if (m != g.members.end() && m->second == incarnation) {
      return absl::AbortedError(
          absl::StrCat("group ", Quoted(group_name), " aborted: ", g.abort_reason));
    }
    if (rank < 0 || rank >= world_size) return bad_rank();
    total_value_bytes_ -= g.value_bytes;
    g = Group{};  // a new incarnation re-forms the failed group
    g.world_size = world_size;
    changed_.SignalAll();
  }
  if (world_size != g.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", Quoted(group_name), " has world_size ", g.world_size,
                     "; rank ", rank, " joined with world_size ", world_size));
  }
  if (rank < 0 || rank >= g.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank: must be in [0, ", g.world_size,
                                                   ") for group ", Quoted(group_name), ", got ",
                                                   rank));
  }
  const auto [m, inserted] = g.members.emplace(rank, incarnation);
  if (!inserted && m->second != incarnation) {
    return absl::AlreadyExistsError(absl::StrCat(
        "group ", Quoted(group_name), ": rank ", rank, " is already a member (incarnation ",
        m->second, "); incarnation ", incarnation, " may join after it leaves"));
  }
  if (inserted) changed_.SignalAll();
  return g.world_size;
}

absl::StatusOr<std::vector<int32_t>> RendezvousState::AwaitMembers(absl::string_view group_name,
                                                                   absl::Time deadline) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  absl::MutexLock lock(&mu_);
  for (;;) {
    const Group* g = nullptr;
    FLASHCP_RETURN_IF_ERROR(Usable(group_name, &g));
    if (static_cast<int32_t>(g->members.size()) == g->world_size) {
      std::vector<int32_t> ranks;
      for (const auto& [rank, inc] : g->members) ranks.push_back(rank);
      return ranks;
    }
    if (changed_.WaitWithDeadline(&mu_, deadline)) {
      // Deadline passed: re-check once (the last change may have completed it).
      FLASHCP_RETURN_IF_ERROR(Usable(group_name, &g));
      if (static_cast<int32_t>(g->members.size()) == g->world_size) continue;
      std::vector<int32_t> missing;
      for (int32_t r = 0; r < g->world_size; ++r) {
        if (!g->members.contains(r)) missing.push_back(r);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("group ", Quoted(group_name), ": ranks ", absl::StrJoin(missing, ", "),
                       " of ", g->world_size, " have not joined"));
    }
  }
}

absl::Status RendezvousState::Set(absl::string_view group_name, absl::string_view key,
                                  absl::string_view value) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  FLASHCP_RETURN_IF_ERROR(ValidateKey(key));
  if (value.size() > kMaxValueBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value: at most ", kMaxValueBytes,
                                                     " bytes, got ", value.size()));
  }
  absl::MutexLock lock(&mu_);
  const Group* cg = nullptr;
  FLASHCP_RETURN_IF_ERROR(Usable(group_name, &cg));
  Group& g = groups_.find(group_name)->second;
  const auto it = g.kv.find(key);
  const int64_t old_bytes = it == g.kv.end() ? 0 : static_cast<int64_t>(it->second.size());
  if (it == g.kv.end() && g.kv.size() >= kMaxKeysPerGroup) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(group_name), ": already ", kMaxKeysPerGroup, " keys"));
  }
  if (g.value_bytes - old_bytes + static_cast<int64_t>(value.size()) > kMaxBytesPerGroup) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(group_name), ": values would exceed ", kMaxBytesPerGroup, " bytes"));
  }
  const int64_t growth = static_cast<int64_t>(value.size()) - old_bytes;
  if (total_value_bytes_ + growth > max_total_value_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(group_name), ": the values of all groups would exceed ",
        max_total_value_bytes_, " bytes (--rendezvous_max_bytes)"));
  }
  g.value_bytes += growth;
  total_value_bytes_ += growth;
  g.kv[std::string(key)] = std::string(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RendezvousState::Get(
    absl::string_view group_name, const std::vector<std::string>& keys, absl::Time deadline) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  if (keys.empty() || keys.size() > kMaxKeysPerGet) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys: must name 1..", kMaxKeysPerGet, " keys, got ", keys.size()));
  }
  for (const std::string& key : keys) FLASHCP_RETURN_IF_ERROR(ValidateKey(key));
  absl::MutexLock lock(&mu_);
  bool timed_out = false;
  for (;;) {
    const Group* g = nullptr;
    FLASHCP_RETURN_IF_ERROR(Usable(group_name, &g));
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (!g->kv.contains(key)) missing.push_back(Quoted(key));
    }
    if (missing.empty()) {
      std::vector<std::string> values;
      values.reserve(keys.size());
      for (const std::string& key : keys) values.push_back(g->kv.find(key)->second);
      return values;
    }
    if (timed_out) {
      return absl::DeadlineExceededError(absl::StrCat(
          "group ", Quoted(group_name), ": keys ", absl::StrJoin(missing, ", "), " not set"));
    }
    timed_out = changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::Status RendezvousState::Abort(absl::string_view group_name, int32_t rank,
                                    absl::string_view reason) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  if (reason.size() > kMaxReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason: at most ", kMaxReasonBytes, " bytes, got ", reason.size()));
  }
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("rendezvous: the planner is shutting down");
  const auto it = groups_.find(group_name);
  if (it == groups_.end()) {
    return absl::NotFoundError(
        absl::StrCat("group ", Quoted(group_name), ": no such group (no rank has joined it)"));
  }
  Group& g = it->second;
  if (!g.aborted) {
    g.aborted = true;
    g.abort_reason = absl::StrCat("rank ", rank, ": ", reason);
    changed_.SignalAll();
  }
  return absl::OkStatus();
}

absl::Status RendezvousState::Leave(absl::string_view group_name, int32_t rank,
                                    uint64_t incarnation) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("rendezvous: the planner is shutting down");
  const auto it = groups_.find(group_name);
  if (it != groups_.end()) {
    const auto m = it->second.members.find(rank);
    if (m != it->second.members.end() && m->second == incarnation) {
      it->second.members.erase(m);
      if (it->second.members.empty()) {
        total_value_bytes_ -= it->second.value_bytes;
        groups_.erase(it);
      }
      changed_.SignalAll();
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("group ", Quoted(group_name), ": rank ", rank,
                                          " incarnation ", incarnation, " is not a member"));
}

void RendezvousState::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  changed_.SignalAll();
}

size_t RendezvousState::group_count() const {
  absl::MutexLock lock(&mu_);
  return groups_.size();
}

grpc::Status RendezvousService::Join(grpc::ServerContext*, const v1::JoinRequest* request,
                                     v1::JoinResponse* response) {
  const absl::StatusOr<int32_t> ws = state_->Join(request->group(), request->rank(),
                                                  request->world_size(), request->incarnation());
  if (!ws.ok()) return proto::ToGrpcStatus(ws.status());
  response->set_world_size(*ws);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::AwaitMembers(grpc::ServerContext* context,
                                             const v1::AwaitMembersRequest* request,
                                             v1::AwaitMembersResponse* response) {
  if (absl::Status s = ValidateTimeoutMs(request->timeout_ms()); !s.ok()) {
    return proto::ToGrpcStatus(s);
  }
  const auto ranks =
      state_->AwaitMembers(request->group(), WaitDeadline(*context, request->timeout_ms()));
  if (!ranks.ok()) return proto::ToGrpcStatus(ranks.status());
  response->mutable_ranks()->Add(ranks->begin(), ranks->end());
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Set(grpc::ServerContext*, const v1::SetRequest* request,
                                    v1::SetResponse*) {
  return proto::ToGrpcStatus(state_->Set(request->group(), request->key(), request->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context, const v1::GetRequest* request,
                                    v1::GetResponse* response) {
  if (absl::Status s = ValidateTimeoutMs(request->timeout_ms()); !s.ok()) {
    return proto::ToGrpcStatus(s);
  }
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  auto values = state_->Get(request->group(), keys, WaitDeadline(*context, request->timeout_ms()));
  if (!values.ok()) return proto::ToGrpcStatus(values.status());
  for (std::string& v : *values) response->add_values(std::move(v));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Abort(grpc::ServerContext*, const v1::AbortRequest* request,
                                      v1::AbortResponse*) {
  return proto::ToGrpcStatus(state_->Abort(request->group(), request->rank(), request->reason()));
}

grpc::Status RendezvousService::Leave(grpc::ServerContext*, const v1::LeaveRequest* request,
                                      v1::LeaveResponse*) {
  return proto::ToGrpcStatus(
      state_->Leave(request->group(), request->rank(), request->incarnation()));
}

}  // namespace flashcp::planner_service
