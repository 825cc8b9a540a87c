#include "planner_service/rendezvous_service.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/inprocess_rendezvous.h"

namespace flashcp::planner_service {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::Time Past() { return absl::Now() - absl::Seconds(1); }
absl::Time Far() { return absl::Now() + absl::Seconds(60); }

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

TEST(RendezvousStateTest, JoinCodes) {
  RendezvousState s;
  EXPECT_THAT(s.Join("g", 0, 0, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
  EXPECT_THAT(s.Join("g", 0, kMaxWorldSize + 1, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
  EXPECT_THAT(s.Join("bad name", 0, 4, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group:")));
  ASSERT_EQ(s.Join("g", 0, 4, 7).value(), 4);
  EXPECT_EQ(s.Join("g", 0, 4, 7).value(), 4);  // a retried Join
  EXPECT_THAT(s.Join("g", 1, 2, 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("has world_size 4; rank 1 joined with world_size 2")));
  EXPECT_THAT(s.Join("g", 4, 4, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank: must be in [0, 4)")));
  EXPECT_THAT(s.Join("g", -1, 4, 1).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.Join("g", 0, 4, 8).status(),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("rank 0 is already a member (incarnation 7)")));
  ASSERT_THAT(s.Leave("g", 0, 7), IsOk());
  EXPECT_EQ(s.group_count(), 0u);
  EXPECT_EQ(s.Join("g", 0, 2, 8).value(), 2);  // the group went with its last member
}

// A Join with a bad rank changes nothing: it neither leaves behind a new,
// memberless group (which no Leave could remove) nor re-forms an aborted one.
TEST(RendezvousStateTest, BadRankJoinLeavesNoTrace) {
  RendezvousState s;
  EXPECT_THAT(s.Join("fresh", 2, 2, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank: must be in [0, 2) for group \"fresh\", got 2")));
  EXPECT_THAT(s.Join("fresh", -1, 2, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got -1")));
  EXPECT_EQ(s.group_count(), 0u);
  EXPECT_THAT(s.AwaitMembers("fresh", Past()).status(), StatusIs(absl::StatusCode::kNotFound));

  ASSERT_THAT(s.Join("g", 0, 2, 1).status(), IsOk());
  ASSERT_THAT(s.Abort("g", 0, "peer died"), IsOk());
  EXPECT_THAT(s.Join("g", 5, 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank: must be in [0, 2) for group \"g\", got 5")));
  EXPECT_EQ(s.group_count(), 1u);
  EXPECT_THAT(s.AwaitMembers("g", Past()).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 0: peer died")));
}

TEST(RendezvousStateTest, AwaitMembers) {
  RendezvousState s;
  EXPECT_THAT(s.AwaitMembers("g", Past()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such group")));
  ASSERT_THAT(s.Join("g", 0, 4, 1).status(), IsOk());
  ASSERT_THAT(s.Join("g", 2, 4, 1).status(), IsOk());
  EXPECT_THAT(s.AwaitMembers("g", Past()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("ranks 1, 3 of 4 have not joined")));
  std::thread late([&] {
    ASSERT_THAT(s.Join("g", 1, 4, 1).status(), IsOk());
    ASSERT_THAT(s.Join("g", 3, 4, 1).status(), IsOk());
  });
  const auto ranks = s.AwaitMembers("g", Far());
  late.join();
  ASSERT_THAT(ranks.status(), IsOk());
  EXPECT_THAT(*ranks, ElementsAre(0, 1, 2, 3));
}

TEST(RendezvousStateTest, SetGetAndBounds) {
  RendezvousState s;
  EXPECT_THAT(s.Set("g", "k", "v"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(s.Join("g", 0, 2, 1).status(), IsOk());
  EXPECT_THAT(s.Set("g", "", "v"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key:")));
  EXPECT_THAT(s.Set("g", std::string(kMaxKeyBytes + 1, 'k'), "v"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key: must be 1..256")));
  EXPECT_THAT(s.Set("g", "k", std::string(kMaxValueBytes + 1, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("value: at most 1048576")));
  EXPECT_THAT(s.Set("g", std::string(kMaxKeyBytes, 'k'), std::string(kMaxValueBytes, 'v')),
              IsOk());
  EXPECT_THAT(s.Get("g", {}, Past()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keys:")));
  ASSERT_THAT(s.Set("g", "a", "1"), IsOk());
  EXPECT_THAT(s.Get("g", {"a", "b", "c"}, Past()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("keys \"b\", \"c\" not set")));
  std::thread setter([&] {
    ASSERT_THAT(s.Set("g", "b", std::string("x\0y", 3)), IsOk());
    ASSERT_THAT(s.Set("g", "c", "3"), IsOk());
  });
  const auto values = s.Get("g", {"c", "a", "b"}, Far());
  setter.join();
  ASSERT_THAT(values.status(), IsOk());
  EXPECT_THAT(*values, ElementsAre("3", "1", std::string("x\0y", 3)));
  ASSERT_THAT(s.Set("g", "a", "overwritten"), IsOk());
  EXPECT_THAT(s.Get("g", {"a"}, Past()).value(), ElementsAre("overwritten"));
}

TEST(RendezvousStateTest, TotalValueBytesAreCappedAcrossGroups) {
  RendezvousState s(/*max_total_value_bytes=*/10);
  ASSERT_THAT(s.Join("a", 0, 1, 1).status(), IsOk());
  ASSERT_THAT(s.Join("b", 0, 1, 1).status(), IsOk());
  ASSERT_THAT(s.Set("a", "k", "123456"), IsOk());  // 6 of 10
  EXPECT_EQ(s.Set("b", "k", "12345"),
            absl::ResourceExhaustedError("group \"b\": the values of all groups would exceed 10 "
                                         "bytes (--rendezvous_max_bytes)"));
  ASSERT_THAT(s.Set("b", "k", "1234"), IsOk());  // exactly 10
  ASSERT_THAT(s.Set("a", "k", "1"), IsOk());     // an overwrite frees 5
  ASSERT_THAT(s.Set("b", "k2", "12345"), IsOk());  // 1 + 4 + 5
  // A group that goes (its last member leaves) gives its bytes back.
  ASSERT_THAT(s.Leave("b", 0, 1), IsOk());
  ASSERT_THAT(s.Set("a", "k", "123456789"), IsOk());
  // So does an aborted group that a new incarnation re-forms.
  ASSERT_THAT(s.Abort("a", 0, "x"), IsOk());
  ASSERT_THAT(s.Join("a", 0, 1, 2).status(), IsOk());
  EXPECT_THAT(s.Set("a", "k", "0123456789"), IsOk());
}

TEST(RendezvousStateTest, AbortWakesWaitersAndNewIncarnationResets) {
  RendezvousState s;
  EXPECT_THAT(s.Abort("g", 0, "x"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(s.Join("g", 0, 2, 1).status(), IsOk());
  ASSERT_THAT(s.Join("g", 1, 2, 1).status(), IsOk());
  absl::Status waited;
  std::thread waiter([&] { waited = s.Get("g", {"never"}, Far()).status(); });
  ASSERT_THAT(s.Abort("g", 1, "peer 0 died"), IsOk());
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kAborted,
                               HasSubstr("group \"g\" aborted: rank 1: peer 0 died")));
  EXPECT_THAT(s.Abort("g", 0, "second"), IsOk());  // the first reason is kept
  EXPECT_THAT(s.Set("g", "k", "v"),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 1: peer 0 died")));
  EXPECT_THAT(s.AwaitMembers("g", Far()).status(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(s.Join("g", 0, 2, 1).status(), StatusIs(absl::StatusCode::kAborted));
  // A restarted rank (new incarnation) re-forms the group from scratch.
  EXPECT_EQ(s.Join("g", 0, 2, 2).value(), 2);
  EXPECT_THAT(s.AwaitMembers("g", Past()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("ranks 1 of 2")));
  EXPECT_THAT(s.Abort("g", 0, std::string(kMaxReasonBytes + 1, 'r')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reason:")));
}

TEST(RendezvousStateTest, LeaveAndShutdown) {
  RendezvousState s;
  ASSERT_THAT(s.Join("g", 0, 2, 1).status(), IsOk());
  ASSERT_THAT(s.Join("g", 1, 2, 1).status(), IsOk());
  EXPECT_THAT(s.Leave("g", 0, 2), StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 0")));
  EXPECT_THAT(s.Leave("h", 0, 1), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(s.Leave("g", 0, 1), IsOk());
  EXPECT_EQ(s.group_count(), 1u);
  absl::Status waited;
  std::thread waiter([&] { waited = s.Get("g", {"never"}, Far()).status(); });
  s.Shutdown();
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  EXPECT_THAT(s.Join("g", 0, 2, 3).status(), StatusIs(absl::StatusCode::kUnavailable));
}

// The adapter over a real in-process gRPC server: codes and values survive the wire.
class RendezvousServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<tests::testing::InProcessRendezvous>> r =
        tests::testing::InProcessRendezvous::Start();
    ASSERT_THAT(r.status(), IsOk());
    rendezvous_ = *std::move(r);
    stub_ = rendezvous_->stub();
  }
  RendezvousHost& host() { return rendezvous_->host(); }

  std::unique_ptr<tests::testing::InProcessRendezvous> rendezvous_;
  std::shared_ptr<v1::Rendezvous::Stub> stub_;
};

TEST_F(RendezvousServiceTest, RoundTripAndCodes) {
  grpc::ClientContext c1;
  v1::JoinRequest join;
  join.set_group("g");
  join.set_rank(0);
  join.set_world_size(1);
  join.set_incarnation(5);
  v1::JoinResponse joined;
  ASSERT_TRUE(stub_->Join(&c1, join, &joined).ok());
  EXPECT_EQ(joined.world_size(), 1);

  grpc::ClientContext c2;
  v1::AwaitMembersRequest await;
  await.set_group("g");
  await.set_timeout_ms(1000);
  v1::AwaitMembersResponse members;
  ASSERT_TRUE(stub_->AwaitMembers(&c2, await, &members).ok());
  EXPECT_THAT(members.ranks(), ElementsAre(0));

  grpc::ClientContext c3;
  v1::SetRequest set;
  set.set_group("g");
  set.set_key("k");
  set.set_value("v");
  v1::SetResponse set_response;
  ASSERT_TRUE(stub_->Set(&c3, set, &set_response).ok());

  grpc::ClientContext c4;
  v1::GetRequest get;
  get.set_group("g");
  get.add_keys("k");
  get.set_timeout_ms(0);
  v1::GetResponse values;
  ASSERT_TRUE(stub_->Get(&c4, get, &values).ok());
  EXPECT_THAT(values.values(), ElementsAre("v"));

  struct BadGet {
    int64_t timeout_ms;
    std::string key;
    grpc::StatusCode code;
  };
  for (const BadGet& b : std::vector<BadGet>{
           {-1, "k", grpc::StatusCode::INVALID_ARGUMENT},
           {absl::ToInt64Milliseconds(kMaxTimeout) + 1, "k", grpc::StatusCode::INVALID_ARGUMENT},
           {0, "missing", grpc::StatusCode::DEADLINE_EXCEEDED},
           {0, "", grpc::StatusCode::INVALID_ARGUMENT}}) {
    grpc::ClientContext c;
    v1::GetRequest r;
    r.set_group("g");
    r.add_keys(b.key);
    r.set_timeout_ms(b.timeout_ms);
    v1::GetResponse out;
    EXPECT_EQ(stub_->Get(&c, r, &out).error_code(), b.code) << b.timeout_ms << " " << b.key;
  }

  // A long wait is cut to the call's own deadline.
  grpc::ClientContext c5;
  c5.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  get.clear_keys();
  get.add_keys("missing");
  get.set_timeout_ms(absl::ToInt64Milliseconds(kMaxTimeout));
  const absl::Time start = absl::Now();
  EXPECT_EQ(stub_->Get(&c5, get, &values).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));

  grpc::ClientContext c6;
  v1::AbortRequest abort;
  abort.set_group("g");
  abort.set_rank(0);
  abort.set_reason("test");
  v1::AbortResponse aborted;
  ASSERT_TRUE(stub_->Abort(&c6, abort, &aborted).ok());
  grpc::ClientContext c7;
  const grpc::Status s = stub_->Set(&c7, set, &set_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(s.error_message(), "group \"g\" aborted: rank 0: test");

  grpc::ClientContext c8;
  v1::LeaveRequest leave;
  leave.set_group("g");
  leave.set_rank(0);
  leave.set_incarnation(5);
  v1::LeaveResponse left;
  ASSERT_TRUE(stub_->Leave(&c8, leave, &left).ok());
  EXPECT_EQ(host().state().group_count(), 0u);
}

}  // namespace
}  // namespace flashcp::planner_service
