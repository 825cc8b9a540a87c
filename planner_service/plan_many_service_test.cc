// flashcp.v1.ManyPlanner on a real server on loopback (port 0): answers
// equal to Plan's, in order; per-item errors with Plan's exact code and
// message; the call's own errors with their exact codes.
#include "planner_service/plan_many_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/many_planner_client.h"
#include "core/testing/status_matchers.h"
#include "core/testing/ticking_clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "planner_service/server.h"
#include "proto/convert.h"
#include "proto/plan_batch.h"
#include "proto/rpc/grpc_status.h"
#include "tests/testing/expected_plans.h"
#include "tests/testing/counting_observer.h"

namespace flashcp::planner_service {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::flashcp::tests::testing::PlanRequestOf;
using ::testing::ElementsAre;

constexpr absl::Duration kWait = absl::Seconds(30);

using ::flashcp::tests::testing::CountingObserver;

class PlanManyTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {}) {
    options.listen = "127.0.0.1:0";
    options.metrics = "";
    auto server = PlannerServer::Start(options, &observer_, &clock_);
    ASSERT_THAT(server, IsOk());
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    client_ = std::make_unique<client::ManyPlannerClient>(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  static v1::PlanManyRequest Many(const std::vector<v1::PlanRequest>& requests) {
    v1::PlanManyRequest many;
    for (const v1::PlanRequest& r : requests) *many.add_requests() = r;
    return many;
  }

  // Plan's answer to `r` on the same server.
  absl::StatusOr<v1::PlanResponse> PlanOne(const v1::PlanRequest& r) {
    auto stub = v1::Planner::NewStub(channel_);
    grpc::ClientContext context;
    v1::PlanResponse response;
    const grpc::Status s = stub->Plan(&context, r, &response);
    if (!s.ok()) return proto::rpc::FromGrpcStatus(s);
    return response;
  }

  core::testing::TickingClock clock_{absl::Milliseconds(1)};
  CountingObserver observer_;
  std::unique_ptr<PlannerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<client::ManyPlannerClient> client_;
};

// Every strategy's answer through PlanMany is Plan's, field for field, in
// the requests' order (planning_seconds: two readings of the ticking clock
// in both).
TEST_F(PlanManyTest, AnswersArePlansAnswersInTheRequestsOrder) {
  Start();
  const std::vector<int64_t> docs = {5000, 300, 1200, 7000, 64, 2500, 900, 3100};
  std::vector<v1::PlanRequest> requests = {
      PlanRequestOf(11, docs, 4, "flashcp"), PlanRequestOf(12, docs, 8, "ring"),
      PlanRequestOf(13, {9, 1, 3, 3, 3}, 2, "per_doc"), PlanRequestOf(14, docs, 8, "flashcp")};
  requests[3].set_include_layout(true);
  absl::StatusOr<v1::PlanManyResponse> many = client_->PlanMany(Many(requests));
  ASSERT_THAT(many, IsOk());
  ASSERT_EQ(many->responses_size(), 4);
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<v1::PlanResponse> one = PlanOne(requests[i]);
    ASSERT_THAT(one, IsOk());
    EXPECT_FALSE(many->responses(i).has_error()) << i;
    EXPECT_EQ(many->responses(i).batch_id(), 11u + i);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(many->responses(i), *one))
        << i << ": " << many->responses(i).ShortDebugString() << "\nvs\n"
        << one->ShortDebugString();
  }
  EXPECT_GT(many->responses(3).layout_size(), 0);
  server_->Shutdown();
  absl::MutexLock lock(&observer_.mu);
  EXPECT_EQ(observer_.planned, 8);  // four through PlanMany, four through Plan
  EXPECT_EQ(observer_.inflight, 0);
  EXPECT_EQ(std::count(observer_.done.begin(), observer_.done.end(), "PlanMany:OK"), 1);
}

// A bad item answers with the code and message Plan's status would carry;
// the items around it are planned; the call is OK.
TEST_F(PlanManyTest, ABadItemGetsPlansErrorAndTheOthersArePlanned) {
  Start();
  v1::PlanRequest bad = PlanRequestOf(21, {5, 3}, 2);
  bad.set_cp_size(0);
  v1::PlanRequest unknown = PlanRequestOf(22, {5, 3}, 2, "nope");
  const v1::PlanRequest ilp = PlanRequestOf(23, {5, 3}, 2, "ilp");
  const std::vector<v1::PlanRequest> requests = {PlanRequestOf(20, {5, 3}, 2), bad, unknown, ilp,
                                                 PlanRequestOf(24, {8, 8}, 2)};
  auto answers = client_->PlanEach(requests);
  ASSERT_THAT(answers, IsOk());
  ASSERT_EQ(answers->size(), 5u);
  ASSERT_THAT((*answers)[0], IsOk());
  EXPECT_EQ((*answers)[0]->batch_id(), 20u);
  EXPECT_THAT((*answers)[1], StatusIs(absl::StatusCode::kInvalidArgument,
                                      "cp_size: must be at least 1, got 0"));
  const absl::StatusOr<v1::PlanResponse> plan_unknown = PlanOne(unknown);
  ASSERT_FALSE(plan_unknown.ok());
  EXPECT_EQ((*answers)[2].status(), plan_unknown.status());
  EXPECT_EQ((*answers)[2].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT((*answers)[3],
              StatusIs(absl::StatusCode::kUnimplemented,
                       "strategy: ilp is disabled on this server (start it with --allow_ilp)"));
  ASSERT_THAT((*answers)[4], IsOk());
  EXPECT_EQ((*answers)[4]->batch_id(), 24u);
  // The raw answer keeps each failed item's batch_id beside its error.
  auto raw = client_->PlanMany(Many(requests));
  ASSERT_THAT(raw, IsOk());
  EXPECT_EQ(raw->responses(1).batch_id(), 21u);
  EXPECT_EQ(raw->responses(1).error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(raw->responses(1).shards_size(), 0);
}

// On a server that plans ilp (on its own pool, behind Plan), PlanMany still
// refuses it per item: it would hold the shared planning thread for seconds.
TEST_F(PlanManyTest, IlpIsAnItemsUnimplementedEvenWhereAllowed) {
  ServerOptions o;
  o.allow_ilp = true;
  Start(o);
  auto answers =
      client_->PlanEach({PlanRequestOf(1, {5, 3}, 2, "ilp"), PlanRequestOf(2, {5, 3}, 2)});
  ASSERT_THAT(answers, IsOk());
  EXPECT_THAT((*answers)[0],
              StatusIs(absl::StatusCode::kUnimplemented,
                       "strategy: ilp is not planned by PlanMany (its plans take seconds); send "
                       "it to Plan"));
  EXPECT_THAT((*answers)[1], IsOk());
}

TEST_F(PlanManyTest, NoRequestsOrTooManyAreTheCallsErrors) {
  Start();
  EXPECT_THAT(client_->PlanMany(v1::PlanManyRequest{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "requests: empty; send 1 to 256 PlanRequests"));
  std::vector<v1::PlanRequest> many(kMaxPlansPerCall + 1, PlanRequestOf(1, {5, 3}, 2));
  EXPECT_THAT(client_->PlanEach(many),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "requests: 257 in one call, above 256; send fewer per call"));
  many.pop_back();  // 256: planned
  auto answers = client_->PlanEach(many);
  ASSERT_THAT(answers, IsOk());
  EXPECT_EQ(answers->size(), 256u);
  server_->Shutdown();
  absl::MutexLock lock(&observer_.mu);
  EXPECT_THAT(observer_.done, ElementsAre("PlanMany:INVALID_ARGUMENT",
                                          "PlanMany:RESOURCE_EXHAUSTED", "PlanMany:OK"));
  EXPECT_EQ(observer_.planned, 256);
  EXPECT_EQ(observer_.inflight, 0);
}

TEST_F(PlanManyTest, UnparsableBytesAreInvalidArgument) {
  Start();
  grpc::GenericStub stub(channel_);
  // Field 1 (requests), length-delimited, 5 bytes long, 1 byte present.
  const std::string garbage("\x0a\x05\x01", 3);
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext context;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/flashcp.v1.ManyPlanner/PlanMany", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "could not parse flashcp.v1.PlanManyRequest");
}

// Each item's answer is bounded before planning (CheckPlanBounds); the
// bounds of one call's items together must fit --max_response_bytes too.
TEST_F(PlanManyTest, AnswersThatMayPassTheResponseBoundTogetherAreRefused) {
  proto::PlanInput in;
  in.batch = core::Batch{{5000, 3000}, 4};
  in.strategy = core::Strategy::kFlashCp;
  const int64_t bound = proto::MaxResponseBytes(in, core::MaxPlanShards(in.strategy, in.batch));
  ServerOptions o;
  o.bounds.max_response_bytes = bound + bound / 2;
  Start(o);
  const v1::PlanRequest r = PlanRequestOf(1, {5000, 3000}, 4, "flashcp");
  EXPECT_THAT(client_->PlanEach({r}), IsOk());
  EXPECT_THAT(client_->PlanEach({r, r}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("requests: the 2 answers may take ", 2 * bound,
                                    " bytes together, above this server's "
                                    "--max_response_bytes (", bound + bound / 2,
                                    "); send fewer per call")));
}

// The whole message is bounded by the server's receive limit (gRPC refuses a
// larger one before the service sees it).
TEST_F(PlanManyTest, AMessageAboveTheReceiveLimitIsResourceExhausted) {
  ServerOptions o;
  o.max_message_bytes = 200;
  Start(o);
  const v1::PlanRequest r = PlanRequestOf(1, std::vector<int64_t>(20, 100), 2);
  const v1::PlanManyRequest fits = Many({r}),
                           larger = Many(std::vector<v1::PlanRequest>(10, r));
  ASSERT_LT(fits.ByteSizeLong(), 200u);
  ASSERT_GT(larger.ByteSizeLong(), 200u);
  EXPECT_THAT(client_->PlanMany(fits), IsOk());
  EXPECT_THAT(client_->PlanMany(larger).status().code(), absl::StatusCode::kResourceExhausted);
}

// A call waits for the pool as Plan's do: a full queue refuses it; one whose
// client stops waiting is taken out of the queue and never planned.
TEST_F(PlanManyTest, AFullQueueRefusesAndADeadlineDropsTheQueuedCall) {
  ServerOptions o;
  o.testing_hold_planning = true;
  o.queue_size = 1;
  o.queue_per_client = 1;
  Start(o);
  const v1::PlanManyRequest many = Many({PlanRequestOf(1, {5, 3}, 2), PlanRequestOf(2, {5, 3}, 2)});
  // The first call fills the queue; its deadline passes while it waits.
  grpc::ClientContext first_context;
  first_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::PlanManyResponse first_response;
  absl::Notification first_done;
  grpc::Status first_status;
  auto stub = v1::ManyPlanner::NewStub(channel_);
  stub->async()->PlanMany(&first_context, &many, &first_response, [&](grpc::Status s) {
    first_status = s;
    first_done.Notify();
  });
  {  // until the server has queued it
    absl::MutexLock lock(&observer_.mu);
    ASSERT_TRUE(observer_.mu.AwaitWithTimeout(
        absl::Condition(+[](int64_t* d) { return *d == 1; }, &observer_.depth), kWait));
  }
  EXPECT_THAT(client_->PlanMany(many),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("queue")));
  ASSERT_TRUE(first_done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(first_status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  {  // the server sees the call end (OnCancel) after the client's deadline fired
    absl::MutexLock lock(&observer_.mu);
    EXPECT_TRUE(observer_.mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::vector<std::string>* done) { return done->size() == 2; }, &observer_.done),
        kWait));
  }
  server_->ReleasePlanning();
  server_->Shutdown();
  absl::MutexLock lock(&observer_.mu);
  EXPECT_EQ(observer_.planned, 0);
  EXPECT_EQ(observer_.inflight, 0);
  EXPECT_THAT(observer_.done,
              ElementsAre("PlanMany:RESOURCE_EXHAUSTED", "PlanMany:CANCELLED"));
}

}  // namespace
}  // namespace flashcp::planner_service
