// RendezvousState's groups and members: Join, Set, Abort, Leave, expiry and
// shutdown (its waiting calls: rendezvous_waits.cc).
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

// Join's fields that need no state: the group name, world_size and the secrets.
absl::Status ValidateJoin(absl::string_view group_name, int32_t world_size,
                          const RendezvousState::Secrets& secrets, bool require_job_secret) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: must be in [1, ", kMaxWorldSize,
                                                   "], got ", world_size));
  }
  if (secrets.job.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job_secret: at most ", kMaxSecretBytes,
                                                   " bytes, got ", secrets.job.size()));
  }
  if (secrets.job.empty() && require_job_secret) {
    return absl::InvalidArgumentError(
        "job_secret: this planner requires the job's secret (--rendezvous_require_job_secret)");
  }
  if (!secrets.member.empty() && (secrets.member.size() < kMinMemberSecretBytes ||
                                  secrets.member.size() > kMaxSecretBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("member_secret: must be empty or ",
                                                   kMinMemberSecretBytes, "..", kMaxSecretBytes,
                                                   " bytes, got ", secrets.member.size()));
  }
  return absl::OkStatus();
}

}  // namespace

RendezvousState::RendezvousState(RendezvousOptions options, const core::WaitClock* clock,
                                 TokenSource tokens, RendezvousObserver* observer)
    : options_(options),
      clock_(clock),
      tokens_(std::move(tokens)),
      observer_(observer != nullptr ? observer : &null_observer_) {}

void RendezvousState::ReportSize() {
  observer_->OnRendezvousSize(static_cast<int64_t>(groups_.size()), members_);
}

absl::StatusOr<RendezvousState::GroupMap::iterator> RendezvousState::FindMember(
    const Caller& caller, absl::string_view group_name, absl::string_view token, int32_t* rank) {
  if (shut_down_) return ShuttingDown();
  if (token.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "group ", Quoted(group_name), ": the call carries no token (Join returns one)"));
  }
  const auto t = live_tokens_.find(Sha256(token));
  if (t == live_tokens_.end()) return NotAMember(group_name);
  const auto it = groups_.find(t->second.group);
  // The token is a member's of a group under another name or identity: to
  // this call, no member's.
  if (it == groups_.end() || it->second.name != group_name ||
      it->second.identity != caller.identity) {
    return NotAMember(group_name);
  }
  *rank = t->second.rank;
  it->second.last_call = clock_->Now();
  return it;
}

void RendezvousState::IssueToken(const std::string& key, int32_t rank, uint64_t incarnation,
                                 const std::string& proof, Member& member) {
  if (!member.token_digest.empty()) live_tokens_.erase(member.token_digest);
  member = Member{};
  member.incarnation = incarnation;
  member.token = tokens_();
  member.token_digest = Sha256(member.token);
  member.proof = proof;
  live_tokens_[member.token_digest] = TokenEntry{key, rank};
}

void RendezvousState::VoidTokens(const Group& g) {
  for (const auto& [rank, member] : g.members) live_tokens_.erase(member.token_digest);
}

void RendezvousState::AddUsage(const std::string& peer, int32_t groups, int64_t waiters,
                               int64_t waiter_bytes) {
  PeerUsage& u = peers_[peer];
  u.groups += groups;
  u.waiters += waiters;
  u.waiter_bytes += waiter_bytes;
  if (u.groups <= 0 && u.waiters <= 0) peers_.erase(peer);
}

void RendezvousState::ReleaseCreator(Group& g) {
  if (g.creator.empty()) return;
  AddUsage(g.creator, -1, 0, 0);
  g.creator.clear();
}

absl::Status RendezvousState::RoomFor(absl::string_view name, int64_t group_bytes,
                                      int64_t growth) const {
  if (group_bytes + growth > kMaxBytesPerGroup) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": entries and members would exceed ", kMaxBytesPerGroup,
        " bytes (an entry counts key + value + ", kEntryOverheadBytes, " bytes, a member ",
        kMemberOverheadBytes, ")"));
  }
  if (total_bytes_ + growth > options_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": the entries and members of all groups would exceed ",
        options_.max_total_bytes, " bytes (--rendezvous_max_bytes; an entry counts key + value + ",
        kEntryOverheadBytes, " bytes, a member ", kMemberOverheadBytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousState::JoinCall::BadRank(int32_t size) const {
  return absl::InvalidArgumentError(absl::StrCat("rank: must be in [0, ", size, ") for group ",
                                                 Quoted(group), ", got ", rank));
}

bool RendezvousState::JoinCall::SameMember(const Member& m) const {
  return m.incarnation == incarnation && !proof.empty() && m.proof.size() == proof.size() &&
         CRYPTO_memcmp(m.proof.data(), proof.data(), proof.size()) == 0;
}

absl::StatusOr<RendezvousState::Joined> RendezvousState::Join(const Caller& caller,
                                                              absl::string_view group_name,
                                                              int32_t rank, int32_t world_size,
                                                              uint64_t incarnation,
                                                              const Secrets& secrets) {
  FLASHCP_RETURN_IF_ERROR(
      ValidateJoin(group_name, world_size, secrets, options_.require_job_secret));
  const JoinCall call{caller,
                      group_name,
                      rank,
                      world_size,
                      incarnation,
                      GroupKey(caller.identity, secrets.job, group_name),
                      secrets.member.empty() ? std::string() : Sha256(secrets.member)};
  Ready ready;
  absl::StatusOr<Joined> result;
  {
    absl::MutexLock lock(&mu_);
    result = JoinLocked(call, ready);
  }
  for (auto& r : ready) r();
  return result;
}

absl::StatusOr<RendezvousState::Joined> RendezvousState::JoinLocked(const JoinCall& call,
                                                                    Ready& ready) {
  if (shut_down_) return ShuttingDown();
  const absl::Time now = clock_->Now();
  FLASHCP_ASSIGN_OR_RETURN(const GroupMap::iterator it, FindOrCreateGroup(call, now, ready));
  Group& g = it->second;
  if (g.aborted) FLASHCP_RETURN_IF_ERROR(ReformAborted(call, g, now));
  if (call.world_size != g.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("group ", Quoted(call.group), " has world_size ", g.world_size, "; rank ",
                     call.rank, " joined with world_size ", call.world_size));
  }
  if (call.rank < 0 || call.rank >= g.world_size) return call.BadRank(g.world_size);
  return TakeRank(call, it, now, ready);
}

absl::StatusOr<RendezvousState::GroupMap::iterator> RendezvousState::FindOrCreateGroup(
    const JoinCall& call, absl::Time now, Ready& ready) {
  auto it = groups_.find(call.key);
  if (it != groups_.end()) return it;
  // For a group this call creates, world_size is the request's: a bad rank
  // must be refused before that, or it would leave a memberless group that
  // nothing removes (Leave needs a member).
  if (call.rank < 0 || call.rank >= call.world_size) return call.BadRank(call.world_size);
  if (groups_.size() >= kMaxGroups) ExpireIdle(now, ready);
  if (groups_.size() >= kMaxGroups) {
    return absl::ResourceExhaustedError(
        absl::StrCat("group ", Quoted(call.group), ": already ", kMaxGroups, " groups"));
  }
  const auto u = peers_.find(call.caller.peer);
  if (u != peers_.end() && u->second.groups >= options_.max_groups_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(call.group), ": peer ", Quoted(call.caller.peer), " already created ",
        u->second.groups, " groups that still exist (--rendezvous_max_groups_per_peer)"));
  }
  FLASHCP_RETURN_IF_ERROR(RoomFor(call.group, 0, kMemberOverheadBytes));
  it = groups_.emplace(call.key, Group{}).first;
  Group& g = it->second;
  g.name = std::string(call.group);
  g.world_size = call.world_size;
  g.identity = call.caller.identity;
  g.creator = call.caller.peer;
  g.form_by = now + options_.form_timeout;
  AddUsage(call.caller.peer, 1, 0, 0);
  return it;
}

absl::Status RendezvousState::ReformAborted(const JoinCall& call, Group& g, absl::Time now) {
  const auto m = g.members.find(call.rank);
  if (m != g.members.end() && call.SameMember(m->second)) return Aborted(g.name, g.abort_reason);
  // World_size is the request's here too: a bad rank must not wipe a live abort.
  if (call.rank < 0 || call.rank >= call.world_size) return call.BadRank(call.world_size);
  // A new member re-forms the failed group (it has no waiters: the abort
  // finished them); it still counts for its creator.
  total_bytes_ -= g.bytes;
  members_ -= static_cast<int64_t>(g.members.size());
  VoidTokens(g);
  observer_->OnRendezvousEvent(RendezvousObserver::Event::kReform);
  Group fresh;
  fresh.name = std::move(g.name);
  fresh.world_size = call.world_size;
  fresh.identity = std::move(g.identity);
  fresh.creator = std::move(g.creator);
  fresh.form_by = now + options_.form_timeout;
  g = std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<RendezvousState::Joined> RendezvousState::TakeRank(const JoinCall& call,
                                                                  GroupMap::iterator it,
                                                                  absl::Time now, Ready& ready) {
  Group& g = it->second;
  const auto m = g.members.find(call.rank);
  if (m != g.members.end()) {
    Member& member = m->second;
    if (call.SameMember(member)) {  // a retry
      g.last_call = now;
      return Joined{g.world_size, member.token};
    }
    if (g.formed) {
      // Names no incarnation: quoting it let a second Join pass for a retry
      // (issue 31 item 1).
      return absl::AlreadyExistsError(absl::StrCat(
          "group ", Quoted(call.group), ": rank ", call.rank,
          " is already a member; another process may join as rank ", call.rank,
          " after it leaves or the group is aborted"));
    }
    // The group never formed: the newer Join takes the rank, so a stray or
    // stale member cannot hold it (a worker so replaced joins again).
    FailWaiters(g,
                absl::PermissionDeniedError(absl::StrCat(
                    "group ", Quoted(call.group), ": rank ", call.rank,
                    " was replaced by another Join before the group formed")),
                ready, member.token);
    g.last_call = now;
    IssueToken(call.key, call.rank, call.incarnation, call.proof, member);
    observer_->OnRendezvousEvent(RendezvousObserver::Event::kJoin);
    ReportSize();
    return Joined{g.world_size, member.token};
  }
  if (absl::Status room = RoomFor(call.group, g.bytes, kMemberOverheadBytes); !room.ok()) {
    if (g.members.empty()) EraseGroup(it, absl::OkStatus(), ready);  // no waiters
    return room;
  }
  g.bytes += kMemberOverheadBytes;
  total_bytes_ += kMemberOverheadBytes;
  g.last_call = now;
  Member& member = g.members[call.rank];
  IssueToken(call.key, call.rank, call.incarnation, call.proof, member);
  Joined joined{g.world_size, member.token};
  members_ += 1;
  observer_->OnRendezvousEvent(RendezvousObserver::Event::kJoin);
  if (static_cast<int32_t>(g.members.size()) == g.world_size) {
    g.formed = true;
    observer_->OnRendezvousEvent(RendezvousObserver::Event::kFormed);
    WakeMemberWaiters(it, ready);
  }
  ReportSize();
  return joined;
}

void RendezvousState::EraseGroup(GroupMap::iterator it, const absl::Status& status,
                                 Ready& ready) {
  FailWaiters(it->second, status, ready);
  VoidTokens(it->second);
  total_bytes_ -= it->second.bytes;
  members_ -= static_cast<int64_t>(it->second.members.size());
  ReleaseCreator(it->second);
  groups_.erase(it);
}

void RendezvousState::ExpireIdle(absl::Time now, Ready& ready) {
  const size_t before = groups_.size();
  for (auto it = groups_.begin(); it != groups_.end();) {
    const auto next = std::next(it);
    const Group& g = it->second;
    if (!g.formed && now >= g.form_by) {
      // Waits or not: a group that never formed holds its name no longer.
      EraseGroup(it,
                 absl::DeadlineExceededError(absl::StrCat(
                     "group ", Quoted(g.name), ": did not form within ",
                     absl::FormatDuration(options_.form_timeout),
                     " (--rendezvous_form_timeout); its members must join again")),
                 ready);
      observer_->OnRendezvousEvent(RendezvousObserver::Event::kExpired);
    } else if (g.waiters.empty() && now - g.last_call >= options_.idle_timeout) {
      EraseGroup(it, absl::OkStatus(), ready);  // no waiters: the status reaches no one
      observer_->OnRendezvousEvent(RendezvousObserver::Event::kExpired);
    }
    it = next;
  }
  if (groups_.size() != before) ReportSize();
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
  // Copied before the lock is taken.
  const Value stored = std::make_shared<const std::string>(value);
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
    const int64_t old_bytes = it == g.kv.end() ? 0 : EntryBytes(key, *it->second);
    if (it == g.kv.end() && g.kv.size() >= kMaxKeysPerGroup) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "group ", Quoted(group_name), ": already ", kMaxKeysPerGroup, " keys"));
    }
    const int64_t growth = EntryBytes(key, value) - old_bytes;
    FLASHCP_RETURN_IF_ERROR(RoomFor(group_name, g.bytes, growth));
    g.bytes += growth;
    total_bytes_ += growth;
    if (it == g.kv.end()) {
      g.kv.emplace(std::string(key), stored);
    } else {
      it->second = stored;
    }
    WakeKeyWaiters(git, key, stored, ready);
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
      observer_->OnRendezvousEvent(RendezvousObserver::Event::kAbort);
      FailWaiters(g,
                  absl::AbortedError(absl::StrCat("group ", Quoted(group_name), " aborted: ",
                                                  g.abort_reason)),
                  ready);
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
    live_tokens_.erase(m->second.token_digest);
    g.members.erase(m);
    members_ -= 1;
    g.bytes -= kMemberOverheadBytes;
    total_bytes_ -= kMemberOverheadBytes;
    // Fewer members answer no wait; the group goes with its last member.
    if (g.members.empty()) EraseGroup(it, absl::OkStatus(), ready);  // its waiters were the member's
    ReportSize();
  }
  for (auto& r : ready) r();
  return absl::OkStatus();
}

void RendezvousState::Shutdown() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    const std::vector<WaitId> ids = [&] {
      std::vector<WaitId> v;
      for (const auto& [id, w] : waiters_) v.push_back(id);
      return v;
    }();
    for (const WaitId id : ids) {
      Fail(waiters_.at(id), ShuttingDown(), ready);
      EraseWaiter(id);
    }
  }
  for (auto& r : ready) r();
}

size_t RendezvousState::group_count() const {
  absl::MutexLock lock(&mu_);
  return groups_.size();
}

int64_t RendezvousState::waiter_bytes() const {
  absl::MutexLock lock(&mu_);
  return waiter_bytes_;
}

size_t RendezvousState::waiter_count() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

uint64_t RendezvousState::waiter_checks() const {
  absl::MutexLock lock(&mu_);
  return waiter_checks_;
}

std::optional<absl::Time> RendezvousState::next_deadline() const {
  absl::MutexLock lock(&mu_);
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

}  // namespace flashcp::planner_service
