#include "planner_service/rendezvous_service.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
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
absl::Time WaitDeadline(const grpc::CallbackServerContext& context, const core::Clock& clock,
                        int64_t timeout_ms) {
  return std::min(clock.Now() + absl::Milliseconds(timeout_ms),
                  absl::FromChrono(context.deadline()));
}

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

absl::Status ShuttingDown() {
  return absl::UnavailableError("rendezvous: the planner is shutting down");
}

absl::Status NoSuchGroup(absl::string_view group) {
  return absl::NotFoundError(
      absl::StrCat("group ", Quoted(group), ": no such group (no rank has joined it)"));
}

absl::Status BoundToAnother(absl::string_view group, const Caller& caller) {
  return absl::PermissionDeniedError(
      absl::StrCat("group ", Quoted(group),
                   ": bound to the client identity that created it; this call's is ",
                   Quoted(caller.identity)));
}

int64_t EntryBytes(absl::string_view key, absl::string_view value) {
  return static_cast<int64_t>(key.size() + value.size()) + kEntryOverheadBytes;
}

Caller CallerOf(const grpc::CallbackServerContext& context) {
  std::string identity;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& id : auth->GetPeerIdentity()) {
      if (!identity.empty()) identity += ",";
      identity.append(id.data(), id.size());
    }
  }
  return Caller{PeerKey(context.peer(), identity), identity};
}

// A wait's reactor: finished by the state's callback (which fills the
// response first); a cancelled call cancels its wait, which then finishes
// it with CANCELLED. Deletes itself when gRPC is done with it.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit WaitReactor(RendezvousState* state) : state_(state) {}
  void Started(RendezvousState::WaitId id) { id_.store(id); }
  void OnCancel() override {
    const RendezvousState::WaitId id = id_.load();
    if (id != 0) state_->Cancel(id);
  }
  void OnDone() override { delete this; }

 private:
  RendezvousState* const state_;
  std::atomic<RendezvousState::WaitId> id_{0};
};

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                   const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(proto::ToGrpcStatus(status));
  return reactor;
}

}  // namespace

std::string PeerKey(absl::string_view grpc_peer, absl::string_view identity) {
  if (!identity.empty()) return absl::StrCat("identity:", identity);
  if (absl::StartsWith(grpc_peer, "ipv4:") || absl::StartsWith(grpc_peer, "ipv6:")) {
    const size_t colon = grpc_peer.rfind(':');
    if (colon > 4) return std::string(grpc_peer.substr(0, colon));
  }
  return std::string(grpc_peer);
}

std::string RandomToken() {
  std::random_device entropy;
  std::string bytes(16, '\0');
  for (size_t i = 0; i < bytes.size(); i += 4) {
    const uint32_t r = entropy();
    for (size_t j = 0; j < 4; ++j) bytes[i + j] = static_cast<char>((r >> (8 * j)) & 0xff);
  }
  return absl::BytesToHexString(bytes);
}

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

RendezvousState::RendezvousState(RendezvousOptions options, const core::WaitClock* clock,
                                 TokenSource tokens)
    : options_(options), clock_(clock), tokens_(std::move(tokens)) {}

absl::StatusOr<RendezvousState::GroupMap::iterator> RendezvousState::FindMember(
    const Caller& caller, absl::string_view group_name, absl::string_view token, int32_t* rank) {
  if (shut_down_) return ShuttingDown();
  const auto it = groups_.find(group_name);
  if (it == groups_.end()) return NoSuchGroup(group_name);
  Group& g = it->second;
  if (g.identity != caller.identity) return BoundToAnother(group_name, caller);
  if (token.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "group ", Quoted(group_name), ": the call carries no token (Join returns one)"));
  }
  const auto t = g.rank_of_token.find(token);
  if (t == g.rank_of_token.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("group ", Quoted(group_name),
                     ": the token is no live member's (a replaced member's token, or one from "
                     "before the group was re-formed or expired, is void)"));
  }
  *rank = t->second;
  g.last_call = clock_->Now();
  return it;
}

absl::StatusOr<RendezvousState::Joined> RendezvousState::Join(const Caller& caller,
                                                              absl::string_view group_name,
                                                              int32_t rank, int32_t world_size,
                                                              uint64_t incarnation) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: must be in [1, ", kMaxWorldSize,
                                                   "], got ", world_size));
  }
  // For a group this call creates or re-forms, world_size is the request's:
  // a bad rank must be refused before that, or it would leave a memberless
  // group that nothing removes (Leave needs a member) or wipe a live abort.
  const auto bad_rank = [&](int32_t size) {
    return absl::InvalidArgumentError(absl::StrCat("rank: must be in [0, ", size,
                                                   ") for group ", Quoted(group_name), ", got ",
                                                   rank));
  };
  const auto forming_bound = [&]() -> absl::Status {
    const auto f = forming_per_peer_.find(caller.peer);
    if (f != forming_per_peer_.end() && f->second >= options_.max_forming_groups_per_peer) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "group ", Quoted(group_name), ": peer ", Quoted(caller.peer), " already has ",
          f->second, " groups that never had all their ranks (--rendezvous_max_forming_per_peer)"));
    }
    return absl::OkStatus();
  };
  const auto charge = [&](Group& g) {
    g.forming_peer = caller.peer;
    ++forming_per_peer_[caller.peer];
  };
  Ready ready;
  absl::StatusOr<Joined> result;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return ShuttingDown();
    const absl::Time now = clock_->Now();
    auto it = groups_.find(group_name);
    if (it == groups_.end()) {
      if (rank < 0 || rank >= world_size) return bad_rank(world_size);
      if (groups_.size() >= kMaxGroups) ExpireIdle(now, ready);
      if (groups_.size() >= kMaxGroups) {
        return absl::ResourceExhaustedError(
            absl::StrCat("group ", Quoted(group_name), ": already ", kMaxGroups, " groups"));
      }
      if (world_size > 1) FLASHCP_RETURN_IF_ERROR(forming_bound());  // else formed at once
      it = groups_.emplace(std::string(group_name), Group{}).first;
      it->second.world_size = world_size;
      it->second.identity = caller.identity;
      charge(it->second);
    }
    Group& g = it->second;
    if (g.identity != caller.identity) return BoundToAnother(group_name, caller);
    if (g.aborted) {
      const auto m = g.members.find(rank);
      if (m != g.members.end() && m->second.incarnation == incarnation) {
        return absl::AbortedError(
            absl::StrCat("group ", Quoted(group_name), " aborted: ", g.abort_reason));
      }
      if (rank < 0 || rank >= world_size) return bad_rank(world_size);
      if (world_size > 1 && g.forming_peer != caller.peer) {
        FLASHCP_RETURN_IF_ERROR(forming_bound());
      }
      // A new incarnation re-forms the failed group (it has no waiters: the
      // abort finished them).
      Uncharge(g);
      total_bytes_ -= g.bytes;
      const std::string identity = g.identity;
      g = Group{};
      g.world_size = world_size;
      g.identity = identity;
      charge(g);
    }
    if (world_size != g.world_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("group ", Quoted(group_name), " has world_size ", g.world_size,
                       "; rank ", rank, " joined with world_size ", world_size));
    }
    if (rank < 0 || rank >= g.world_size) return bad_rank(g.world_size);
    const auto m = g.members.find(rank);
    if (m != g.members.end()) {
      Member& member = m->second;
      if (member.incarnation == incarnation) {  // a retry
        g.last_call = now;
        return Joined{g.world_size, member.token};
      }
      if (g.formed) {
        return absl::AlreadyExistsError(absl::StrCat(
            "group ", Quoted(group_name), ": rank ", rank, " is already a member (incarnation ",
            member.incarnation, "); incarnation ", incarnation, " may join after it leaves"));
      }
      // The group never formed: the newer incarnation takes the rank, so a
      // stray or stale member cannot hold it.
      FailWaiters(g,
                  absl::PermissionDeniedError(absl::StrCat(
                      "group ", Quoted(group_name), ": rank ", rank, " (incarnation ",
                      member.incarnation, ") was replaced by incarnation ", incarnation,
                      " before the group formed")),
                  ready, member.token);
      g.last_call = now;
      g.rank_of_token.erase(member.token);
      member = Member{incarnation, tokens_()};
      g.rank_of_token[member.token] = rank;
      result = Joined{g.world_size, member.token};
    } else {
      g.last_call = now;
      Member& member = g.members[rank];
      member = Member{incarnation, tokens_()};
      g.rank_of_token[member.token] = rank;
      result = Joined{g.world_size, member.token};
      if (static_cast<int32_t>(g.members.size()) == g.world_size && !g.formed) {
        g.formed = true;
        Uncharge(g);
      }
      Wake(it, ready);
    }
  }
  for (auto& r : ready) r();
  return result;
}

void RendezvousState::Fail(Waiter& w, absl::Status status, Ready& ready) {
  if (!w.is_get()) {
    ready.push_back([done = std::move(w.members_done), status] { done(status); });
  } else {
    ready.push_back([done = std::move(w.values_done), status] { done(status); });
  }
}

bool RendezvousState::Answer(const Group& g, const std::string& name, Waiter& w, Ready& ready,
                             bool timed_out) {
  const auto fail = [&](absl::Status s) {
    Fail(w, s, ready);
    return true;
  };
  if (g.aborted) return fail(absl::AbortedError(absl::StrCat("group ", Quoted(name), " aborted: ",
                                                             g.abort_reason)));
  if (!w.is_get()) {
    if (static_cast<int32_t>(g.members.size()) == g.world_size) {
      std::vector<int32_t> ranks;
      ranks.reserve(g.members.size());
      for (const auto& [rank, member] : g.members) ranks.push_back(rank);
      ready.push_back([done = std::move(w.members_done), r = std::move(ranks)]() mutable {
        done(std::move(r));
      });
      return true;
    }
    if (!timed_out) return false;
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < g.world_size; ++r) {
      if (!g.members.contains(r)) missing.push_back(r);
    }
    return fail(absl::DeadlineExceededError(
        absl::StrCat("group ", Quoted(name), ": ranks ", absl::StrJoin(missing, ", "), " of ",
                     g.world_size, " have not joined")));
  }
  // Sizes first: nothing is copied for an answer over the bound.
  int64_t bytes = 0;
  std::vector<std::string> missing;
  for (const std::string& key : w.keys) {
    const auto it = g.kv.find(key);
    if (it == g.kv.end()) {
      missing.push_back(Quoted(key));
    } else {
      bytes += static_cast<int64_t>(it->second.size());
    }
  }
  if (!missing.empty()) {
    if (!timed_out) return false;
    return fail(absl::DeadlineExceededError(absl::StrCat(
        "group ", Quoted(name), ": keys ", absl::StrJoin(missing, ", "), " not set")));
  }
  if (bytes > kMaxGetResponseBytes) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": the values of the ", w.keys.size(), " keys are ", bytes,
        " bytes; a Get returns at most ", kMaxGetResponseBytes, " (ask for fewer keys)")));
  }
  std::vector<std::string> values;
  values.reserve(w.keys.size());
  for (const std::string& key : w.keys) values.push_back(g.kv.find(key)->second);
  ready.push_back([done = std::move(w.values_done), v = std::move(values)]() mutable {
    done(std::move(v));
  });
  return true;
}

RendezvousState::WaitId RendezvousState::Register(GroupMap::iterator it, Waiter w, Ready& ready) {
  Group& g = it->second;
  if (Answer(g, it->first, w, ready, /*timed_out=*/w.deadline <= clock_->Now())) return 0;
  if (static_cast<int64_t>(waiters_.size()) >= options_.max_waiters) {
    const absl::Status s = absl::ResourceExhaustedError(
        absl::StrCat("group ", Quoted(it->first), ": already ", waiters_.size(),
                     " calls waiting (--rendezvous_max_waiters)"));
    Fail(w, s, ready);
    return 0;
  }
  const WaitId id = next_wait_id_++;
  if (deadlines_.empty() || w.deadline < deadlines_.begin()->first) timer_kick_ = true;
  deadlines_.emplace(w.deadline, id);
  g.waiters.insert(id);
  waiters_.emplace(id, std::move(w));
  return id;
}

void RendezvousState::EraseWaiter(WaitId id) {
  const auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  deadlines_.erase({it->second.deadline, id});
  const auto g = groups_.find(it->second.group);
  if (g != groups_.end()) g->second.waiters.erase(id);
  waiters_.erase(it);
}

void RendezvousState::Wake(GroupMap::iterator it, Ready& ready) {
  Group& g = it->second;
  const std::vector<WaitId> ids(g.waiters.begin(), g.waiters.end());
  for (const WaitId id : ids) {
    ++waiter_checks_;
    if (Answer(g, it->first, waiters_.at(id), ready, /*timed_out=*/false)) {
      EraseWaiter(id);
      g.last_call = clock_->Now();
    }
  }
}

void RendezvousState::FailWaiters(Group& g, const absl::Status& status, Ready& ready,
                                  absl::string_view token) {
  const std::vector<WaitId> ids(g.waiters.begin(), g.waiters.end());
  for (const WaitId id : ids) {
    Waiter& w = waiters_.at(id);
    if (!token.empty() && w.token != token) continue;
    Fail(w, status, ready);
    EraseWaiter(id);
  }
}

void RendezvousState::Uncharge(Group& g) {
  if (g.forming_peer.empty()) return;
  const auto f = forming_per_peer_.find(g.forming_peer);
  if (f != forming_per_peer_.end() && --f->second <= 0) forming_per_peer_.erase(f);
  g.forming_peer.clear();
}

void RendezvousState::EraseGroup(GroupMap::iterator it, const absl::Status& status,
                                 Ready& ready) {
  FailWaiters(it->second, status, ready);
  total_bytes_ -= it->second.bytes;
  Uncharge(it->second);
  groups_.erase(it);
}

void RendezvousState::ExpireIdle(absl::Time now, Ready& ready) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    const auto next = std::next(it);
    if (it->second.waiters.empty() && now - it->second.last_call >= options_.idle_timeout) {
      EraseGroup(it, absl::OkStatus(), ready);  // no waiters: the status reaches no one
    }
    it = next;
  }
}

RendezvousState::WaitId RendezvousState::StartWait(const Caller& caller, absl::Status valid,
                                                   Waiter w) {
  Ready ready;
  WaitId id = 0;
  if (valid.ok()) {
    absl::MutexLock lock(&mu_);
    int32_t rank = 0;
    absl::StatusOr<GroupMap::iterator> it = FindMember(caller, w.group, w.token, &rank);
    if (it.ok()) {
      id = Register(*it, std::move(w), ready);
    } else {
      valid = it.status();
    }
  }
  if (!valid.ok()) Fail(w, valid, ready);  // w was not moved
  for (auto& r : ready) r();
  return id;
}

RendezvousState::WaitId RendezvousState::AwaitMembers(const Caller& caller,
                                                      absl::string_view group_name,
                                                      absl::string_view token,
                                                      absl::Time deadline, MembersDone done) {
  return StartWait(caller, ValidateGroupName(group_name),
                   Waiter{std::string(group_name), std::string(token), {}, deadline,
                          std::move(done), nullptr});
}

RendezvousState::WaitId RendezvousState::Get(const Caller& caller, absl::string_view group_name,
                                             absl::string_view token,
                                             const std::vector<std::string>& keys,
                                             absl::Time deadline, ValuesDone done) {
  const auto validate = [&]() -> absl::Status {
    FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
    if (keys.empty() || keys.size() > kMaxKeysPerGet) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys: must name 1..", kMaxKeysPerGet, " keys, got ", keys.size()));
    }
    // Each key once: repeats would multiply the answer (issue 12: a 4 KB
    // request naming a 1 MiB value 2,049 times built a 2 GiB response).
    absl::flat_hash_set<absl::string_view> seen;
    seen.reserve(keys.size());
    for (const std::string& key : keys) {
      FLASHCP_RETURN_IF_ERROR(ValidateKey(key));
      if (!seen.insert(key).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("keys: ", Quoted(key), " is named more than once"));
      }
    }
    return absl::OkStatus();
  };
  return StartWait(caller, validate(),
                   Waiter{std::string(group_name), std::string(token), keys, deadline, nullptr,
                          std::move(done)});
}

void RendezvousState::Cancel(WaitId id) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    const auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    Fail(it->second, absl::CancelledError("rendezvous: the call was cancelled"), ready);
    EraseWaiter(id);
  }
  for (auto& r : ready) r();
}

absl::Status RendezvousState::Set(const Caller& caller, absl::string_view group_name,
                                  absl::string_view token, absl::string_view key,
                                  absl::string_view value) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  FLASHCP_RETURN_IF_ERROR(ValidateKey(key));
  if (value.size() > kMaxValueBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value: at most ", kMaxValueBytes,
                                                     " bytes, got ", value.size()));
  }
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    int32_t rank = 0;
    FLASHCP_ASSIGN_OR_RETURN(const GroupMap::iterator git,
                             FindMember(caller, group_name, token, &rank));
    Group& g = git->second;
    if (g.aborted) {
      return absl::AbortedError(
          absl::StrCat("group ", Quoted(group_name), " aborted: ", g.abort_reason));
    }
    const auto it = g.kv.find(key);
    const int64_t old_bytes = it == g.kv.end() ? 0 : EntryBytes(key, it->second);
    if (it == g.kv.end() && g.kv.size() >= kMaxKeysPerGroup) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "group ", Quoted(group_name), ": already ", kMaxKeysPerGroup, " keys"));
    }
    const int64_t growth = EntryBytes(key, value) - old_bytes;
    if (g.bytes + growth > kMaxBytesPerGroup) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "group ", Quoted(group_name), ": entries would exceed ", kMaxBytesPerGroup,
          " bytes (an entry counts key + value + ", kEntryOverheadBytes, " bytes)"));
    }
    if (total_bytes_ + growth > options_.max_total_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "group ", Quoted(group_name), ": the entries of all groups would exceed ",
          options_.max_total_bytes, " bytes (--rendezvous_max_bytes; an entry counts key + value + ",
          kEntryOverheadBytes, " bytes)"));
    }
    g.bytes += growth;
    total_bytes_ += growth;
    g.kv[std::string(key)] = std::string(value);
    Wake(git, ready);
  }
  for (auto& r : ready) r();
  return absl::OkStatus();
}

absl::Status RendezvousState::Abort(const Caller& caller, absl::string_view group_name,
                                    absl::string_view token, int32_t rank,
                                    absl::string_view reason) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  if (reason.size() > kMaxReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason: at most ", kMaxReasonBytes, " bytes, got ", reason.size()));
  }
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    int32_t own_rank = 0;
    FLASHCP_ASSIGN_OR_RETURN(const GroupMap::iterator it,
                             FindMember(caller, group_name, token, &own_rank));
    if (rank != own_rank) {
      return absl::PermissionDeniedError(absl::StrCat("group ", Quoted(group_name),
                                                      ": the token is rank ", own_rank,
                                                      "'s; an Abort names rank ", rank));
    }
    Group& g = it->second;
    if (!g.aborted) {
      g.aborted = true;
      g.abort_reason = absl::StrCat("rank ", rank, ": ", reason);
      Wake(it, ready);
    }
  }
  for (auto& r : ready) r();
  return absl::OkStatus();
}

absl::Status RendezvousState::Leave(const Caller& caller, absl::string_view group_name,
                                    absl::string_view token, int32_t rank, uint64_t incarnation) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    int32_t own_rank = 0;
    FLASHCP_ASSIGN_OR_RETURN(const GroupMap::iterator it,
                             FindMember(caller, group_name, token, &own_rank));
    Group& g = it->second;
    const auto m = g.members.find(own_rank);
    if (rank != own_rank || m->second.incarnation != incarnation) {
      return absl::PermissionDeniedError(absl::StrCat(
          "group ", Quoted(group_name), ": the token is rank ", own_rank, " incarnation ",
          m->second.incarnation, "'s; the Leave names rank ", rank, " incarnation ",
          incarnation));
    }
    // The member's own pending waits end with it.
    FailWaiters(g,
                absl::CancelledError(absl::StrCat("group ", Quoted(group_name), ": rank ",
                                                  rank, " left")),
                ready, m->second.token);
    g.rank_of_token.erase(m->second.token);
    g.members.erase(m);
    if (g.members.empty()) {
      EraseGroup(it, absl::OkStatus(), ready);  // its waiters were the member's
    } else {
      Wake(it, ready);
    }
  }
  for (auto& r : ready) r();
  return absl::OkStatus();
}

void RendezvousState::ExpireDue() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const WaitId id = deadlines_.begin()->second;
      Waiter& w = waiters_.at(id);
      const auto g = groups_.find(w.group);
      ++waiter_checks_;
      Answer(g->second, g->first, w, ready, /*timed_out=*/true);
      EraseWaiter(id);
      g->second.last_call = now;  // the waiting member was calling until now
    }
    ExpireIdle(now, ready);
  }
  for (auto& r : ready) r();
}

void RendezvousState::RunTimer() {
  // Idle groups are looked for at least this often (and whenever a Join
  // finds all kMaxGroups slots taken).
  const absl::Duration sweep = std::max(options_.idle_timeout / 4, absl::Milliseconds(100));
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return;
      absl::Time next = clock_->Now() + sweep;
      if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
      timer_kick_ = false;
      clock_->AwaitWithDeadline(mu_, absl::Condition(this, &RendezvousState::TimerShouldWake),
                                next);
      if (shut_down_) return;
    }
    ExpireDue();
  }
}

void RendezvousState::Shutdown() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [id, w] : waiters_) {
      Fail(w, ShuttingDown(), ready);
    }
    waiters_.clear();
    deadlines_.clear();
    for (auto& [name, g] : groups_) g.waiters.clear();
  }
  for (auto& r : ready) r();
}

size_t RendezvousState::group_count() const {
  absl::MutexLock lock(&mu_);
  return groups_.size();
}

size_t RendezvousState::waiter_count() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

uint64_t RendezvousState::waiter_checks() const {
  absl::MutexLock lock(&mu_);
  return waiter_checks_;
}

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* context,
                                                  const v1::JoinRequest* request,
                                                  v1::JoinResponse* response) {
  const absl::StatusOr<RendezvousState::Joined> joined =
      state_->Join(CallerOf(*context), request->group(), request->rank(), request->world_size(),
                   request->incarnation());
  if (joined.ok()) {
    response->set_world_size(joined->world_size);
    response->set_token(joined->token);
  }
  return Finished(context, joined.status());
}

grpc::ServerUnaryReactor* RendezvousService::AwaitMembers(grpc::CallbackServerContext* context,
                                                          const v1::AwaitMembersRequest* request,
                                                          v1::AwaitMembersResponse* response) {
  if (absl::Status s = ValidateTimeoutMs(request->timeout_ms()); !s.ok()) {
    return Finished(context, s);
  }
  auto* reactor = new WaitReactor(state_);
  reactor->Started(state_->AwaitMembers(
      CallerOf(*context), request->group(), request->token(),
      WaitDeadline(*context, *clock_, request->timeout_ms()),
      [reactor, response](absl::StatusOr<std::vector<int32_t>> ranks) {
        if (ranks.ok()) response->mutable_ranks()->Add(ranks->begin(), ranks->end());
        reactor->Finish(proto::ToGrpcStatus(ranks.status()));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Set(grpc::CallbackServerContext* context,
                                                 const v1::SetRequest* request, v1::SetResponse*) {
  return Finished(context, state_->Set(CallerOf(*context), request->group(), request->token(),
                                       request->key(), request->value()));
}

grpc::ServerUnaryReactor* RendezvousService::Get(grpc::CallbackServerContext* context,
                                                 const v1::GetRequest* request,
                                                 v1::GetResponse* response) {
  if (absl::Status s = ValidateTimeoutMs(request->timeout_ms()); !s.ok()) {
    return Finished(context, s);
  }
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  auto* reactor = new WaitReactor(state_);
  reactor->Started(state_->Get(
      CallerOf(*context), request->group(), request->token(), keys,
      WaitDeadline(*context, *clock_, request->timeout_ms()),
      [reactor, response](absl::StatusOr<std::vector<std::string>> values) {
        if (values.ok()) {
          for (std::string& v : *values) response->add_values(std::move(v));
        }
        reactor->Finish(proto::ToGrpcStatus(values.status()));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Abort(grpc::CallbackServerContext* context,
                                                   const v1::AbortRequest* request,
                                                   v1::AbortResponse*) {
  return Finished(context, state_->Abort(CallerOf(*context), request->group(), request->token(),
                                         request->rank(), request->reason()));
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* context,
                                                   const v1::LeaveRequest* request,
                                                   v1::LeaveResponse*) {
  return Finished(context, state_->Leave(CallerOf(*context), request->group(), request->token(),
                                         request->rank(), request->incarnation()));
}

RendezvousHost::RendezvousHost(RendezvousOptions options, const core::WaitClock* clock,
                               TokenSource tokens)
    : state_(options, clock != nullptr ? clock : &real_clock_, std::move(tokens)),
      service_(&state_, clock != nullptr ? clock : &real_clock_),
      timer_([this] { state_.RunTimer(); }) {}

RendezvousHost::~RendezvousHost() { Shutdown(); }

void RendezvousHost::Shutdown() {
  state_.Shutdown();
  if (timer_.joinable()) timer_.join();
}

}  // namespace flashcp::planner_service
