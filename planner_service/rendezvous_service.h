// flashcp.v1.Rendezvous (proto/flashcp/v1/rendezvous.proto): the per-group
// key-value store through which worker ranks form a CP group (Gloo's store on
// CPU, the NCCL unique id on GPU), hosted by the planner.
//
// RendezvousState holds every group behind one absl::Mutex. Its waits
// (AwaitMembers, Get) hold no thread: a wait that cannot be answered at once
// is registered with a callback and finished by the change that answers it,
// by the group's abort, by Shutdown, by Cancel, or by its deadline. A Get
// waiter is indexed by each key it still misses (the group's key -> waiters
// map, and a count of missing keys per waiter), so a Set touches only the
// waiters of its key; an AwaitMembers waiter is answered when its group
// becomes complete. Deadlines and idle groups are handled by ExpireDue(),
// which one timer thread (RunTimer, started by RendezvousHost) calls; tests
// with a ManualClock call it themselves. One thread rather than a grpc::Alarm
// per wait: one wakeup source for all deadlines, no per-wait allocation in
// gRPC's completion machinery, no Alarm/cancel races, and the same code
// runs under a fake clock in tests.
//
// Values are held as shared immutable strings: an answer shares them (no
// copy under the lock); the service copies them into the response outside
// it. The bytes of answers being sent are bounded (options.max_answer_bytes,
// released when the call is done).
//
// Trust (docs/deploy.md, "Trust and limits"): groups live in namespaces, one
// per (mTLS identity, job secret) (NamespaceKey): a Join without the job's
// secret reaches another namespace and neither sees nor touches the job's
// group. Join issues each member a random token (injected TokenSource); every
// other call must present a live member's token, else PERMISSION_DENIED,
// worded alike whether or not the group exists. Secrets and tokens are held
// and looked up as SHA-256 digests, and a member secret is compared in
// constant time: a Join is a retry (and gets the member's token back) only
// with the member secret of the Join that made the member. A group that has
// not formed within options.form_timeout of its creation (or re-formation),
// or that no member has called for options.idle_timeout, is dropped. A peer
// (its mTLS identity, else its address without the port: best effort, a NAT
// or proxy merges peers) may have at most options.max_groups_per_peer groups
// it created that still exist, formed or not, options.max_waiters_per_peer
// waits charged at most options.max_waiter_bytes_per_peer together, and a
// member at most options.max_waiters_per_member waits. While a group has
// never been complete a new Join of a taken rank replaces the old member, so
// a stray pre-join cannot hold a rank (the worker joins again when replaced).
//
// Bounds: a group name is [A-Za-z0-9._-]{1,64}; world_size is 1..kMaxWorldSize;
// keys are 1..256 bytes, values at most 1 MiB; an entry is charged key + value
// + kEntryOverheadBytes and a member kMemberOverheadBytes to its group's bytes;
// a group holds at most kMaxKeysPerGroup keys and kMaxBytesPerGroup charged
// bytes, the state at most kMaxGroups groups, options.max_total_bytes charged
// bytes over all groups, options.max_waiters waits charged at most
// options.max_waiter_bytes together (WaiterBytes); a Get names
// 1..kMaxKeysPerGet distinct keys whose values total at most
// kMaxGetResponseBytes; timeouts are 0..kMaxTimeout. Oversize gets
// RESOURCE_EXHAUSTED naming the bound (and its flag), malformed
// INVALID_ARGUMENT. Errors name at most kMaxNamedInError missing keys or
// ranks (each key cut by core::Echo) and count the rest.
#ifndef FLASHCP_PLANNER_SERVICE_RENDEZVOUS_SERVICE_H_
#define FLASHCP_PLANNER_SERVICE_RENDEZVOUS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/observer.h"
#include "proto/rendezvous_limits.h"

namespace flashcp::planner_service {

// The wire contract's bounds, shared with the clients (proto/rendezvous_limits.h).
using proto::rendezvous::kEntryOverheadBytes;
using proto::rendezvous::kMaxBytesPerGroup;
using proto::rendezvous::kMaxGetResponseBytes;
using proto::rendezvous::kMaxGroupNameBytes;
using proto::rendezvous::kMaxGroups;
using proto::rendezvous::kMaxKeyBytes;
using proto::rendezvous::kMaxKeysPerGet;
using proto::rendezvous::kMaxKeysPerGroup;
using proto::rendezvous::kMaxReasonBytes;
using proto::rendezvous::kMaxSecretBytes;
using proto::rendezvous::kMinMemberSecretBytes;
using proto::rendezvous::kMaxTimeout;
using proto::rendezvous::kMaxValueBytes;
using proto::rendezvous::kMaxWorldSize;
using proto::rendezvous::kMemberOverheadBytes;
// All groups' charged entry and member bytes together (--rendezvous_max_bytes).
inline constexpr int64_t kDefaultMaxTotalValueBytes = int64_t{1} << 30;
// --rendezvous_idle_timeout: a group no member called for this long is dropped.
inline constexpr absl::Duration kDefaultIdleTimeout = absl::Minutes(15);
// --rendezvous_form_timeout: a group that has not had all its ranks this long
// after its creation is dropped (squatting a name ends with it).
inline constexpr absl::Duration kDefaultFormTimeout = absl::Minutes(10);
// The shortest --rendezvous_idle_timeout and --rendezvous_form_timeout: below it a group could expire
// between a worker's Join and its next call.
inline constexpr absl::Duration kMinIdleTimeout = absl::Seconds(1);
// --rendezvous_max_waiters: AwaitMembers and Get calls waiting at once.
inline constexpr int64_t kDefaultMaxWaiters = 8192;
// --rendezvous_max_waiters_per_peer: calls one peer has waiting at once
// (kMaxWorldSize: every rank of the largest group on one host may wait).
inline constexpr int64_t kDefaultMaxWaitersPerPeer = 1024;
// --rendezvous_max_waiter_bytes: all waiting calls' WaiterBytes together.
inline constexpr int64_t kDefaultMaxWaiterBytes = int64_t{256} << 20;
// --rendezvous_max_waiter_bytes_per_peer: one peer's waiting calls' WaiterBytes;
// 0 (the default) is max_waiter_bytes / kWaiterBytesShares (at the defaults
// 16 MiB: four of the largest Gets).
inline constexpr int64_t kWaiterBytesShares = 16;
// --rendezvous_max_waiters_per_member: calls one member (token) may have
// waiting at once. A worker waits on one thread at a time; this bounds a
// group's waits by its world size.
inline constexpr int32_t kDefaultMaxWaitersPerMember = 16;
// --rendezvous_max_answer_bytes: the value bytes of Get answers being sent.
inline constexpr int64_t kDefaultMaxAnswerBytes = int64_t{256} << 20;
// --rendezvous_max_groups_per_peer: groups one peer created that still exist.
inline constexpr int32_t kDefaultMaxGroupsPerPeer = 64;
// What a waiting call is charged (WaiterBytes): its record, and per key,
// beyond the key's bytes held twice, the two strings' headers and allocator
// slack, the request's pointer, the index entry (map node, waiter set with its
// one slot) and the waiter's slot and value pointer (measured:
// RendezvousStateTest.WaiterBytesMatchTheHeapTheyHold).
inline constexpr int64_t kWaiterOverheadBytes = 1024;
inline constexpr int64_t kWaitKeyOverheadBytes = 320;
// Missing keys or ranks an error names before "and N more".
inline constexpr size_t kMaxNamedInError = 8;

struct RendezvousOptions {
  int64_t max_total_bytes = kDefaultMaxTotalValueBytes;     // >= 1
  absl::Duration idle_timeout = kDefaultIdleTimeout;        // >= kMinIdleTimeout
  int64_t max_waiters = kDefaultMaxWaiters;                 // >= 1
  int64_t max_waiters_per_peer = kDefaultMaxWaitersPerPeer;  // >= 1
  int64_t max_waiter_bytes = kDefaultMaxWaiterBytes;        // >= 1
  int64_t max_answer_bytes = kDefaultMaxAnswerBytes;        // >= 1
  int32_t max_groups_per_peer = kDefaultMaxGroupsPerPeer;   // >= 1
  absl::Duration form_timeout = kDefaultFormTimeout;        // >= kMinIdleTimeout
  int64_t max_waiter_bytes_per_peer = 0;  // >= 0; 0: max_waiter_bytes / kWaiterBytesShares
  int32_t max_waiters_per_member = kDefaultMaxWaitersPerMember;  // >= 1
  bool require_job_secret = false;  // refuse Joins with an empty job_secret
};

// InvalidArgument naming the planner flag of the first option out of range.
absl::Status ValidateRendezvousOptions(const RendezvousOptions& options);
// The bound on one peer's waiting calls' WaiterBytes that `options` set.
int64_t MaxWaiterBytesPerPeer(const RendezvousOptions& options);

// What a Get wait for `keys` is charged against max_waiter_bytes: the keys
// are held twice while it waits (the request's bytes, which gRPC keeps until
// the call ends, counted as a parsed copy, and the group's key -> waiters
// index), so
// kWaiterOverheadBytes + the sum over keys of 2 x key + kWaitKeyOverheadBytes;
// at most 1024 + 4096 x (512 + 320) bytes (3.3 MiB). An AwaitMembers wait:
// kWaiterOverheadBytes.
int64_t WaiterBytes(const std::vector<std::string>& keys);

// Who calls, as far as the transport tells (RendezvousService fills it).
struct Caller {
  std::string peer;      // what the per-peer bound counts (PeerKey)
  std::string identity;  // the verified mTLS client identity; empty without one
};

// The per-peer bound's key: "identity:<identity>" when the client presented a
// verified certificate, else gRPC's peer address without its port
// ("ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1"), other forms unchanged.
std::string PeerKey(absl::string_view grpc_peer, absl::string_view identity);

// SHA-256 of `bytes`, 32 raw bytes.
std::string Sha256(absl::string_view bytes);
// The namespace a Join's group lives in: SHA-256 over the caller's mTLS
// identity (length-prefixed) and the job secret; 32 raw bytes.
std::string NamespaceKey(absl::string_view identity, absl::string_view job_secret);

// The identity of a peer with several (gRPC's AuthContext lists each SAN):
// the names joined with ",", each name's commas and backslashes escaped with
// a backslash, so that distinct lists never collide.
std::string JoinIdentities(const std::vector<std::string>& names);

// A new unguessable member token per call.
using TokenSource = std::function<std::string()>;
// 128 bits from std::random_device, as 32 hex digits. (libstdc++ on x86-64
// Linux draws them from RDRAND/RDSEED or the kernel, not from a seeded engine.)
std::string RandomToken();

// InvalidArgument naming the field unless `group` is [A-Za-z0-9._-]{1,64}.
absl::Status ValidateGroupName(absl::string_view group);

class RendezvousState {
 public:
  // `clock` (must outlive the state) gives "now" for deadlines and idleness;
  // `observer` (null: none; must outlive the state) hears of joins, formations,
  // aborts, re-forms, expiries and the group and member counts.
  RendezvousState(RendezvousOptions options, const core::WaitClock* clock,
                  TokenSource tokens = RandomToken, RendezvousObserver* observer = nullptr);
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  struct Joined {
    int32_t world_size = 0;
    std::string token;
  };
  // JoinRequest's job_secret and member_secret.
  struct Secrets {
    std::string job;     // the namespace; empty: the open one
    std::string member;  // proves a retry; empty: none
  };
  // Registers `rank`; see the proto for the replace and re-form rules.
  absl::StatusOr<Joined> Join(const Caller& caller, absl::string_view group, int32_t rank,
                              int32_t world_size, uint64_t incarnation,
                              const Secrets& secrets = {});

  // A registered wait; 0 when the wait was answered before the call returned.
  using WaitId = uint64_t;
  using MembersDone = std::function<void(absl::StatusOr<std::vector<int32_t>>)>;
  using Value = std::shared_ptr<const std::string>;  // never null; shared, not copied
  struct Values {
    std::vector<Value> values;  // in the order of the keys
    // Holds the values' bytes against max_answer_bytes until destroyed: keep
    // it until the answer is sent.
    std::shared_ptr<const void> charge;
  };
  using ValuesDone = std::function<void(absl::StatusOr<Values>)>;

  // Calls `done` exactly once, on this thread or later on the thread that
  // answers it (never under the state's lock), with the ranks (ascending) once
  // world_size ranks have joined; PERMISSION_DENIED for a token that is no
  // live member's of a group named `group` (an unknown group included);
  // DEADLINE_EXCEEDED naming the missing ranks at `deadline`; ABORTED with the
  // reason once the group is aborted; RESOURCE_EXHAUSTED beyond max_waiters,
  // max_waiters_per_peer, max_waiter_bytes, max_waiter_bytes_per_peer or
  // max_waiters_per_member.
  WaitId AwaitMembers(const Caller& caller, absl::string_view group, absl::string_view token,
                      absl::Time deadline, MembersDone done);

  // Like AwaitMembers, for the values of `keys` in order (a deadline not in
  // the future: no wait); DEADLINE_EXCEEDED naming the missing keys;
  // RESOURCE_EXHAUSTED when the values pass kMaxGetResponseBytes or the
  // answers being sent would pass max_answer_bytes.
  WaitId Get(const Caller& caller, absl::string_view group, absl::string_view token,
             std::vector<std::string> keys, absl::Time deadline, ValuesDone done);

  // Finishes wait `id` with CANCELLED unless it is already finished.
  void Cancel(WaitId id);

  absl::Status Set(const Caller& caller, absl::string_view group, absl::string_view token,
                   absl::string_view key, absl::string_view value);

  // Marks the group failed; every waiting and later call on it gets ABORTED
  // with "rank R: reason" (the first report is kept). `rank` must be the
  // token's own.
  absl::Status Abort(const Caller& caller, absl::string_view group, absl::string_view token,
                     int32_t rank, absl::string_view reason);

  // Removes the token's member (`rank` and `incarnation` must be its own); the
  // group goes when its last member leaves.
  absl::Status Leave(const Caller& caller, absl::string_view group, absl::string_view token,
                     int32_t rank, uint64_t incarnation);

  // Finishes the waits whose deadline has come and drops idle groups (no
  // member call and no wait for idle_timeout).
  void ExpireDue();
  // Calls ExpireDue at each wait's deadline and periodically, until Shutdown.
  void RunTimer();

  // Finishes every wait with UNAVAILABLE and refuses later calls likewise
  // (the planner is draining). Idempotent.
  void Shutdown();

  size_t group_count() const;
  size_t waiter_count() const;
  // The WaiterBytes of the registered waits.
  int64_t waiter_bytes() const;
  // How many registered waits a change touched (the tests of wakeups count these).
  uint64_t waiter_checks() const;
  // The earliest deadline of a registered wait, if any.
  std::optional<absl::Time> next_deadline() const;
  // The value bytes of answers not yet released (Values::charge).
  int64_t answer_bytes() const { return answer_bytes_->load(); }

 private:
  struct Member {
    uint64_t incarnation = 0;
    std::string token;
    std::string token_digest;  // Sha256(token): its key in live_tokens_
    std::string proof;         // Sha256(member secret); empty: the Join had none
    int32_t waits = 0;         // its registered waits (max_waiters_per_member)
  };
  // A Get waiter's missing keys: key -> (waiter, its slot in the waiter's values).
  using KeyWaiters = absl::flat_hash_map<WaitId, uint32_t>;
  using KeyIndex = std::map<std::string, KeyWaiters, std::less<>>;
  struct Group {
    std::string name;      // as the calls name it (the map's key adds the namespace)
    int32_t world_size = 0;
    std::map<int32_t, Member> members;
    std::map<std::string, Value, std::less<>> kv;
    // Charged: key + value + kEntryOverheadBytes per entry, kMemberOverheadBytes per member.
    int64_t bytes = 0;
    bool aborted = false;
    std::string abort_reason;
    std::string identity;  // the namespace's mTLS identity; empty: none
    bool formed = false;   // all ranks were members once
    absl::Time form_by;    // dropped if not formed by then (form_timeout)
    std::string creator;   // the peer this group counts for (max_groups_per_peer)
    absl::Time last_call;
    std::set<WaitId> waiters;         // all of them
    std::set<WaitId> member_waiters;  // AwaitMembers'
    KeyIndex waiting_on;              // Get waiters by missing key
  };
  struct Waiter {
    std::string group;  // the group's key in groups_
    std::string token;
    int32_t rank = 0;   // the token's
    std::string peer;
    absl::Time deadline;
    int64_t charged = 0;             // WaiterBytes, while registered
    std::vector<std::string> keys;   // a Get's, until registered (then in waiting_on)
    std::vector<Value> values;       // a Get's: values[i] is keys[i]'s (null: missing)
    // The index entries of the keys missing at registration, ascending slot;
    // an entry is valid while its slot's value is null.
    std::vector<std::pair<KeyIndex::iterator, uint32_t>> waiting;
    size_t missing = 0;              // null values
    MembersDone members_done;  // exactly one of the two is set until the answer takes it
    ValuesDone values_done;
    bool is_get() const { return values_done != nullptr; }
  };
  struct PeerUsage {
    int32_t groups = 0;        // groups it created that exist
    int64_t waiters = 0;       // its waiting calls
    int64_t waiter_bytes = 0;  // their WaiterBytes
  };
  // A live member's token digest -> where it is a member.
  struct TokenEntry {
    std::string group;  // key in groups_
    int32_t rank = 0;
  };
  using GroupMap = std::map<std::string, Group, std::less<>>;
  // Callbacks to run once the lock is released.
  using Ready = std::vector<std::function<void()>>;

  // One Join, its stateless fields checked: what Join's steps share.
  struct JoinCall {
    const Caller& caller;
    absl::string_view group;
    int32_t rank = 0;
    int32_t world_size = 0;
    uint64_t incarnation = 0;
    std::string key;    // the group's key in groups_ (GroupKey)
    std::string proof;  // Sha256(member secret); empty: none
    // The same process again: its incarnation and the digest of its member
    // secret, compared in constant time (no proof, no retry).
    bool SameMember(const Member& m) const;
    absl::Status BadRank(int32_t size) const;  // InvalidArgument naming rank
  };
  // Join under mu_: the group found or created (FindOrCreateGroup), an
  // aborted one re-formed (ReformAborted), then the rank taken (TakeRank).
  absl::StatusOr<Joined> JoinLocked(const JoinCall& call, Ready& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<GroupMap::iterator> FindOrCreateGroup(const JoinCall& call, absl::Time now,
                                                       Ready& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborted for the member's own retry; otherwise the group starts afresh.
  absl::Status ReformAborted(const JoinCall& call, Group& g, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A retry gets its token back; a formed group's taken rank is
  // AlreadyExists; an unformed group's is replaced; a free rank is added.
  absl::StatusOr<Joined> TakeRank(const JoinCall& call, GroupMap::iterator it, absl::Time now,
                                  Ready& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The group named `group` of the caller's identity in which `token` is a
  // live member's, after the shutdown and token checks (not the abort check:
  // each caller decides what an aborted group means for it); marks the group
  // called. One PERMISSION_DENIED for every other case, an unknown group
  // included, so that a non-member learns nothing of the group.
  absl::StatusOr<GroupMap::iterator> FindMember(const Caller& caller, absl::string_view group,
                                                absl::string_view token, int32_t* rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `status` as `w`'s answer.
  static void Fail(Waiter& w, absl::Status status, Ready& ready);
  // Queues the answer of `w`, whose condition holds now (all ranks joined,
  // or every value present).
  void Answer(const Group& g, const std::string& name, Waiter& w, Ready& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues DEADLINE_EXCEEDED naming what `w` still misses.
  static void TimeOut(const Group& g, const std::string& name, Waiter& w, Ready& ready);
  // Registers `w` on its group (FindMember, Register) if `valid` is OK;
  // otherwise, or if FindMember refuses, finishes it with the refusal.
  WaitId StartWait(const Caller& caller, absl::Status valid, Waiter w) ABSL_LOCKS_EXCLUDED(mu_);
  WaitId Register(GroupMap::iterator it, Waiter w, Ready& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bounds on waiting calls; OK if `w` may wait.
  absl::Status RoomToWait(const Group& g, const Waiter& w) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the group's AwaitMembers waiters (it is complete).
  void WakeMemberWaiters(GroupMap::iterator it, Ready& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `value` of `key` to the Get waiters missing it; answers those it completes.
  void WakeKeyWaiters(GroupMap::iterator it, absl::string_view key, const Value& value,
                      Ready& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes every waiter of the group (or those of `token`) with `status`.
  void FailWaiters(Group& g, const absl::Status& status, Ready& ready,
                   absl::string_view token = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseWaiter(WaitId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseGroup(GroupMap::iterator it, const absl::Status& status, Ready& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the group's charge on its creator's max_groups_per_peer.
  void ReleaseCreator(Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `peer`'s usage and forgets a peer with none left.
  void AddUsage(const std::string& peer, int32_t groups, int64_t waiters, int64_t waiter_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `member` rank `rank` of the group keyed `key` with a new token.
  void IssueToken(const std::string& key, int32_t rank, uint64_t incarnation,
                  const std::string& proof, Member& member) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every member's token from live_tokens_ (the group goes or re-forms).
  void VoidTokens(const Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED unless `growth` more charged bytes (a member, or an
  // entry's change) fit the group's (bytes `group_bytes`) and all groups'
  // byte bounds.
  absl::Status RoomFor(absl::string_view name, int64_t group_bytes, int64_t growth) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireIdle(absl::Time now, Ready& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the observer the group and member counts.
  void ReportSize() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TimerShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return timer_kick_ || shut_down_;
  }

  const RendezvousOptions options_;
  const core::WaitClock* const clock_;
  const TokenSource tokens_;
  NullRendezvousObserver null_observer_;  // observer_ when none is given
  RendezvousObserver* const observer_;    // never null
  // Shared with the Values::charge of answers, which may outlive a call but
  // not need the lock.
  const std::shared_ptr<std::atomic<int64_t>> answer_bytes_ =
      std::make_shared<std::atomic<int64_t>>(0);
  mutable absl::Mutex mu_;
  GroupMap groups_ ABSL_GUARDED_BY(mu_);
  std::map<WaitId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, WaitId>> deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PeerUsage> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TokenEntry> live_tokens_ ABSL_GUARDED_BY(mu_);
  WaitId next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t waiter_checks_ ABSL_GUARDED_BY(mu_) = 0;
  bool timer_kick_ ABSL_GUARDED_BY(mu_) = false;  // an earlier deadline was registered
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;   // sum of groups_' bytes
  int64_t waiter_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // sum of waiters_' charged
  int64_t members_ ABSL_GUARDED_BY(mu_) = 0;       // sum of groups_' members.size()
};

// The gRPC adapter on the callback API: parses, validates, clamps waits to
// min(timeout_ms, the call's deadline), calls the state, maps the Status
// (proto/rpc/grpc_status.h). The methods are raw (proto/rpc/raw_message.h): a request
// that does not parse gets INVALID_ARGUMENT naming its type, where the
// generated handler answered INTERNAL with no message. A wait's reactor
// finishes from the state's callback; a cancelled call cancels its wait. No
// handler blocks a gRPC thread.
class RendezvousService final
    : public v1::Rendezvous::WithRawCallbackMethod_Join<
          v1::Rendezvous::WithRawCallbackMethod_AwaitMembers<
              v1::Rendezvous::WithRawCallbackMethod_Set<v1::Rendezvous::WithRawCallbackMethod_Get<
                  v1::Rendezvous::WithRawCallbackMethod_Abort<
                      v1::Rendezvous::WithRawCallbackMethod_Leave<v1::Rendezvous::Service>>>>>> {
 public:
  RendezvousService(RendezvousState* state, const core::Clock* clock)
      : state_(state), clock_(clock) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AwaitMembers(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

 private:
  RendezvousState* const state_;
  const core::Clock* const clock_;
};

// Owns the state, the service and the timer thread; what the planner's server
// registers.
class RendezvousHost {
 public:
  // `clock` (default: the real one) and `observer` (null: none) must outlive the host.
  explicit RendezvousHost(RendezvousOptions options = {}, const core::WaitClock* clock = nullptr,
                          TokenSource tokens = RandomToken,
                          RendezvousObserver* observer = nullptr);
  ~RendezvousHost();  // Shutdown()
  RendezvousHost(const RendezvousHost&) = delete;
  RendezvousHost& operator=(const RendezvousHost&) = delete;

  grpc::Service* service() { return &service_; }
  RendezvousState& state() { return state_; }
  // Ends every wait with UNAVAILABLE and stops the timer. Idempotent.
  void Shutdown();

 private:
  core::RealClock real_clock_;
  RendezvousState state_;
  RendezvousService service_;
  std::thread timer_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_RENDEZVOUS_SERVICE_H_
