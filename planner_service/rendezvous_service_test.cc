#include "planner_service/rendezvous_service.h"

#include <dirent.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/inprocess_rendezvous.h"
#include "tests/testing/rendezvous_requests.h"

namespace flashcp::planner_service {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using tests::testing::GetRequestOf;
using tests::testing::JoinRequestOf;
using tests::testing::MemberSecretOf;
using tests::testing::SetRequestOf;
using ::testing::ElementsAre;
using ::testing::Eq;
using ::testing::HasSubstr;

const Caller kLocal{"ipv4:127.0.0.1", ""};
// The one answer to a token that is no live member's of group "g", whether
// or not "g" exists.
constexpr char kNotAMember[] =
    "group \"g\": the token is no live member's (a replaced member's token, one from before the "
    "group was re-formed or dropped, or one of no group is void)";

// Tokens "t1", "t2", ... in the order Joins ask for them.
TokenSource CountingTokens() {
  auto next = std::make_shared<int>(0);
  return [next] { return absl::StrCat("t", ++*next); };
}

// The secrets of the process `incarnation` of job `job`: one process, one
// member secret.
RendezvousState::Secrets Member(uint64_t incarnation, const std::string& job = "") {
  return RendezvousState::Secrets{job, MemberSecretOf(incarnation)};
}

// A state on a ManualClock: nothing in it moves unless the test says so.
struct Fixture {
  explicit Fixture(RendezvousOptions options = {}) : s(options, &clock, CountingTokens()) {}
  core::ManualClock clock{absl::FromUnixSeconds(1'000'000)};
  RendezvousState s;

  std::string Join(absl::string_view group, int32_t rank, int32_t world_size,
                   uint64_t incarnation, const Caller& caller = kLocal,
                   const std::string& job = "") {
    absl::StatusOr<RendezvousState::Joined> j =
        s.Join(caller, group, rank, world_size, incarnation, Member(incarnation, job));
    EXPECT_THAT(j.status(), IsOk());
    return j.ok() ? j->token : "";
  }
  absl::Time Now() const { return clock.Now(); }
};

// A wait's outcome; `result` is empty while it waits.
template <typename T>
struct Pending {
  std::optional<absl::StatusOr<T>> result;
  std::function<void(absl::StatusOr<T>)> Done() {
    return [this](absl::StatusOr<T> r) {
      ASSERT_FALSE(result.has_value()) << "answered twice";
      result = std::move(r);
    };
  }
};
using PendingValues = Pending<RendezvousState::Values>;
using PendingRanks = Pending<std::vector<int32_t>>;

std::vector<std::string> Strings(const RendezvousState::Values& v) {
  std::vector<std::string> out;
  for (const RendezvousState::Value& value : v.values) out.push_back(*value);
  return out;
}

// A Get that does not wait (its deadline is now); answered before it returns
// (and its answer's charge released).
absl::StatusOr<std::vector<std::string>> GetNow(Fixture& f, absl::string_view group,
                                                absl::string_view token,
                                                const std::vector<std::string>& keys,
                                                const Caller& caller = kLocal) {
  PendingValues p;
  EXPECT_EQ(f.s.Get(caller, group, token, keys, f.Now(), p.Done()), 0u);
  if (!p.result.has_value()) return absl::InternalError("the Get did not answer at once");
  if (!p.result->ok()) return p.result->status();
  return Strings(**p.result);
}

absl::StatusOr<std::vector<int32_t>> AwaitNow(Fixture& f, absl::string_view group,
                                              absl::string_view token,
                                              const Caller& caller = kLocal) {
  PendingRanks p;
  EXPECT_EQ(f.s.AwaitMembers(caller, group, token, f.Now(), p.Done()), 0u);
  if (!p.result.has_value()) return absl::InternalError("the wait did not answer at once");
  return *p.result;
}

TEST(ValidateGroupNameTest, Table) {
  struct Case {
    std::string name;
    bool ok;
  };
  const std::vector<Case> cases = {
      {"g", true},           {"group-0.a_B9", true}, {std::string(64, 'x'), true},
      {"", false},           {std::string(65, 'x'), false},
      {"a b", false},        {"g/1", false},         {"g\n", false},
  };
  for (const Case& c : cases) {
    if (c.ok) {
      EXPECT_THAT(ValidateGroupName(c.name), IsOk()) << c.name;
    } else {
      EXPECT_THAT(ValidateGroupName(c.name),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group:")))
          << c.name;
    }
  }
}

TEST(PeerKeyTest, Table) {
  EXPECT_EQ(PeerKey("ipv4:127.0.0.1:45678", ""), "ipv4:127.0.0.1");
  EXPECT_EQ(PeerKey("ipv6:[::1]:45678", ""), "ipv6:[::1]");
  EXPECT_EQ(PeerKey("unix:/run/x.sock", ""), "unix:/run/x.sock");
  EXPECT_EQ(PeerKey("", ""), "");
  EXPECT_EQ(PeerKey("ipv4:10.0.0.1:1", "job-7"), "identity:job-7");
}

TEST(RandomTokenTest, Is128BitsOfHex) {
  const std::string a = RandomToken();
  const std::string b = RandomToken();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

// Every option names its planner flag; the review of issue 12 found a 1 ns
// --rendezvous_idle_timeout accepted (groups would expire between calls).
TEST(ValidateRendezvousOptionsTest, NamesTheFlag) {
  EXPECT_THAT(ValidateRendezvousOptions({}), IsOk());
  struct Case {
    std::function<void(RendezvousOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](RendezvousOptions& o) { o.max_total_bytes = 0; },
       "--rendezvous_max_bytes: must be at least 1, got 0"},
      {[](RendezvousOptions& o) { o.idle_timeout = absl::Nanoseconds(1); },
       "--rendezvous_idle_timeout: must be at least 1s, got 1ns"},
      {[](RendezvousOptions& o) { o.idle_timeout = absl::ZeroDuration(); },
       "--rendezvous_idle_timeout: must be at least 1s, got 0"},
      {[](RendezvousOptions& o) { o.max_waiters = 0; },
       "--rendezvous_max_waiters: must be at least 1, got 0"},
      {[](RendezvousOptions& o) { o.max_waiters_per_peer = -1; },
       "--rendezvous_max_waiters_per_peer: must be at least 1, got -1"},
      {[](RendezvousOptions& o) { o.max_waiter_bytes = 0; },
       "--rendezvous_max_waiter_bytes: must be at least 1, got 0"},
      {[](RendezvousOptions& o) { o.max_answer_bytes = 0; },
       "--rendezvous_max_answer_bytes: must be at least 1, got 0"},
      {[](RendezvousOptions& o) { o.max_groups_per_peer = 0; },
       "--rendezvous_max_groups_per_peer: must be at least 1, got 0"},
      {[](RendezvousOptions& o) { o.max_waiter_bytes_per_peer = -1; },
       "--rendezvous_max_waiter_bytes_per_peer: must be at least 0 (0: "
       "--rendezvous_max_waiter_bytes / 16), got -1"},
      {[](RendezvousOptions& o) { o.max_waiters_per_member = 0; },
       "--rendezvous_max_waiters_per_member: must be at least 1, got 0"},
      {[](RendezvousOptions& o) { o.form_timeout = absl::Milliseconds(999); },
       "--rendezvous_form_timeout: must be at least 1s, got 999ms"},
  };
  for (const Case& c : cases) {
    RendezvousOptions o;
    c.set(o);
    EXPECT_EQ(ValidateRendezvousOptions(o), absl::InvalidArgumentError(c.message));
  }
  RendezvousOptions o;
  o.idle_timeout = kMinIdleTimeout;
  EXPECT_THAT(ValidateRendezvousOptions(o), IsOk());
}

TEST(RendezvousStateTest, JoinCodes) {
  Fixture f;
  RendezvousState& s = f.s;
  EXPECT_THAT(s.Join(kLocal, "g", 0, 0, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
  EXPECT_THAT(s.Join(kLocal, "g", 0, kMaxWorldSize + 1, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
  EXPECT_THAT(s.Join(kLocal, "bad name", 0, 4, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group:")));
  const absl::StatusOr<RendezvousState::Joined> first = s.Join(kLocal, "g", 0, 4, 7, Member(7));
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(first->world_size, 4);
  EXPECT_EQ(first->token, "t1");
  EXPECT_EQ(s.Join(kLocal, "g", 0, 4, 7, Member(7))->token, "t1");  // a retry: the same token
  EXPECT_THAT(s.Join(kLocal, "g", 1, 2, 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("has world_size 4; rank 1 joined with world_size 2")));
  EXPECT_THAT(s.Join(kLocal, "g", 4, 4, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank: must be in [0, 4)")));
  EXPECT_THAT(s.Join(kLocal, "g", -1, 4, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(s.Leave(kLocal, "g", "t1", 0, 7), IsOk());
  EXPECT_EQ(s.group_count(), 0u);
  EXPECT_EQ(s.Join(kLocal, "g", 0, 2, 8)->world_size, 2);  // the group went with its last member
}

// A Join with a bad rank changes nothing: it neither leaves behind a new,
// memberless group (which no Leave could remove) nor re-forms an aborted one.
TEST(RendezvousStateTest, BadRankJoinLeavesNoTrace) {
  Fixture f;
  RendezvousState& s = f.s;
  EXPECT_THAT(s.Join(kLocal, "fresh", 2, 2, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank: must be in [0, 2) for group \"fresh\", got 2")));
  EXPECT_THAT(s.Join(kLocal, "fresh", -1, 2, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got -1")));
  EXPECT_EQ(s.group_count(), 0u);

  const std::string t = f.Join("g", 0, 2, 1);
  ASSERT_THAT(s.Abort(kLocal, "g", t, 0, "peer died"), IsOk());
  EXPECT_THAT(s.Join(kLocal, "g", 5, 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank: must be in [0, 2) for group \"g\", got 5")));
  EXPECT_EQ(s.group_count(), 1u);
  EXPECT_THAT(AwaitNow(f, "g", t).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 0: peer died")));
}

TEST(RendezvousStateTest, AwaitMembers) {
  Fixture f;
  EXPECT_EQ(AwaitNow(f, "g", "t1").status(), absl::PermissionDeniedError(kNotAMember));
  const std::string t0 = f.Join("g", 0, 4, 1);
  f.Join("g", 2, 4, 1);
  EXPECT_EQ(AwaitNow(f, "g", t0).status(),
            absl::DeadlineExceededError("group \"g\": ranks 1, 3 of 4 have not joined"));
  PendingRanks waiting;
  ASSERT_NE(f.s.AwaitMembers(kLocal, "g", t0, f.Now() + absl::Seconds(60), waiting.Done()), 0u);
  f.Join("g", 1, 4, 1);
  EXPECT_FALSE(waiting.result.has_value());
  f.Join("g", 3, 4, 1);  // answers the wait, on this thread
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_THAT(waiting.result->value(), ElementsAre(0, 1, 2, 3));
}

TEST(RendezvousStateTest, SetGetAndBounds) {
  Fixture f;
  RendezvousState& s = f.s;
  EXPECT_EQ(s.Set(kLocal, "g", "t1", "k", "v"), absl::PermissionDeniedError(kNotAMember));
  const std::string t = f.Join("g", 0, 2, 1);
  EXPECT_THAT(s.Set(kLocal, "g", t, "", "v"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key:")));
  EXPECT_THAT(s.Set(kLocal, "g", t, std::string(kMaxKeyBytes + 1, 'k'), "v"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key: must be 1..256")));
  EXPECT_THAT(s.Set(kLocal, "g", t, "k", std::string(kMaxValueBytes + 1, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("value: at most 1048576")));
  EXPECT_THAT(s.Set(kLocal, "g", t, std::string(kMaxKeyBytes, 'k'),
                    std::string(kMaxValueBytes, 'v')),
              IsOk());
  EXPECT_THAT(GetNow(f, "g", t, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keys:")));
  ASSERT_THAT(s.Set(kLocal, "g", t, "a", "1"), IsOk());
  EXPECT_EQ(GetNow(f, "g", t, {"a", "b", "c"}).status(),
            absl::DeadlineExceededError("group \"g\": keys \"b\", \"c\" not set"));
  PendingValues waiting;
  ASSERT_NE(s.Get(kLocal, "g", t, {"c", "a", "b"}, f.Now() + absl::Seconds(60), waiting.Done()),
            0u);
  ASSERT_THAT(s.Set(kLocal, "g", t, "b", std::string("x\0y", 3)), IsOk());
  EXPECT_FALSE(waiting.result.has_value());
  ASSERT_THAT(s.Set(kLocal, "g", t, "c", "3"), IsOk());
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_THAT(Strings(waiting.result->value()), ElementsAre("3", "1", std::string("x\0y", 3)));
  ASSERT_THAT(s.Set(kLocal, "g", t, "a", "overwritten"), IsOk());
  EXPECT_THAT(GetNow(f, "g", t, {"a"}).value(), ElementsAre("overwritten"));
}

// Issue 12 item 1: one 1 MiB value named 2,049 times made a response over
// 2 GiB and gRPC aborted the planner; 1,000 repeats cost seconds and GBs.
TEST(RendezvousStateTest, GetRefusesRepeatedKeysAndBoundsTheResponseBytes) {
  Fixture f;
  RendezvousState& s = f.s;
  const std::string t = f.Join("g", 0, 1, 1);
  const std::string mib(kMaxValueBytes, 'v');
  for (const char* key : {"a", "b", "c"}) ASSERT_THAT(s.Set(kLocal, "g", t, key, mib), IsOk());
  const std::vector<std::string> repeated(2049, "a");
  EXPECT_EQ(GetNow(f, "g", t, repeated).status(),
            absl::InvalidArgumentError("keys: \"a\" is named more than once"));
  EXPECT_EQ(GetNow(f, "g", t, {"b", "a", "b"}).status(),
            absl::InvalidArgumentError("keys: \"b\" is named more than once"));
  EXPECT_EQ(GetNow(f, "g", t, {"a", "b", "c"}).status(),
            absl::ResourceExhaustedError("group \"g\": the values of the 3 keys are 3145728 "
                                         "bytes; a Get returns at most 2097152 (ask for fewer "
                                         "keys)"));
  const auto two = GetNow(f, "g", t, {"a", "b"});  // exactly kMaxGetResponseBytes
  ASSERT_THAT(two.status(), IsOk());
  EXPECT_EQ(two->size(), 2u);
  // A wait answered by a Set is bounded the same way.
  PendingValues waiting;
  ASSERT_NE(s.Get(kLocal, "g", t, {"a", "b", "d"}, f.Now() + absl::Seconds(5), waiting.Done()),
            0u);
  ASSERT_THAT(s.Set(kLocal, "g", t, "d", "x"), IsOk());
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_THAT(waiting.result->status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("are 2097153 bytes; a Get returns at most 2097152")));
}

// Issue 12 item 7: keys and an entry's overhead count, not values alone.
TEST(RendezvousStateTest, EntryBytesCountKeyValueAndOverheadAcrossGroups) {
  RendezvousOptions o;
  // Two members, two empty-valued entries and 10 bytes.
  o.max_total_bytes = 2 * kMemberOverheadBytes + 2 * (1 + kEntryOverheadBytes) + 10;  // 2572
  Fixture f(o);
  RendezvousState& s = f.s;
  const std::string a = f.Join("a", 0, 1, 1);            // 1024
  const std::string b = f.Join("b", 0, 1, 1);            // 2048
  ASSERT_THAT(s.Set(kLocal, "a", a, "k", ""), IsOk());   // 2305
  ASSERT_THAT(s.Set(kLocal, "b", b, "k", ""), IsOk());   // 2562
  const absl::Status full = absl::ResourceExhaustedError(
      "group \"b\": the entries and members of all groups would exceed 2572 bytes "
      "(--rendezvous_max_bytes; an entry counts key + value + 256 bytes, a member 1024)");
  EXPECT_EQ(s.Set(kLocal, "b", b, "x", ""), full);
  ASSERT_THAT(s.Set(kLocal, "b", b, "k", "0123456789"), IsOk());  // exactly 2572
  EXPECT_THAT(s.Set(kLocal, "a", a, "k", "0"), StatusIs(absl::StatusCode::kResourceExhausted));
  // A group that goes (its last member leaves) gives its bytes back.
  ASSERT_THAT(s.Leave(kLocal, "a", a, 0, 1), IsOk());
  ASSERT_THAT(s.Set(kLocal, "b", b, "x", ""), IsOk());
  // So does an aborted group that a new incarnation re-forms.
  ASSERT_THAT(s.Abort(kLocal, "b", b, 0, "x"), IsOk());
  const std::string b2 = f.Join("b", 0, 1, 2);
  EXPECT_THAT(s.Set(kLocal, "b", b2, "k", std::string(2572 - 1024 - 257, 'v')), IsOk());
}

// Review of issue 12: members were not charged (60 groups of 1,024 members
// took 39 MiB uncounted). A member counts kMemberOverheadBytes of its group's
// bytes; a Join beyond --rendezvous_max_bytes is refused, a Leave gives back.
TEST(RendezvousStateTest, MembersAreChargedToTheirGroupsBytes) {
  RendezvousOptions o;
  o.max_total_bytes = 3 * kMemberOverheadBytes;
  Fixture f(o);
  RendezvousState& s = f.s;
  const std::string t0 = f.Join("g", 0, 4, 1);
  f.Join("g", 1, 4, 1);
  f.Join("g", 2, 4, 1);
  const absl::Status full = absl::ResourceExhaustedError(
      "group \"g\": the entries and members of all groups would exceed 3072 bytes "
      "(--rendezvous_max_bytes; an entry counts key + value + 256 bytes, a member 1024)");
  EXPECT_EQ(s.Join(kLocal, "g", 3, 4, 1).status(), full);
  EXPECT_EQ(s.Join(kLocal, "h", 0, 1, 1).status(),
            absl::ResourceExhaustedError(
                "group \"h\": the entries and members of all groups would exceed 3072 bytes "
                "(--rendezvous_max_bytes; an entry counts key + value + 256 bytes, a member "
                "1024)"));
  EXPECT_EQ(s.group_count(), 1u);  // the refused Join left no memberless group
  ASSERT_THAT(s.Leave(kLocal, "g", t0, 0, 1), IsOk());
  EXPECT_THAT(s.Join(kLocal, "g", 3, 4, 1).status(), IsOk());
}

TEST(RendezvousStateTest, AGroupsEntryBytesCountKeysAndOverhead) {
  RendezvousOptions o;
  o.max_total_bytes = int64_t{1} << 40;
  Fixture f(o);
  const std::string t = f.Join("g", 0, 1, 1);
  const std::string mib(kMaxValueBytes, 'v');
  // 256 values of 1 MiB were exactly kMaxBytesPerGroup when only values counted.
  for (int i = 0; i < 255; ++i) {
    ASSERT_THAT(f.s.Set(kLocal, "g", t, absl::StrCat(i), mib), IsOk()) << i;
  }
  EXPECT_EQ(f.s.Set(kLocal, "g", t, "last", mib),
            absl::ResourceExhaustedError("group \"g\": entries and members would exceed "
                                         "268435456 bytes (an entry counts key + value + 256 "
                                         "bytes, a member 1024)"));
}

TEST(RendezvousStateTest, AbortWakesWaitersAndNewIncarnationResets) {
  Fixture f;
  RendezvousState& s = f.s;
  EXPECT_EQ(s.Abort(kLocal, "g", "t1", 0, "x"), absl::PermissionDeniedError(kNotAMember));
  const std::string t0 = f.Join("g", 0, 2, 1);
  const std::string t1 = f.Join("g", 1, 2, 1);
  PendingValues waiting;
  ASSERT_NE(s.Get(kLocal, "g", t0, {"never"}, f.Now() + absl::Seconds(60), waiting.Done()), 0u);
  ASSERT_THAT(s.Abort(kLocal, "g", t1, 1, "peer 0 died"), IsOk());
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_EQ(waiting.result->status(),
            absl::AbortedError("group \"g\" aborted: rank 1: peer 0 died"));
  EXPECT_THAT(s.Abort(kLocal, "g", t0, 0, "second"), IsOk());  // the first reason is kept
  EXPECT_THAT(s.Set(kLocal, "g", t0, "k", "v"),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 1: peer 0 died")));
  EXPECT_THAT(s.Join(kLocal, "g", 0, 2, 1, Member(1)).status(),
              StatusIs(absl::StatusCode::kAborted));
  // A restarted rank (new incarnation) re-forms the group from scratch; the
  // old members' tokens are void.
  const std::string fresh = f.Join("g", 0, 2, 2);
  EXPECT_EQ(AwaitNow(f, "g", fresh).status(),
            absl::DeadlineExceededError("group \"g\": ranks 1 of 2 have not joined"));
  EXPECT_THAT(s.Set(kLocal, "g", t1, "k", "v"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(s.Abort(kLocal, "g", fresh, 0, std::string(kMaxReasonBytes + 1, 'r')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reason:")));
}

TEST(RendezvousStateTest, LeaveCancelAndShutdown) {
  Fixture f;
  RendezvousState& s = f.s;
  const std::string t0 = f.Join("g", 0, 2, 1);
  const std::string t1 = f.Join("g", 1, 2, 1);
  EXPECT_EQ(s.Leave(kLocal, "g", t0, 0, 2),
            absl::PermissionDeniedError("group \"g\": the token is rank 0 incarnation 1's; the "
                                        "Leave names rank 0 incarnation 2"));
  // g's token for a group "h": no member's.
  EXPECT_THAT(s.Leave(kLocal, "h", t0, 0, 1), StatusIs(absl::StatusCode::kPermissionDenied));
  ASSERT_THAT(s.Leave(kLocal, "g", t0, 0, 1), IsOk());
  EXPECT_EQ(s.group_count(), 1u);
  PendingValues cancelled;
  const RendezvousState::WaitId id =
      s.Get(kLocal, "g", t1, {"never"}, f.Now() + absl::Seconds(60), cancelled.Done());
  ASSERT_NE(id, 0u);
  s.Cancel(id);
  ASSERT_TRUE(cancelled.result.has_value());
  EXPECT_EQ(cancelled.result->status(), absl::CancelledError("rendezvous: the call was cancelled"));
  s.Cancel(id);  // a finished wait: nothing happens (Pending would fail on a second answer)
  EXPECT_EQ(s.waiter_count(), 0u);

  PendingValues waiting;
  ASSERT_NE(s.Get(kLocal, "g", t1, {"never"}, f.Now() + absl::Seconds(60), waiting.Done()), 0u);
  s.Shutdown();
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_EQ(waiting.result->status(),
            absl::UnavailableError("rendezvous: the planner is shutting down"));
  EXPECT_THAT(s.Join(kLocal, "g", 0, 2, 3).status(), StatusIs(absl::StatusCode::kUnavailable));
}

// Issue 12 item 8: only members, by their token, may use a group; Abort's
// rank is the caller's own.
TEST(RendezvousStateTest, NonMembersAreRefused) {
  Fixture f;
  RendezvousState& s = f.s;
  const std::string t = f.Join("g", 0, 1, 1);
  ASSERT_THAT(s.Set(kLocal, "g", t, "k", "secret"), IsOk());
  const absl::Status no_token =
      absl::PermissionDeniedError("group \"g\": the call carries no token (Join returns one)");
  const absl::Status bad_token = absl::PermissionDeniedError(kNotAMember);
  EXPECT_EQ(GetNow(f, "g", "", {"k"}).status(), no_token);
  EXPECT_EQ(GetNow(f, "g", "t999", {"k"}).status(), bad_token);
  EXPECT_EQ(AwaitNow(f, "g", "t999").status(), bad_token);
  EXPECT_EQ(s.Set(kLocal, "g", "", "k", "v"), no_token);
  EXPECT_EQ(s.Abort(kLocal, "g", "t999", 0, "x"), bad_token);
  EXPECT_EQ(s.Leave(kLocal, "g", "t999", 0, 1), bad_token);
  // Rank 99 of a world of 1, with a member's token: not its rank.
  EXPECT_EQ(s.Abort(kLocal, "g", t, 99, "x"),
            absl::PermissionDeniedError("group \"g\": the token is rank 0's; an Abort names rank "
                                        "99"));
  EXPECT_THAT(GetNow(f, "g", t, {"k"}).value(), ElementsAre("secret"));  // nothing changed
}

// A stray Join that takes a rank of a forming group first does not hold it:
// the real rank's Join replaces it. Once the group formed, ranks are fixed.
TEST(RendezvousStateTest, APreJoinedRankIsReplacedWhileTheGroupForms) {
  Fixture f;
  RendezvousState& s = f.s;
  const Caller stranger{"ipv4:10.9.9.9", ""};
  const std::string squatter = f.Join("job", 0, 2, 666, stranger);
  PendingRanks squatting;
  ASSERT_NE(s.AwaitMembers(stranger, "job", squatter, f.Now() + absl::Seconds(60),
                           squatting.Done()),
            0u);
  const std::string real0 = f.Join("job", 0, 2, 1);
  ASSERT_TRUE(squatting.result.has_value());
  EXPECT_EQ(squatting.result->status(),
            absl::PermissionDeniedError("group \"job\": rank 0 was replaced by another Join "
                                        "before the group formed"));
  EXPECT_THAT(s.Set(stranger, "job", squatter, "k", "v"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  f.Join("job", 1, 2, 1);
  EXPECT_THAT(AwaitNow(f, "job", real0).value(), ElementsAre(0, 1));
  EXPECT_EQ(s.Join(stranger, "job", 0, 2, 667).status(),
            absl::AlreadyExistsError("group \"job\": rank 0 is already a member; another process "
                                     "may join as rank 0 after it leaves or the group is "
                                     "aborted"));
}

// With mTLS, each client identity has its own groups: a Join from another
// identity makes another group of the same name, and a stolen token is no
// member's there (issue 31 item 5: PERMISSION_DENIED told a group existed).
TEST(RendezvousStateTest, EachIdentityHasItsOwnGroups) {
  Fixture f;
  RendezvousState& s = f.s;
  const Caller job{"identity:job-a", "job-a"};
  const Caller other{"identity:job-b", "job-b"};
  const std::string t = f.Join("g", 0, 2, 1, job);
  const std::string u = f.Join("g", 1, 2, 1, other);  // another group "g"
  EXPECT_EQ(s.group_count(), 2u);
  EXPECT_EQ(s.Set(other, "g", t, "k", "v"), absl::PermissionDeniedError(kNotAMember));
  EXPECT_EQ(s.Set(kLocal, "g", t, "k", "v"), absl::PermissionDeniedError(kNotAMember));
  EXPECT_EQ(s.Set(job, "g", u, "k", "v"), absl::PermissionDeniedError(kNotAMember));
  EXPECT_THAT(s.Join(job, "g", 1, 2, 1, Member(1)).status(), IsOk());
  EXPECT_THAT(s.Set(job, "g", t, "k", "v"), IsOk());
  EXPECT_THAT(AwaitNow(f, "g", t, job).value(), ElementsAre(0, 1));
  EXPECT_EQ(AwaitNow(f, "g", u, other).status(),
            absl::DeadlineExceededError("group \"g\": ranks 0 of 2 have not joined"));
}

// Issue 31 item 1: ALREADY_EXISTS quoted the live member's incarnation and a
// second Join quoting it was "a retry" that returned the member's token. A
// retry must carry the member secret of the Join that made the member.
TEST(RendezvousStateTest, OnlyTheMembersOwnSecretRetriesAJoin) {
  Fixture f;
  RendezvousState& s = f.s;
  const std::string t0 = f.Join("g", 0, 2, 7);
  f.Join("g", 1, 2, 8);  // formed
  const absl::Status taken = absl::AlreadyExistsError(
      "group \"g\": rank 0 is already a member; another process may join as rank 0 after it "
      "leaves or the group is aborted");
  const Caller thief{"ipv4:10.6.6.6", ""};
  EXPECT_EQ(s.Join(thief, "g", 0, 2, 999).status(), taken);  // names no incarnation
  // The right incarnation without the member's secret, or with another: no token.
  EXPECT_EQ(s.Join(thief, "g", 0, 2, 7).status(), taken);
  EXPECT_EQ(s.Join(thief, "g", 0, 2, 7, Member(999)).status(), taken);
  EXPECT_EQ(s.Join(thief, "g", 0, 2, 7, {"", std::string(16, '\0')}).status(), taken);
  // The member itself (same incarnation and secret) gets its token back.
  EXPECT_EQ(s.Join(kLocal, "g", 0, 2, 7, Member(7))->token, t0);
  EXPECT_THAT(s.Join(kLocal, "g", 0, 2, 7, {"", "short"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       Eq("member_secret: must be empty or 16..256 bytes, got 5")));

  // While a group forms, a Join without the proof is not a retry either: it
  // replaces the member (whose token goes void) and gets a new token.
  const std::string a = f.Join("forming", 0, 2, 5);
  const absl::StatusOr<RendezvousState::Joined> other = s.Join(thief, "forming", 0, 2, 5);
  ASSERT_THAT(other.status(), IsOk());
  EXPECT_NE(other->token, a);
  EXPECT_THAT(s.Set(kLocal, "forming", a, "k", "v"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

// Issue 31 item 5: a stranger's Join replaced a waiting rank, completed a
// forming group, or squatted its name. With the job's secret the job's group
// is out of the stranger's reach: the same name without the secret is
// another group.
TEST(RendezvousStateTest, AJobSecretKeepsStrangersOutOfTheJobsGroup) {
  Fixture f;
  RendezvousState& s = f.s;
  const std::string job = "0123456789abcdef-job-secret";
  const std::string t0 = f.Join("train", 0, 2, 1, kLocal, job);
  PendingRanks waiting;
  ASSERT_NE(s.AwaitMembers(kLocal, "train", t0, f.Now() + absl::Seconds(60), waiting.Done()), 0u);
  const Caller stranger{"ipv4:10.9.9.9", ""};
  // Every rank, with the open namespace or a guessed secret: groups of their own.
  f.Join("train", 0, 2, 666, stranger);
  f.Join("train", 1, 2, 667, stranger);
  f.Join("train", 1, 2, 668, stranger, "guess");
  EXPECT_EQ(s.group_count(), 3u);
  EXPECT_FALSE(waiting.result.has_value());  // neither replaced nor completed
  f.Join("train", 1, 2, 2, kLocal, job);
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_THAT(waiting.result->value(), ElementsAre(0, 1));
  EXPECT_THAT(s.Set(kLocal, "train", t0, "k", "v"), IsOk());

  RendezvousOptions o;
  o.require_job_secret = true;
  Fixture strict(o);
  EXPECT_EQ(strict.s.Join(kLocal, "train", 0, 2, 1, Member(1)).status(),
            absl::InvalidArgumentError("job_secret: this planner requires the job's secret "
                                       "(--rendezvous_require_job_secret)"));
  EXPECT_THAT(strict.s.Join(kLocal, "train", 0, 2, 1, Member(1, job)).status(), IsOk());
  EXPECT_THAT(strict.s.Join(kLocal, "t", 0, 2, 1, {std::string(kMaxSecretBytes + 1, 's'), ""})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       Eq("job_secret: at most 256 bytes, got 257")));
}

// Issue 31 item 5: pre-joining ranks and waiting for an hour held a name
// forever. A group that has not formed within form_timeout is dropped, its
// waits ending with DEADLINE_EXCEEDED, however busy it is.
TEST(RendezvousStateTest, AGroupThatDoesNotFormIsDroppedAtItsFormTimeout) {
  RendezvousOptions o;
  o.form_timeout = absl::Minutes(2);
  Fixture f(o);
  RendezvousState& s = f.s;
  const std::string t = f.Join("squat", 0, 2, 1);
  PendingRanks waiting;
  ASSERT_NE(s.AwaitMembers(kLocal, "squat", t, f.Now() + absl::Hours(1), waiting.Done()), 0u);
  f.Join("formed", 0, 1, 1);
  f.clock.Advance(absl::Minutes(2) - absl::Seconds(1));
  ASSERT_THAT(s.Set(kLocal, "squat", t, "k", "v"), IsOk());  // calls do not extend it
  s.ExpireDue();
  EXPECT_EQ(s.group_count(), 2u);
  f.clock.Advance(absl::Seconds(1));
  s.ExpireDue();
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_EQ(waiting.result->status(),
            absl::DeadlineExceededError("group \"squat\": did not form within 2m "
                                        "(--rendezvous_form_timeout); its members must join "
                                        "again"));
  EXPECT_EQ(s.group_count(), 1u);  // the formed group stays
  EXPECT_EQ(s.waiter_count(), 0u);
  EXPECT_THAT(s.Join(kLocal, "squat", 0, 3, 2, Member(2)).status(), IsOk());  // the name is free
}

// Issue 31 item 4: 104 Gets from one peer took every waiter byte. A peer's
// waits are bounded by their bytes, a member's by their number.
TEST(RendezvousStateTest, OnePeersWaitsLeaveRoomForOthers) {
  RendezvousOptions o;
  o.max_waiter_bytes_per_peer = 2 * WaiterBytes({"k"});
  o.max_waiters_per_member = 3;
  Fixture f(o);
  RendezvousState& s = f.s;
  const Caller other{"ipv4:10.0.0.2", ""};
  const std::string t = f.Join("g", 0, 2, 1);
  const std::string u = f.Join("g", 1, 2, 1, other);
  PendingValues a, b, c, d, e, g, h;
  ASSERT_NE(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), a.Done()), 0u);
  ASSERT_NE(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), b.Done()), 0u);
  EXPECT_EQ(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), c.Done()), 0u);
  ASSERT_TRUE(c.result.has_value());
  EXPECT_EQ(c.result->status(),
            absl::ResourceExhaustedError(
                "group \"g\": peer \"ipv4:127.0.0.1\"'s waiting calls hold 2692 bytes; this "
                "one's 1346 would pass 2692 (--rendezvous_max_waiter_bytes_per_peer; a Get counts "
                "1024 + 2 x key + 320 per key)"));
  // Another peer waits as if the first were idle.
  ASSERT_NE(s.Get(other, "g", u, {"j"}, f.Now() + absl::Seconds(5), d.Done()), 0u);
  ASSERT_NE(s.Get(other, "g", u, {"j"}, f.Now() + absl::Seconds(5), e.Done()), 0u);
  // A member's waits: at most max_waiters_per_member (AwaitMembers count too).
  RendezvousOptions wide;
  wide.max_waiters_per_member = 2;
  Fixture f2(wide);
  const std::string m = f2.Join("g", 0, 2, 1);
  PendingRanks r1, r3;
  ASSERT_NE(f2.s.AwaitMembers(kLocal, "g", m, f2.Now() + absl::Seconds(5), r1.Done()), 0u);
  ASSERT_NE(f2.s.Get(kLocal, "g", m, {"k"}, f2.Now() + absl::Seconds(5), g.Done()), 0u);
  EXPECT_EQ(f2.s.AwaitMembers(kLocal, "g", m, f2.Now() + absl::Seconds(5), r3.Done()), 0u);
  ASSERT_TRUE(r3.result.has_value());
  EXPECT_EQ(r3.result->status(),
            absl::ResourceExhaustedError("group \"g\": rank 0 already has 2 calls waiting "
                                         "(--rendezvous_max_waiters_per_member)"));
  ASSERT_THAT(f2.s.Set(kLocal, "g", m, "k", "v"), IsOk());  // g answered: room again
  EXPECT_NE(f2.s.Get(kLocal, "g", m, {"z"}, f2.Now() + absl::Seconds(5), h.Done()), 0u);
  f2.s.Shutdown();
  s.Shutdown();
}

// Issue 31 item 4: waits were charged 256 MiB while the planner's RSS grew
// by 331 MB. What a Get wait is charged covers the heap it holds: the
// request's keys (as gRPC parsed them, kept until the call ends) and the
// state's records, measured by malloc's own count.
TEST(RendezvousStateTest, WaiterBytesMatchTheHeapTheyHold) {
  RendezvousOptions o;
  o.max_waiters_per_member = o.max_waiters_per_peer = 64;
  o.max_waiter_bytes_per_peer = o.max_waiter_bytes = int64_t{1} << 30;
  Fixture f(o);
  const std::string t = f.Join("g", 0, 1, 1);
  // The largest Gets, each of keys no other names (the index holds a copy of each).
  const auto keys_of = [](int wait) {
    std::vector<std::string> keys;
    for (size_t i = 0; i < kMaxKeysPerGet; ++i) {
      std::string key(kMaxKeyBytes, 'k');
      const std::string n = absl::StrCat(wait, "-", i);
      key.replace(0, n.size(), n);
      keys.push_back(std::move(key));
    }
    return keys;
  };
  constexpr int kWaits = 16;
  std::vector<PendingValues> waits(kWaits);
  std::vector<v1::GetRequest> requests;
  requests.reserve(kWaits);
  const auto heap = [] {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<int64_t>(m.uordblks + m.hblkhd);
  };
  const int64_t before = heap();
  for (int i = 0; i < kWaits; ++i) {
    requests.push_back(GetRequestOf("g", keys_of(i), 60'000, t));  // what gRPC holds
    const v1::GetRequest& r = requests.back();
    ASSERT_NE(f.s.Get(kLocal, "g", t, std::vector<std::string>(r.keys().begin(), r.keys().end()),
                      f.Now() + absl::Seconds(60), waits[i].Done()),
              0u);
  }
  const int64_t held = heap() - before;
  const int64_t charged = f.s.waiter_bytes();
  RecordProperty("held_bytes", std::to_string(held));
  RecordProperty("charged_bytes", std::to_string(charged));
  EXPECT_EQ(charged, kWaits * WaiterBytes(keys_of(0)));
  EXPECT_GE(charged, held) << "held " << held << " bytes, charged " << charged;
  EXPECT_LE(charged, held + held / 4) << "held " << held << " bytes, charged " << charged;
  f.s.Shutdown();
}

TEST(JoinIdentitiesTest, DistinctListsNeverCollide) {
  EXPECT_EQ(JoinIdentities({}), "");
  EXPECT_EQ(JoinIdentities({"a"}), "a");
  EXPECT_EQ(JoinIdentities({"a", "b"}), "a,b");
  EXPECT_EQ(JoinIdentities({"a,b"}), "a\\,b");  // issue 31 item 8: was "a,b" too
  EXPECT_EQ(JoinIdentities({"a\\", "b"}), "a\\\\,b");
  EXPECT_EQ(JoinIdentities({"a\\,b"}), "a\\\\\\,b");
  EXPECT_NE(JoinIdentities({"a\\", "b"}), JoinIdentities({"a\\,b"}));
}

// Groups expire when no member has called for idle_timeout (a waiting call
// counts as calling); the fake clock moves, nothing sleeps.
TEST(RendezvousStateTest, IdleGroupsExpire) {
  RendezvousOptions o;
  o.idle_timeout = absl::Minutes(10);
  Fixture f(o);
  RendezvousState& s = f.s;
  const std::string t = f.Join("g", 0, 1, 1);
  f.clock.Advance(absl::Minutes(9));
  ASSERT_THAT(s.Set(kLocal, "g", t, "k", "v"), IsOk());  // a member's call: the clock restarts
  f.clock.Advance(absl::Minutes(9));
  s.ExpireDue();
  EXPECT_EQ(s.group_count(), 1u);
  f.clock.Advance(absl::Minutes(1));
  s.ExpireDue();
  EXPECT_EQ(s.group_count(), 0u);
  EXPECT_EQ(s.Set(kLocal, "g", t, "k", "v"), absl::PermissionDeniedError(kNotAMember));

  // A member waiting for an hour keeps its group.
  const std::string w = f.Join("w", 0, 1, 1);
  PendingValues waiting;
  ASSERT_NE(s.Get(kLocal, "w", w, {"k"}, f.Now() + absl::Hours(1), waiting.Done()), 0u);
  f.clock.Advance(absl::Minutes(59));
  s.ExpireDue();
  EXPECT_EQ(s.group_count(), 1u);
  EXPECT_FALSE(waiting.result.has_value());
  f.clock.Advance(absl::Minutes(1));
  s.ExpireDue();  // the wait's deadline, which counts as its last call
  ASSERT_TRUE(waiting.result.has_value());
  EXPECT_EQ(waiting.result->status(), absl::DeadlineExceededError("group \"w\": keys \"k\" not set"));
  EXPECT_EQ(s.group_count(), 1u);
  f.clock.Advance(absl::Minutes(10));
  s.ExpireDue();
  EXPECT_EQ(s.group_count(), 0u);
}

// One client cannot fill every group slot: a full table first drops idle
// groups, and a peer may hold only so many groups it created, formed or not
// (review of issue 12: world_size 1 groups, formed at once, were not counted
// and one peer took all 4,096 slots).
TEST(RendezvousStateTest, SlotsAreReclaimedAndGroupsBoundedPerPeer) {
  RendezvousOptions o;
  o.idle_timeout = absl::Minutes(10);
  o.max_groups_per_peer = 2;
  Fixture f(o);
  RendezvousState& s = f.s;
  const Caller other{"ipv4:10.0.0.2", ""};
  f.Join("f1", 0, 2, 1);                        // forming
  const std::string w1 = f.Join("w1", 0, 1, 1);  // formed at once
  const absl::Status full = absl::ResourceExhaustedError(
      "group \"f3\": peer \"ipv4:127.0.0.1\" already created 2 groups that still exist "
      "(--rendezvous_max_groups_per_peer)");
  EXPECT_EQ(s.Join(kLocal, "f3", 0, 1, 1).status(), full);
  f.Join("o1", 0, 2, 1, other);  // another peer is not held back
  f.Join("f1", 1, 2, 1, other);  // joining a group is not creating one
  EXPECT_EQ(s.Join(kLocal, "f3", 0, 2, 1).status(), full);  // f1 formed and still counts
  ASSERT_THAT(s.Leave(kLocal, "w1", w1, 0, 1), IsOk());   // a group that goes gives it back
  f.Join("f3", 0, 2, 1);
  EXPECT_EQ(s.group_count(), 3u);

  // Fill the table from other peers, two groups each.
  for (size_t i = s.group_count(); i < kMaxGroups; ++i) {
    f.Join(absl::StrCat("x", i), 0, 1, 1,
           Caller{absl::StrCat("ipv4:10.1.", i / 2 / 256, ".", i / 2 % 256), ""});
  }
  const Caller late{"ipv4:10.9.9.9", ""};
  EXPECT_EQ(s.Join(late, "late", 0, 1, 1).status(),
            absl::ResourceExhaustedError("group \"late\": already 4096 groups"));
  f.clock.Advance(absl::Minutes(10));
  EXPECT_THAT(s.Join(late, "late", 0, 1, 1).status(), IsOk());  // the idle ones went
  EXPECT_EQ(s.group_count(), 1u);
  EXPECT_THAT(s.Join(kLocal, "f4", 0, 2, 1).status(), IsOk());  // expiry released the charge
  EXPECT_THAT(s.Join(kLocal, "f5", 0, 2, 1).status(), IsOk());
}

// Issue 12 item 9 and its review: a Set re-checked every waiter of its
// group (1,000 waits of 4,096 missing keys made a Set take 252 ms). Get
// waiters are indexed by missing key: a Set touches only its key's waiters,
// and the missing keys are named only at the deadline.
TEST(RendezvousStateTest, ASetTouchesOnlyTheWaitersOfItsKey) {
  RendezvousOptions o;
  o.max_waiters_per_member = 100;       // all 100 waits of a group are one member's
  o.max_waiter_bytes_per_peer = o.max_waiter_bytes = int64_t{1} << 30;  // 100 x 3.3 MiB
  Fixture f(o);
  RendezvousState& s = f.s;
  const std::string a = f.Join("a", 0, 1, 1);
  const std::string b = f.Join("b", 0, 1, 1);
  std::vector<std::string> many;
  for (int i = 0; i < static_cast<int>(kMaxKeysPerGet); ++i) many.push_back(absl::StrCat("b", i));
  std::vector<PendingValues> on_a(100);
  std::vector<PendingValues> on_b(100);
  for (auto& p : on_a) {
    ASSERT_NE(s.Get(kLocal, "a", a, {"k"}, f.Now() + absl::Seconds(60), p.Done()), 0u);
  }
  for (auto& p : on_b) {
    ASSERT_NE(s.Get(kLocal, "b", b, many, f.Now() + absl::Seconds(60), p.Done()), 0u);
  }
  EXPECT_EQ(s.waiter_checks(), 0u);
  for (int i = 0; i < 10; ++i) {
    ASSERT_THAT(s.Set(kLocal, "b", b, absl::StrCat("other", i), "v"), IsOk());
  }
  EXPECT_EQ(s.waiter_checks(), 0u);  // no waiter misses those keys
  ASSERT_THAT(s.Set(kLocal, "b", b, "b7", "v"), IsOk());
  EXPECT_EQ(s.waiter_checks(), 100u);  // b's waiters, once each; none of a's
  EXPECT_EQ(s.waiter_count(), 200u);
  ASSERT_THAT(s.Set(kLocal, "a", a, "k", "v"), IsOk());
  EXPECT_EQ(s.waiter_checks(), 200u);
  EXPECT_EQ(s.waiter_count(), 100u);
  for (auto& p : on_a) {
    ASSERT_TRUE(p.result.has_value());
    EXPECT_THAT(Strings(p.result->value()), ElementsAre("v"));
  }
  for (auto& p : on_b) EXPECT_FALSE(p.result.has_value());
  f.clock.Advance(absl::Seconds(60));
  s.ExpireDue();
  for (auto& p : on_b) {
    ASSERT_TRUE(p.result.has_value());
    EXPECT_EQ(p.result->status(),
              absl::DeadlineExceededError("group \"b\": keys \"b0\", \"b1\", \"b2\", \"b3\", "
                                          "\"b4\", \"b5\", \"b6\", \"b8\" and 4087 more not set"));
  }
  EXPECT_EQ(s.waiter_count(), 0u);
}

// Review of issue 12: ranks are named like keys, a few and a count.
TEST(RendezvousStateTest, MissingRanksAreNamedAFewAndCounted) {
  Fixture f;
  const std::string t = f.Join("g", 3, kMaxWorldSize, 1);
  EXPECT_EQ(AwaitNow(f, "g", t).status(),
            absl::DeadlineExceededError("group \"g\": ranks 0, 1, 2, 4, 5, 6, 7, 8 and 1015 more "
                                        "of 1024 have not joined"));
}

// Review of issue 12: a Set answered every waiter by copying the values for
// each (500 waiters of 2 MiB: 1.18 GiB under the lock). Answers share the
// stored values, and the bytes of answers being sent are bounded.
TEST(RendezvousStateTest, AnswersShareValuesAndTheirBytesInFlightAreBounded) {
  RendezvousOptions o;
  o.max_answer_bytes = 5 * (int64_t{1} << 20);  // two answers of 2 MiB, not three
  Fixture f(o);
  RendezvousState& s = f.s;
  const std::string t = f.Join("g", 0, 1, 1);
  const std::string mib(kMaxValueBytes, 'v');
  ASSERT_THAT(s.Set(kLocal, "g", t, "a", mib), IsOk());
  std::vector<PendingValues> waits(3);
  for (auto& p : waits) {
    ASSERT_NE(s.Get(kLocal, "g", t, {"a", "b"}, f.Now() + absl::Seconds(60), p.Done()), 0u);
  }
  ASSERT_THAT(s.Set(kLocal, "g", t, "b", mib), IsOk());
  for (auto& p : waits) ASSERT_TRUE(p.result.has_value());
  ASSERT_THAT(waits[0].result->status(), IsOk());
  ASSERT_THAT(waits[1].result->status(), IsOk());
  EXPECT_EQ(waits[2].result->status(),
            absl::ResourceExhaustedError(
                "group \"g\": answers being sent hold 4194304 bytes; this one's 2097152 would "
                "pass 5242880 (--rendezvous_max_answer_bytes; retry later)"));
  // The same stored strings, not copies.
  EXPECT_EQ((*waits[0].result)->values[0].get(), (*waits[1].result)->values[0].get());
  EXPECT_EQ((*waits[0].result)->values[1].get(), (*waits[1].result)->values[1].get());
  EXPECT_EQ(s.answer_bytes(), 4 * (int64_t{1} << 20));
  waits[0].result.reset();  // the answer was sent: its charge goes
  EXPECT_EQ(s.answer_bytes(), 2 * (int64_t{1} << 20));
  EXPECT_THAT(GetNow(f, "g", t, {"a", "b"}).status(), IsOk());
  waits[1].result.reset();
  EXPECT_EQ(s.answer_bytes(), 0);
}

// Review of issue 12: waiters were bounded only globally (one peer could
// take every slot) and a 4,096-key Get pinned about 2.5 MiB uncounted.
TEST(RendezvousStateTest, WaitersAreBoundedPerPeerAndByTheirBytes) {
  RendezvousOptions o;
  o.max_waiters_per_peer = 2;
  o.max_waiter_bytes = 3 * WaiterBytes({"k"});  // 4038
  o.max_waiter_bytes_per_peer = o.max_waiter_bytes;  // this test is of the global bound
  Fixture f(o);
  RendezvousState& s = f.s;
  const Caller other{"ipv4:10.0.0.2", ""};
  const std::string t = f.Join("g", 0, 2, 1);
  const std::string u = f.Join("g", 1, 2, 1, other);
  EXPECT_EQ(WaiterBytes({"k"}), 1024 + 2 + 320);
  EXPECT_EQ(WaiterBytes(std::vector<std::string>(kMaxKeysPerGet, std::string(kMaxKeyBytes, 'k'))),
            1024 + 4096 * (512 + 320));
  PendingValues a, b, c, d, e, later;
  ASSERT_NE(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), a.Done()), 0u);
  ASSERT_NE(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), b.Done()), 0u);
  EXPECT_EQ(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), c.Done()), 0u);
  ASSERT_TRUE(c.result.has_value());
  EXPECT_EQ(c.result->status(),
            absl::ResourceExhaustedError("group \"g\": peer \"ipv4:127.0.0.1\" already has 2 "
                                         "calls waiting (--rendezvous_max_waiters_per_peer)"));
  // Another peer still waits, up to the bytes all waits may hold.
  ASSERT_NE(s.Get(other, "g", u, {"j"}, f.Now() + absl::Seconds(5), d.Done()), 0u);
  EXPECT_EQ(s.Get(other, "g", u, {"j"}, f.Now() + absl::Seconds(5), e.Done()), 0u);
  ASSERT_TRUE(e.result.has_value());
  EXPECT_EQ(e.result->status(),
            absl::ResourceExhaustedError(
                "group \"g\": waiting calls hold 4038 bytes; this one's 1346 would pass 4038 "
                "(--rendezvous_max_waiter_bytes; a Get counts 1024 + 2 x key + 320 per key)"));
  ASSERT_THAT(s.Set(kLocal, "g", t, "k", "v"), IsOk());  // a and b are answered: room again
  EXPECT_NE(s.Get(kLocal, "g", t, {"z"}, f.Now() + absl::Seconds(5), later.Done()), 0u);
  s.Shutdown();
}

TEST(RendezvousStateTest, WaitersAreBoundedAndDeadlinesKeptOnTheClock) {
  RendezvousOptions o;
  o.max_waiters = 2;
  Fixture f(o);
  RendezvousState& s = f.s;
  const std::string t = f.Join("g", 0, 1, 1);
  PendingValues first, second, third;
  ASSERT_NE(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), first.Done()), 0u);
  ASSERT_NE(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(9), second.Done()), 0u);
  EXPECT_EQ(s.Get(kLocal, "g", t, {"k"}, f.Now() + absl::Seconds(5), third.Done()), 0u);
  ASSERT_TRUE(third.result.has_value());
  EXPECT_EQ(third.result->status(),
            absl::ResourceExhaustedError(
                "group \"g\": already 2 calls waiting (--rendezvous_max_waiters)"));
  f.clock.Advance(absl::Seconds(4));
  s.ExpireDue();
  EXPECT_FALSE(first.result.has_value());
  f.clock.Advance(absl::Seconds(1));
  s.ExpireDue();
  ASSERT_TRUE(first.result.has_value());
  EXPECT_EQ(first.result->status(), absl::DeadlineExceededError("group \"g\": keys \"k\" not set"));
  EXPECT_FALSE(second.result.has_value());
  ASSERT_THAT(s.Set(kLocal, "g", t, "k", "v"), IsOk());
  ASSERT_TRUE(second.result.has_value());
  EXPECT_THAT(Strings(second.result->value()), ElementsAre("v"));
}

// The adapter over a real in-process gRPC server: codes and values survive the wire.
class RendezvousServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartWith({}); }
  // Replaces the server with one on `options`.
  void StartWith(RendezvousOptions options) {
    stub_.reset();
    rendezvous_.reset();
    absl::StatusOr<std::unique_ptr<tests::testing::InProcessRendezvous>> r =
        tests::testing::InProcessRendezvous::Start(options);
    ASSERT_THAT(r.status(), IsOk());
    rendezvous_ = *std::move(r);
    stub_ = rendezvous_->stub();
  }
  RendezvousHost& host() { return rendezvous_->host(); }
  // Joins rank 0 of a new 1-rank group; its token ("" on failure).
  std::string JoinAlone(const std::string& group) {
    absl::StatusOr<std::string> token =
        tests::testing::JoinAlone(*stub_, group, absl::Now() + absl::Seconds(30));
    EXPECT_THAT(token, IsOk());
    return token.ok() ? *token : "";
  }
  // Polls (5 ms steps, up to 30 s: the calls are in flight on gRPC's threads)
  // until `done(waiters)` holds; the waiter count then.
  size_t WaitForWaiters(const std::function<bool(size_t)>& done) {
    const absl::Time limit = absl::Now() + absl::Seconds(30);
    while (!done(host().state().waiter_count()) && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return host().state().waiter_count();
  }

  std::unique_ptr<tests::testing::InProcessRendezvous> rendezvous_;
  std::shared_ptr<v1::Rendezvous::Stub> stub_;
};

TEST_F(RendezvousServiceTest, RoundTripAndCodes) {
  grpc::ClientContext c1;
  v1::JoinResponse joined;
  ASSERT_TRUE(stub_->Join(&c1, JoinRequestOf("g", 0, 1, 5), &joined).ok());
  EXPECT_EQ(joined.world_size(), 1);
  const std::string token = joined.token();
  EXPECT_EQ(token.size(), 32u);  // RandomToken's

  grpc::ClientContext c2;
  v1::AwaitMembersRequest await;
  await.set_group("g");
  await.set_timeout_ms(1000);
  await.set_token(token);
  v1::AwaitMembersResponse members;
  ASSERT_TRUE(stub_->AwaitMembers(&c2, await, &members).ok());
  EXPECT_THAT(members.ranks(), ElementsAre(0));

  grpc::ClientContext c3;
  const v1::SetRequest set = SetRequestOf("g", "k", "v", token);
  v1::SetResponse set_response;
  ASSERT_TRUE(stub_->Set(&c3, set, &set_response).ok());

  grpc::ClientContext c4;
  v1::GetResponse values;
  ASSERT_TRUE(stub_->Get(&c4, GetRequestOf("g", {"k"}, 0, token), &values).ok());
  EXPECT_THAT(values.values(), ElementsAre("v"));

  struct BadGet {
    int64_t timeout_ms;
    std::string key;
    std::string token;
    grpc::StatusCode code;
  };
  for (const BadGet& b : std::vector<BadGet>{
           {-1, "k", token, grpc::StatusCode::INVALID_ARGUMENT},
           {absl::ToInt64Milliseconds(kMaxTimeout) + 1, "k", token,
            grpc::StatusCode::INVALID_ARGUMENT},
           {0, "missing", token, grpc::StatusCode::DEADLINE_EXCEEDED},
           {0, "", token, grpc::StatusCode::INVALID_ARGUMENT},
           {0, "k", "", grpc::StatusCode::PERMISSION_DENIED},
           {0, "k", "not-a-token", grpc::StatusCode::PERMISSION_DENIED}}) {
    grpc::ClientContext c;
    v1::GetResponse out;
    EXPECT_EQ(stub_->Get(&c, GetRequestOf("g", {b.key}, b.timeout_ms, b.token), &out).error_code(),
              b.code)
        << b.timeout_ms << " " << b.key;
  }

  grpc::ClientContext c6;
  v1::AbortRequest abort;
  abort.set_group("g");
  abort.set_rank(99);
  abort.set_reason("test");
  abort.set_token(token);
  v1::AbortResponse aborted;
  const grpc::Status not_own = stub_->Abort(&c6, abort, &aborted);
  EXPECT_EQ(not_own.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(not_own.error_message(), "group \"g\": the token is rank 0's; an Abort names rank 99");
  grpc::ClientContext c6b;
  abort.set_rank(0);
  ASSERT_TRUE(stub_->Abort(&c6b, abort, &aborted).ok());
  grpc::ClientContext c7;
  const grpc::Status s = stub_->Set(&c7, set, &set_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(s.error_message(), "group \"g\" aborted: rank 0: test");

  grpc::ClientContext c8;
  v1::LeaveRequest leave;
  leave.set_group("g");
  leave.set_rank(0);
  leave.set_incarnation(5);
  leave.set_token(token);
  v1::LeaveResponse left;
  ASSERT_TRUE(stub_->Leave(&c8, leave, &left).ok());
  EXPECT_EQ(host().state().group_count(), 0u);
}

int ThreadCount() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// Issue 12 item 9: 2,000 blocked waits held 2,016 threads on the sync API.
TEST_F(RendezvousServiceTest, TwoThousandWaitsHoldNoThreads) {
  constexpr int kWaits = 2000;
  RendezvousOptions options;
  options.max_waiters_per_peer = kWaits;  // all come from this one client
  options.max_waiters_per_member = kWaits;  // and one member
  StartWith(options);
  const std::string token = JoinAlone("g");
  ASSERT_FALSE(token.empty());
  const int before = ThreadCount();
  ASSERT_GT(before, 0);

  struct Call {
    grpc::ClientContext context;
    v1::GetRequest request;
    v1::GetResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  std::atomic<int> done{0};
  absl::Notification all_done;
  for (int i = 0; i < kWaits; ++i) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    call->request = GetRequestOf("g", {"k"}, 60'000, token);
    Call* c = call.get();
    stub_->async()->Get(&c->context, &c->request, &c->response, [c, &done, &all_done](grpc::Status s) {
      c->status = std::move(s);
      if (done.fetch_add(1) + 1 == kWaits) all_done.Notify();
    });
    calls.push_back(std::move(call));
  }
  // Every wait registered (bounded poll: the calls are in flight on gRPC's threads).
  const absl::Time limit = absl::Now() + absl::Seconds(60);
  while (host().state().waiter_count() < static_cast<size_t>(kWaits) && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(host().state().waiter_count(), static_cast<size_t>(kWaits));
  const int during = ThreadCount();
  EXPECT_LT(during - before, 64) << "threads before " << before << ", with the waits " << during;

  grpc::ClientContext sc;
  v1::SetResponse set_response;
  ASSERT_TRUE(stub_->Set(&sc, SetRequestOf("g", "k", "v", token), &set_response).ok());
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  for (const auto& c : calls) {
    ASSERT_TRUE(c->status.ok()) << c->status.error_message();
    EXPECT_THAT(c->response.values(), ElementsAre("v"));
  }
  EXPECT_EQ(host().state().waiter_count(), 0u);
}

// A wait's timeout_ms is cut to the call's own deadline: the registered
// deadline is the call's (60 s), not the hour asked for. (The client's own
// deadline would end the call at the same time either way; the server's
// deadline is what frees the waiter.)
// A Get started asynchronously (with `deadline` on its context, if any);
// `done` is notified with `status`.
struct AsyncGet {
  AsyncGet(v1::Rendezvous::Stub& stub, v1::GetRequest r,
           std::optional<std::chrono::system_clock::time_point> deadline = std::nullopt)
      : request(std::move(r)) {
    if (deadline.has_value()) context.set_deadline(*deadline);
    stub.async()->Get(&context, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
  // Cancels the call and waits (30 s at most) for its end: true once ended.
  bool CancelAndWait() {
    context.TryCancel();
    return done.WaitForNotificationWithTimeout(absl::Seconds(30));
  }
  grpc::ClientContext context;
  v1::GetRequest request;
  v1::GetResponse response;
  absl::Notification done;
  grpc::Status status;
};

TEST_F(RendezvousServiceTest, AWaitIsCutToTheCallsDeadline) {
  const std::string token = JoinAlone("g");
  ASSERT_FALSE(token.empty());
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(60);
  AsyncGet get(*stub_, GetRequestOf("g", {"k"}, absl::ToInt64Milliseconds(kMaxTimeout), token),
               deadline);
  ASSERT_EQ(WaitForWaiters([](size_t n) { return n >= 1; }), 1u);
  const std::optional<absl::Time> registered = host().state().next_deadline();
  ASSERT_TRUE(registered.has_value());
  // gRPC carries the deadline as a timeout, so the server's is within transit time of it.
  EXPECT_LE(absl::AbsDuration(*registered - absl::FromChrono(deadline)), absl::Seconds(5))
      << "registered " << *registered << ", call deadline " << absl::FromChrono(deadline);
  ASSERT_TRUE(get.CancelAndWait());
  EXPECT_EQ(get.status.error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(RendezvousServiceTest, ACancelledWaitIsDropped) {
  const std::string token = JoinAlone("g");
  ASSERT_FALSE(token.empty());
  AsyncGet get(*stub_, GetRequestOf("g", {"k"}, 60'000, token));
  ASSERT_EQ(WaitForWaiters([](size_t n) { return n >= 1; }), 1u);
  ASSERT_TRUE(get.CancelAndWait());
  EXPECT_EQ(get.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(WaitForWaiters([](size_t n) { return n == 0; }), 0u);
}


// What the observer heard, in order: events by name, sizes as "size G/M".
class RecordingRendezvousObserver final : public RendezvousObserver {
 public:
  void OnRendezvousEvent(Event e) override {
    static const char* const kNames[] = {"join", "formed", "abort", "reform", "expired"};
    log.push_back(kNames[static_cast<int>(e)]);
  }
  void OnRendezvousSize(int64_t groups, int64_t members) override {
    log.push_back(absl::StrCat("size ", groups, "/", members));
  }
  std::vector<std::string> log;
};

TEST(RendezvousStateTest, ObserverHearsJoinsFormationsAbortsReformsAndExpiries) {
  core::ManualClock clock{absl::FromUnixSeconds(1'000'000)};
  RecordingRendezvousObserver observer;
  RendezvousOptions o;
  o.idle_timeout = absl::Seconds(10);
  RendezvousState s(o, &clock, CountingTokens(), &observer);
  ASSERT_THAT(s.Join(kLocal, "g", 0, 2, 1).status(), IsOk());  // t1
  ASSERT_THAT(s.Join(kLocal, "g", 1, 2, 2, Member(2)).status(), IsOk());  // t2: formed
  ASSERT_THAT(s.Join(kLocal, "g", 1, 2, 2, Member(2)).status(), IsOk());  // a retry: nothing
  ASSERT_THAT(s.Abort(kLocal, "g", "t1", 0, "peer died"), IsOk());
  ASSERT_THAT(s.Abort(kLocal, "g", "t2", 1, "again"), IsOk());  // not a second abort
  ASSERT_THAT(s.Join(kLocal, "g", 0, 2, 3).status(), IsOk());  // t3: re-forms the group
  ASSERT_THAT(s.Leave(kLocal, "g", "t3", 0, 3), IsOk());        // the last member: group gone
  ASSERT_THAT(s.Join(kLocal, "h", 0, 1, 4).status(), IsOk());  // t4: formed at once
  clock.Advance(absl::Seconds(10));
  s.ExpireDue();
  EXPECT_EQ(observer.log,
            (std::vector<std::string>{"join", "size 1/1", "join", "formed", "size 1/2", "abort",
                                      "reform", "join", "size 1/1", "size 0/0", "join", "formed",
                                      "size 1/1", "expired", "size 0/0"}));
  EXPECT_EQ(s.group_count(), 0u);
}
}  // namespace
}  // namespace flashcp::planner_service
