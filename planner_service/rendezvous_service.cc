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
#include "proto/grpc_status.h"
#include "proto/raw_message.h"

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

// "a, b, c", naming at most kMaxNamedInError items, then " and N more".
template <typename T, typename Name>
std::string NameSome(const std::vector<T>& items, Name name) {
  std::string out;
  const size_t named = std::min(items.size(), kMaxNamedInError);
  for (size_t i = 0; i < named; ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", name(items[i]));
  if (items.size() > named) absl::StrAppend(&out, " and ", items.size() - named, " more");
  return out;
}

absl::Status ShuttingDown() {
  return absl::UnavailableError("rendezvous: the planner is shutting down");
}

// The one answer to a token that is no live member's of a group so named,
// whether or not such a group exists: a non-member learns nothing of it.
absl::Status NotAMember(absl::string_view group) {
  return absl::PermissionDeniedError(absl::StrCat(
      "group ", Quoted(group),
      ": the token is no live member's (a replaced member's token, one from before the group "
      "was re-formed or dropped, or one of no group is void)"));
}

absl::Status Aborted(const std::string& name, const std::string& reason) {
  return absl::AbortedError(absl::StrCat("group ", Quoted(name), " aborted: ", reason));
}

// The groups_ key: the namespace, then the name.
std::string GroupKey(absl::string_view identity, absl::string_view job_secret,
                     absl::string_view name) {
  return absl::StrCat(NamespaceKey(identity, job_secret), name);
}

int64_t EntryBytes(absl::string_view key, absl::string_view value) {
  return static_cast<int64_t>(key.size() + value.size()) + kEntryOverheadBytes;
}

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

std::string JoinIdentities(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    if (!out.empty()) out += ",";
    // Each name's own commas and backslashes escaped: SANs "a", "b" and the
    // one SAN "a,b" are two identities.
    for (const char c : name) {
      if (c == ',' || c == '\\') out += '\\';
      out += c;
    }
  }
  return out;
}

std::string Sha256(absl::string_view bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string NamespaceKey(absl::string_view identity, absl::string_view job_secret) {
  return Sha256(absl::StrCat(identity.size(), ":", identity, job_secret));
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

absl::Status ValidateRendezvousOptions(const RendezvousOptions& o) {
  const auto at_least_one = [](absl::string_view flag, int64_t value) -> absl::Status {
    if (value >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(flag, ": must be at least 1, got ", value));
  };
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_bytes", o.max_total_bytes));
  if (o.idle_timeout < kMinIdleTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rendezvous_idle_timeout: must be at least ",
                     absl::FormatDuration(kMinIdleTimeout), ", got ",
                     absl::FormatDuration(o.idle_timeout)));
  }
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_waiters", o.max_waiters));
  FLASHCP_RETURN_IF_ERROR(
      at_least_one("--rendezvous_max_waiters_per_peer", o.max_waiters_per_peer));
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_waiter_bytes", o.max_waiter_bytes));
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_answer_bytes", o.max_answer_bytes));
  if (o.max_waiter_bytes_per_peer < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rendezvous_max_waiter_bytes_per_peer: must be at least 0 (0: ",
                     "--rendezvous_max_waiter_bytes / ", kWaiterBytesShares, "), got ",
                     o.max_waiter_bytes_per_peer));
  }
  FLASHCP_RETURN_IF_ERROR(
      at_least_one("--rendezvous_max_waiters_per_member", o.max_waiters_per_member));
  if (o.form_timeout < kMinIdleTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rendezvous_form_timeout: must be at least ",
                     absl::FormatDuration(kMinIdleTimeout), ", got ",
                     absl::FormatDuration(o.form_timeout)));
  }
  return at_least_one("--rendezvous_max_groups_per_peer", o.max_groups_per_peer);
}

int64_t MaxWaiterBytesPerPeer(const RendezvousOptions& o) {
  return o.max_waiter_bytes_per_peer > 0 ? o.max_waiter_bytes_per_peer
                                         : o.max_waiter_bytes / kWaiterBytesShares;
}

int64_t WaiterBytes(const std::vector<std::string>& keys) {
  int64_t bytes = kWaiterOverheadBytes;
  for (const std::string& key : keys) {
    bytes += 2 * static_cast<int64_t>(key.size()) + kWaitKeyOverheadBytes;
  }
  return bytes;
}

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

absl::StatusOr<RendezvousState::Joined> RendezvousState::Join(const Caller& caller,
                                                              absl::string_view group_name,
                                                              int32_t rank, int32_t world_size,
                                                              uint64_t incarnation,
                                                              const Secrets& secrets) {
  FLASHCP_RETURN_IF_ERROR(ValidateGroupName(group_name));
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: must be in [1, ", kMaxWorldSize,
                                                   "], got ", world_size));
  }
  if (secrets.job.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job_secret: at most ", kMaxSecretBytes,
                                                   " bytes, got ", secrets.job.size()));
  }
  if (secrets.job.empty() && options_.require_job_secret) {
    return absl::InvalidArgumentError(
        "job_secret: this planner requires the job's secret (--rendezvous_require_job_secret)");
  }
  if (!secrets.member.empty() && (secrets.member.size() < kMinMemberSecretBytes ||
                                  secrets.member.size() > kMaxSecretBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("member_secret: must be empty or ",
                                                   kMinMemberSecretBytes, "..", kMaxSecretBytes,
                                                   " bytes, got ", secrets.member.size()));
  }
  // For a group this call creates or re-forms, world_size is the request's:
  // a bad rank must be refused before that, or it would leave a memberless
  // group that nothing removes (Leave needs a member) or wipe a live abort.
  const auto bad_rank = [&](int32_t size) {
    return absl::InvalidArgumentError(absl::StrCat("rank: must be in [0, ", size,
                                                   ") for group ", Quoted(group_name), ", got ",
                                                   rank));
  };
  const std::string key = GroupKey(caller.identity, secrets.job, group_name);
  const std::string proof = secrets.member.empty() ? std::string() : Sha256(secrets.member);
  // The same process again: its incarnation and the digest of its member
  // secret, compared in constant time (no proof, no retry).
  const auto same_member = [&](const Member& m) {
    return m.incarnation == incarnation && !proof.empty() && m.proof.size() == proof.size() &&
           CRYPTO_memcmp(m.proof.data(), proof.data(), proof.size()) == 0;
  };
  Ready ready;
  absl::StatusOr<Joined> result;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return ShuttingDown();
    const absl::Time now = clock_->Now();
    auto it = groups_.find(key);
    if (it == groups_.end()) {
      if (rank < 0 || rank >= world_size) return bad_rank(world_size);
      if (groups_.size() >= kMaxGroups) ExpireIdle(now, ready);
      if (groups_.size() >= kMaxGroups) {
        return absl::ResourceExhaustedError(
            absl::StrCat("group ", Quoted(group_name), ": already ", kMaxGroups, " groups"));
      }
      const auto u = peers_.find(caller.peer);
      if (u != peers_.end() && u->second.groups >= options_.max_groups_per_peer) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "group ", Quoted(group_name), ": peer ", Quoted(caller.peer), " already created ",
            u->second.groups, " groups that still exist (--rendezvous_max_groups_per_peer)"));
      }
      FLASHCP_RETURN_IF_ERROR(RoomFor(group_name, 0, kMemberOverheadBytes));
      it = groups_.emplace(key, Group{}).first;
      it->second.name = std::string(group_name);
      it->second.world_size = world_size;
      it->second.identity = caller.identity;
      it->second.creator = caller.peer;
      it->second.form_by = now + options_.form_timeout;
      AddUsage(caller.peer, 1, 0, 0);
    }
    Group& g = it->second;
    if (g.aborted) {
      const auto m = g.members.find(rank);
      if (m != g.members.end() && same_member(m->second)) return Aborted(g.name, g.abort_reason);
      if (rank < 0 || rank >= world_size) return bad_rank(world_size);
      // A new member re-forms the failed group (it has no waiters: the abort
      // finished them); it still counts for its creator.
      total_bytes_ -= g.bytes;
      members_ -= static_cast<int64_t>(g.members.size());
      VoidTokens(g);
      observer_->OnRendezvousEvent(RendezvousObserver::Event::kReform);
      Group fresh;
      fresh.name = std::move(g.name);
      fresh.world_size = world_size;
      fresh.identity = std::move(g.identity);
      fresh.creator = std::move(g.creator);
      fresh.form_by = now + options_.form_timeout;
      g = std::move(fresh);
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
      if (same_member(member)) {  // a retry
        g.last_call = now;
        return Joined{g.world_size, member.token};
      }
      if (g.formed) {
        // Names no incarnation: quoting it let a second Join pass for a retry
        // (issue 31 item 1).
        return absl::AlreadyExistsError(absl::StrCat(
            "group ", Quoted(group_name), ": rank ", rank,
            " is already a member; another process may join as rank ", rank,
            " after it leaves or the group is aborted"));
      }
      // The group never formed: the newer Join takes the rank, so a stray or
      // stale member cannot hold it (a worker so replaced joins again).
      FailWaiters(g,
                  absl::PermissionDeniedError(absl::StrCat(
                      "group ", Quoted(group_name), ": rank ", rank,
                      " was replaced by another Join before the group formed")),
                  ready, member.token);
      g.last_call = now;
      IssueToken(key, rank, incarnation, proof, member);
      result = Joined{g.world_size, member.token};
      observer_->OnRendezvousEvent(RendezvousObserver::Event::kJoin);
    } else {
      if (absl::Status room = RoomFor(group_name, g.bytes, kMemberOverheadBytes); !room.ok()) {
        if (g.members.empty()) EraseGroup(it, absl::OkStatus(), ready);  // no waiters
        return room;
      }
      g.bytes += kMemberOverheadBytes;
      total_bytes_ += kMemberOverheadBytes;
      g.last_call = now;
      Member& member = g.members[rank];
      IssueToken(key, rank, incarnation, proof, member);
      result = Joined{g.world_size, member.token};
      members_ += 1;
      observer_->OnRendezvousEvent(RendezvousObserver::Event::kJoin);
      if (static_cast<int32_t>(g.members.size()) == g.world_size) {
        g.formed = true;
        observer_->OnRendezvousEvent(RendezvousObserver::Event::kFormed);
        WakeMemberWaiters(it, ready);
      }
    }
    ReportSize();
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

void RendezvousState::Answer(const Group& g, const std::string& name, Waiter& w, Ready& ready) {
  if (!w.is_get()) {
    std::vector<int32_t> ranks;
    ranks.reserve(g.members.size());
    for (const auto& [rank, member] : g.members) ranks.push_back(rank);
    ready.push_back([done = std::move(w.members_done), r = std::move(ranks)]() mutable {
      done(std::move(r));
    });
    return;
  }
  int64_t bytes = 0;
  for (const Value& v : w.values) bytes += static_cast<int64_t>(v->size());
  if (bytes > kMaxGetResponseBytes) {
    return Fail(w,
                absl::ResourceExhaustedError(absl::StrCat(
                    "group ", Quoted(name), ": the values of the ", w.values.size(),
                    " keys are ", bytes, " bytes; a Get returns at most ", kMaxGetResponseBytes,
                    " (ask for fewer keys)")),
                ready);
  }
  // Only this thread adds (under mu_); answers being released only lower it.
  const int64_t in_flight = answer_bytes_->load();
  if (in_flight + bytes > options_.max_answer_bytes) {
    return Fail(w,
                absl::ResourceExhaustedError(absl::StrCat(
                    "group ", Quoted(name), ": answers being sent hold ", in_flight,
                    " bytes; this one's ", bytes, " would pass ", options_.max_answer_bytes,
                    " (--rendezvous_max_answer_bytes; retry later)")),
                ready);
  }
  answer_bytes_->fetch_add(bytes);
  Values values{std::move(w.values),
                std::shared_ptr<const void>(nullptr, [counter = answer_bytes_, bytes](const void*) {
                  counter->fetch_sub(bytes);
                })};
  ready.push_back([done = std::move(w.values_done), v = std::move(values)]() mutable {
    done(std::move(v));
  });
}

void RendezvousState::TimeOut(const Group& g, const std::string& name, Waiter& w,
                              Ready& ready) {
  if (!w.is_get()) {
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < g.world_size; ++r) {
      if (!g.members.contains(r)) missing.push_back(r);
    }
    return Fail(w,
                absl::DeadlineExceededError(absl::StrCat(
                    "group ", Quoted(name), ": ranks ",
                    NameSome(missing, [](int32_t r) { return absl::StrCat(r); }), " of ",
                    g.world_size, " have not joined")),
                ready);
  }
  std::vector<absl::string_view> missing;
  if (!w.keys.empty()) {  // not registered
    for (size_t i = 0; i < w.keys.size(); ++i) {
      if (w.values[i] == nullptr) missing.push_back(w.keys[i]);
    }
  } else {
    for (const auto& [entry, slot] : w.waiting) {
      if (w.values[slot] == nullptr) missing.push_back(entry->first);
    }
  }
  Fail(w,
       absl::DeadlineExceededError(absl::StrCat("group ", Quoted(name), ": keys ",
                                                NameSome(missing, core::Echo), " not set")),
       ready);
}

absl::Status RendezvousState::RoomToWait(const Group& g, const Waiter& w) const {
  const std::string& name = g.name;
  if (static_cast<int64_t>(waiters_.size()) >= options_.max_waiters) {
    return absl::ResourceExhaustedError(absl::StrCat("group ", Quoted(name), ": already ",
                                                     waiters_.size(),
                                                     " calls waiting (--rendezvous_max_waiters)"));
  }
  if (g.members.at(w.rank).waits >= options_.max_waiters_per_member) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": rank ", w.rank, " already has ",
        options_.max_waiters_per_member, " calls waiting (--rendezvous_max_waiters_per_member)"));
  }
  const auto u = peers_.find(w.peer);
  if (u != peers_.end() && u->second.waiters >= options_.max_waiters_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": peer ", Quoted(w.peer), " already has ", u->second.waiters,
        " calls waiting (--rendezvous_max_waiters_per_peer)"));
  }
  const int64_t peer_bytes = u == peers_.end() ? 0 : u->second.waiter_bytes;
  if (peer_bytes + w.charged > MaxWaiterBytesPerPeer(options_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": peer ", Quoted(w.peer), "'s waiting calls hold ", peer_bytes,
        " bytes; this one's ", w.charged, " would pass ", MaxWaiterBytesPerPeer(options_),
        " (--rendezvous_max_waiter_bytes_per_peer; a Get counts ", kWaiterOverheadBytes,
        " + 2 x key + ", kWaitKeyOverheadBytes, " per key)"));
  }
  if (waiter_bytes_ + w.charged > options_.max_waiter_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "group ", Quoted(name), ": waiting calls hold ", waiter_bytes_, " bytes; this one's ",
        w.charged, " would pass ", options_.max_waiter_bytes,
        " (--rendezvous_max_waiter_bytes; a Get counts ", kWaiterOverheadBytes,
        " + 2 x key + ", kWaitKeyOverheadBytes, " per key)"));
  }
  return absl::OkStatus();
}

RendezvousState::WaitId RendezvousState::Register(GroupMap::iterator it, Waiter w, Ready& ready) {
  Group& g = it->second;
  if (g.aborted) {
    Fail(w, Aborted(g.name, g.abort_reason), ready);
    return 0;
  }
  bool complete = false;
  if (w.is_get()) {
    w.values.resize(w.keys.size());
    for (size_t i = 0; i < w.keys.size(); ++i) {
      const auto kv = g.kv.find(w.keys[i]);
      if (kv != g.kv.end()) {
        w.values[i] = kv->second;
      } else {
        ++w.missing;
      }
    }
    complete = w.missing == 0;
  } else {
    complete = static_cast<int32_t>(g.members.size()) == g.world_size;
  }
  if (complete) {
    Answer(g, g.name, w, ready);
    return 0;
  }
  if (w.deadline <= clock_->Now()) {
    TimeOut(g, g.name, w, ready);
    return 0;
  }
  if (absl::Status room = RoomToWait(g, w); !room.ok()) {
    Fail(w, std::move(room), ready);
    return 0;
  }
  const WaitId id = next_wait_id_++;
  if (w.is_get()) {
    // The missing keys move into the group's index; the waiter keeps its
    // index entries (stable std::map iterators) to leave it and to name them.
    w.waiting.reserve(w.missing);
    for (size_t i = 0; i < w.keys.size(); ++i) {
      if (w.values[i] != nullptr) continue;
      const auto entry = g.waiting_on.try_emplace(std::move(w.keys[i])).first;
      entry->second.emplace(id, static_cast<uint32_t>(i));
      w.waiting.emplace_back(entry, static_cast<uint32_t>(i));
    }
    w.keys.clear();
    w.keys.shrink_to_fit();
  } else {
    g.member_waiters.insert(id);
  }
  if (deadlines_.empty() || w.deadline < deadlines_.begin()->first) timer_kick_ = true;
  deadlines_.emplace(w.deadline, id);
  g.waiters.insert(id);
  waiter_bytes_ += w.charged;
  AddUsage(w.peer, 0, 1, w.charged);
  g.members.at(w.rank).waits += 1;
  waiters_.emplace(id, std::move(w));
  return id;
}

void RendezvousState::EraseWaiter(WaitId id) {
  const auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  deadlines_.erase({w.deadline, id});
  const auto g = groups_.find(w.group);
  if (g != groups_.end()) {
    g->second.waiters.erase(id);
    g->second.member_waiters.erase(id);
    const auto m = g->second.members.find(w.rank);
    if (m != g->second.members.end() && m->second.token == w.token) m->second.waits -= 1;
    // With nothing missing every entry went when its key was set (and an
    // answer may have taken `values`).
    for (size_t i = 0; w.missing > 0 && i < w.waiting.size(); ++i) {
      const auto& [entry, slot] = w.waiting[i];
      if (w.values[slot] != nullptr) continue;  // the entry went when its key was set
      entry->second.erase(id);
      if (entry->second.empty()) g->second.waiting_on.erase(entry);
    }
  }
  waiter_bytes_ -= w.charged;
  AddUsage(w.peer, 0, -1, -w.charged);
  waiters_.erase(it);
}

void RendezvousState::WakeMemberWaiters(GroupMap::iterator it, Ready& ready) {
  Group& g = it->second;
  const std::vector<WaitId> ids(g.member_waiters.begin(), g.member_waiters.end());
  for (const WaitId id : ids) {
    ++waiter_checks_;
    Answer(g, g.name, waiters_.at(id), ready);
    EraseWaiter(id);
  }
  if (!ids.empty()) g.last_call = clock_->Now();
}

void RendezvousState::WakeKeyWaiters(GroupMap::iterator it, absl::string_view key,
                                     const Value& value, Ready& ready) {
  Group& g = it->second;
  const auto entry = g.waiting_on.find(key);
  if (entry == g.waiting_on.end()) return;
  std::vector<WaitId> complete;
  for (const auto& [id, slot] : entry->second) {
    ++waiter_checks_;
    Waiter& w = waiters_.at(id);
    w.values[slot] = value;
    if (--w.missing == 0) complete.push_back(id);
  }
  g.waiting_on.erase(entry);  // its waiters' slots are filled: none refers to it now
  std::sort(complete.begin(), complete.end());  // in the order they came (max_answer_bytes)
  for (const WaitId id : complete) {
    Answer(g, g.name, waiters_.at(id), ready);
    EraseWaiter(id);
  }
  if (!complete.empty()) g.last_call = clock_->Now();
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

RendezvousState::WaitId RendezvousState::StartWait(const Caller& caller, absl::Status valid,
                                                   Waiter w) {
  Ready ready;
  WaitId id = 0;
  if (valid.ok()) {
    absl::MutexLock lock(&mu_);
    int32_t rank = 0;
    absl::StatusOr<GroupMap::iterator> it = FindMember(caller, w.group, w.token, &rank);
    if (it.ok()) {
      w.group = (*it)->first;  // the name as called, from here on the key
      w.rank = rank;
      w.peer = caller.peer;
      w.charged = WaiterBytes(w.keys);
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
  Waiter w;
  w.group = std::string(group_name);
  w.token = std::string(token);
  w.deadline = deadline;
  w.members_done = std::move(done);
  return StartWait(caller, ValidateGroupName(group_name), std::move(w));
}

RendezvousState::WaitId RendezvousState::Get(const Caller& caller, absl::string_view group_name,
                                             absl::string_view token,
                                             std::vector<std::string> keys, absl::Time deadline,
                                             ValuesDone done) {
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
            absl::StrCat("keys: ", core::Echo(key), " is named more than once"));
      }
    }
    return absl::OkStatus();
  };
  absl::Status valid = validate();
  Waiter w;
  w.group = std::string(group_name);
  w.token = std::string(token);
  w.deadline = deadline;
  w.keys = std::move(keys);
  w.values_done = std::move(done);
  return StartWait(caller, std::move(valid), std::move(w));
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
      TimeOut(g->second, g->second.name, w, ready);
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
  // Un-formed groups go within form_timeout and a quarter of it.
  const absl::Duration sweep = std::max(
      std::min(options_.idle_timeout, options_.form_timeout) / 4, absl::Milliseconds(100));
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

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* raw,
                                                  grpc::ByteBuffer* response) {
  v1::JoinRequest request;
  if (absl::Status s = proto::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  const absl::StatusOr<RendezvousState::Joined> joined =
      state_->Join(CallerOf(*context), request.group(), request.rank(), request.world_size(),
                   request.incarnation(),
                   RendezvousState::Secrets{request.job_secret(), request.member_secret()});
  if (!joined.ok()) return Finished(context, joined.status());
  v1::JoinResponse out;
  out.set_world_size(joined->world_size);
  out.set_token(joined->token);
  return Finished(context, proto::SerializeRaw(out, response));
}

grpc::ServerUnaryReactor* RendezvousService::AwaitMembers(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw,
                                                          grpc::ByteBuffer* response) {
  v1::AwaitMembersRequest request;
  if (absl::Status s = proto::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
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
          status = proto::SerializeRaw(out, response);
        }
        reactor->Finish(proto::ToGrpcStatus(status));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Set(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* response) {
  v1::SetRequest request;
  if (absl::Status s = proto::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = state_->Set(CallerOf(*context), request.group(), request.token(),
                               request.key(), request.value());
  if (s.ok()) s = proto::SerializeRaw(v1::SetResponse(), response);
  return Finished(context, s);
}

grpc::ServerUnaryReactor* RendezvousService::Get(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* response) {
  v1::GetRequest request;
  if (absl::Status s = proto::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
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
          status = proto::SerializeRaw(out, response);
          reactor->Hold(std::move(values->charge));
        }
        reactor->Finish(proto::ToGrpcStatus(status));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Abort(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw,
                                                   grpc::ByteBuffer* response) {
  v1::AbortRequest request;
  if (absl::Status s = proto::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = state_->Abort(CallerOf(*context), request.group(), request.token(),
                                 request.rank(), request.reason());
  if (s.ok()) s = proto::SerializeRaw(v1::AbortResponse(), response);
  return Finished(context, s);
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw,
                                                   grpc::ByteBuffer* response) {
  v1::LeaveRequest request;
  if (absl::Status s = proto::ParseRaw(*raw, &request); !s.ok()) return Finished(context, s);
  absl::Status s = state_->Leave(CallerOf(*context), request.group(), request.token(),
                                 request.rank(), request.incarnation());
  if (s.ok()) s = proto::SerializeRaw(v1::LeaveResponse(), response);
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
