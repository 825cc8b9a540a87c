#include "worker/plan_feed.h"

#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "core/clock.h"
#include "core/datasets.h"
#include "core/testing/status_matchers.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/testing/scripted_planner.h"

namespace flashcp::worker {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using ::testing::HasSubstr;
using testing::ScriptedPlanner;

PlanFeed::Config FeedConfig(int64_t count, absl::Duration timeout) {
  return {.dataset = core::Dataset::kPile, .context = 4096, .cp_size = 4, .strategy = "flashcp",
          .attention_mask = {},
          .target_imbalance = 0, .heads = 2, .head_dim = 32, .dtype_bytes = 4, .seed = 7,
          .first_batch = 3, .count = count, .prefetch = 2, .timeout = timeout,
          .cost_profile = "", .rank_speed = nullptr, .cluster = ""};
}

TEST(PlanFeedTest, ResumesFromTheFirstUndeliveredBatchAfterTheStreamBreaks) {
  auto planner =
      std::make_shared<ScriptedPlanner>(/*broken_streams=*/2, /*answers_before_break=*/3);
  // Real time: the reconnect backoffs (100 and 200 ms) pass by themselves.
  const core::RealClock clock;
  PlanFeed feed(planner, FeedConfig(10, absl::Seconds(30)), &clock);
  for (int64_t k = 0; k < 10; ++k) {
    absl::StatusOr<std::optional<v1::PlanResponse>> next = feed.Next(absl::Seconds(30));
    ASSERT_THAT(next.status(), IsOk()) << k;
    ASSERT_TRUE(next->has_value()) << k;
    const std::vector<int64_t> want =
        core::SampleBatch(core::Dataset::kPile, 4096, 7, 3 + k).value();
    EXPECT_EQ(std::vector<int64_t>((*next)->doc_lens().begin(), (*next)->doc_lens().end()), want)
        << "batch " << k;
  }
  EXPECT_EQ(planner->opened(), 3);
}

TEST(PlanFeedTest, EachRequestCarriesTheRankSpeedsOfWhenItWasMade) {
  // The callback's answer changes after its second call: the first two
  // requests carry none, the later ones the speeds.
  auto planner =
      std::make_shared<ScriptedPlanner>(/*broken_streams=*/0, /*answers_before_break=*/0);
  const core::RealClock clock;
  PlanFeed::Config config = FeedConfig(4, absl::Seconds(30));
  config.cost_profile = "cpu-fp32";
  int calls = 0;  // the feed's thread only
  config.rank_speed = [&calls] {
    return ++calls <= 2 ? std::vector<double>{} : std::vector<double>{1.0, 1.25, 0.75, 1.0};
  };
  PlanFeed feed(planner, config, &clock);
  for (int64_t k = 0; k < 4; ++k) {
    absl::StatusOr<std::optional<v1::PlanResponse>> next = feed.Next(absl::Seconds(30));
    ASSERT_THAT(next.status(), IsOk()) << k;
    ASSERT_TRUE(next->has_value()) << k;
  }
  const std::vector<double> none, speeds = {1.0, 1.25, 0.75, 1.0};
  EXPECT_EQ(planner->request_rank_speeds(),
            (std::vector<std::vector<double>>{none, none, speeds, speeds}));
}

TEST(PlanFeedTest, EachRequestAsksForTheStepTimeOnTheCluster) {
  auto planner =
      std::make_shared<ScriptedPlanner>(/*broken_streams=*/0, /*answers_before_break=*/0);
  const core::RealClock clock;
  PlanFeed::Config config = FeedConfig(2, absl::Seconds(30));
  config.cluster = "h100-sxm";
  PlanFeed feed(planner, config, &clock);
  for (int64_t k = 0; k < 2; ++k) {
    absl::StatusOr<std::optional<v1::PlanResponse>> next = feed.Next(absl::Seconds(30));
    ASSERT_THAT(next.status(), IsOk()) << k;
    ASSERT_TRUE(next->has_value()) << k;
  }
  EXPECT_EQ(planner->request_clusters(), (std::vector<std::string>{"h100-sxm", "h100-sxm"}));
  // Without one, none is asked for.
  auto plain = std::make_shared<ScriptedPlanner>(0, 0);
  PlanFeed feed2(plain, FeedConfig(1, absl::Seconds(30)), &clock);
  ASSERT_THAT(feed2.Next(absl::Seconds(30)).status(), IsOk());
  EXPECT_EQ(plain->request_clusters(), (std::vector<std::string>{""}));
}

TEST(PlanFeedTest, EachRequestCarriesTheAttentionMask) {
  auto planner =
      std::make_shared<ScriptedPlanner>(/*broken_streams=*/0, /*answers_before_break=*/0);
  const core::RealClock clock;
  PlanFeed::Config config = FeedConfig(2, absl::Seconds(30));
  config.attention_mask = {core::MaskKind::kBlockDiffusion, 16};
  PlanFeed feed(planner, config, &clock);
  for (int64_t k = 0; k < 2; ++k) {
    absl::StatusOr<std::optional<v1::PlanResponse>> next = feed.Next(absl::Seconds(30));
    ASSERT_THAT(next.status(), IsOk()) << k;
    ASSERT_TRUE(next->has_value()) << k;
  }
  using Mask = std::pair<std::string, int64_t>;
  EXPECT_EQ(planner->request_masks(), (std::vector<Mask>(2, {"block_diffusion", 16})));
  // The default mask is not sent: the requests stay as they were.
  auto plain = std::make_shared<ScriptedPlanner>(0, 0);
  PlanFeed feed2(plain, FeedConfig(1, absl::Seconds(30)), &clock);
  ASSERT_THAT(feed2.Next(absl::Seconds(30)).status(), IsOk());
  EXPECT_EQ(plain->request_masks(), (std::vector<Mask>{{"", 0}}));
}

TEST(PlanFeedTest, GivesUpWithUnavailableAfterTheTimeoutWithoutPlans) {
  // Every stream breaks at once; the feed reconnects after a backoff of the
  // clock's time, which only the test moves.
  auto planner = std::make_shared<ScriptedPlanner>(/*broken_streams=*/1 << 20,
                                                /*answers_before_break=*/0);
  core::ManualClock clock;
  PlanFeed feed(planner, FeedConfig(5, absl::Seconds(30)), &clock);
  ASSERT_THAT(feed.Next(absl::ZeroDuration()).status(), IsOk());
  clock.Advance(absl::Seconds(30));
  // An hour of the clock's time, which nobody advances: only the watchdog's
  // error ends this wait. (The last error it names depends on how far the
  // feed's first stream got before the clock jumped.)
  EXPECT_THAT(feed.Next(absl::Hours(1)).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("plan stream: no plan for 30s")));
}

// A planner that accepts PlanStream calls, reads every request and never
// answers, keeping the connection up: a hung planner, over real gRPC.
class HungPlannerService final : public v1::Planner::Service {
 public:
  grpc::Status PlanStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::PlanResponse, v1::PlanRequest>* stream) override {
    {
      absl::MutexLock lock(&mu_);
      ++opened_;
    }
    v1::PlanRequest request;
    while (stream->Read(&request)) {
    }  // ends when the client cancels
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the call should have been cancelled");
  }
  // Until a PlanStream call has arrived (an event, not a guess at time).
  void AwaitOpened() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n > 0; }, &opened_));
  }

 private:
  absl::Mutex mu_;
  int opened_ ABSL_GUARDED_BY(mu_) = 0;
};

class HungPlannerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    planner_ = std::make_shared<client::GrpcPlannerClient>(
        server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override { server_->Shutdown(); }
  HungPlannerService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<client::PlannerClient> planner_;
};

TEST_F(HungPlannerFixture, WatchdogCancelsTheStreamExactlyAtTheTimeout) {
  core::ManualClock clock;
  PlanFeed feed(planner_, FeedConfig(5, absl::Seconds(30)), &clock);
  // The stream is up (the planner has it), so the watchdog's cancel is what
  // ends it.
  service_.AwaitOpened();
  ASSERT_THAT(feed.Next(absl::ZeroDuration()).status(), IsOk());
  clock.Advance(absl::Seconds(30) - absl::Milliseconds(1));
  const absl::StatusOr<std::optional<v1::PlanResponse>> before = feed.Next(absl::ZeroDuration());
  ASSERT_THAT(before.status(), IsOk());  // 1 ms short of the timeout: no error
  EXPECT_FALSE(before->has_value());
  clock.Advance(absl::Milliseconds(1));
  // An hour of the clock's time that nobody advances: the watchdog ends it.
  EXPECT_THAT(feed.Next(absl::Hours(1)).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("plan stream: no plan for 30s; last error: CANCELLED")));
}

TEST_F(HungPlannerFixture, DestructorCancelsTheStreamInsteadOfWaiting) {
  // A 1 h timeout that the clock never reaches: only the destructor's cancel
  // lets this test end.
  core::ManualClock clock;
  auto feed = std::make_unique<PlanFeed>(planner_, FeedConfig(5, absl::Hours(1)), &clock);
  absl::StatusOr<std::optional<v1::PlanResponse>> next = feed->Next(absl::ZeroDuration());
  ASSERT_THAT(next.status(), IsOk());
  EXPECT_FALSE(next->has_value());
  feed.reset();
}

}  // namespace
}  // namespace flashcp::worker
