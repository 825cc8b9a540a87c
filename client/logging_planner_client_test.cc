#include "client/logging_planner_client.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/testing/mock_planner_client.h"
#include "core/testing/status_matchers.h"
#include "core/testing/ticking_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::client {
namespace {

using ::flashcp::client::testing::MockPlannerClient;
using ::flashcp::core::testing::IsOk;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::Return;

struct Fixture {
  std::shared_ptr<MockPlannerClient> mock = std::make_shared<MockPlannerClient>();
  std::vector<std::string> lines;
  // Each reading 250 us after the previous one, so one call takes 0.250 ms.
  core::testing::TickingClock clock{absl::Microseconds(250)};
  LoggingPlannerClient client{mock, LoggingOptions{
                                        .sink = [this](absl::string_view l) {
                                          lines.emplace_back(l);
                                        },
                                        .clock = &clock}};
};

v1::PlanRequest Request() {
  v1::PlanRequest r;
  r.set_batch_id(3);
  for (int64_t len : {5, 6, 7}) r.add_doc_lens(len);
  r.set_cp_size(2);
  r.set_strategy("ring");
  return r;
}

TEST(LoggingPlannerClientTest, LogsPlanSuccessAndPassesTheResultThrough) {
  Fixture f;
  v1::PlanResponse response;
  response.set_batch_id(3);
  EXPECT_CALL(*f.mock, Plan(_, _)).WillOnce(Return(response));
  PlanResult result = f.client.Plan(Request(), {});
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->batch_id(), 3u);
  EXPECT_THAT(f.lines,
              ElementsAre("Plan batch_id=3 docs=3 cp=2 strategy=ring -> OK in 0.250ms"));
}

TEST(LoggingPlannerClientTest, LogsErrorsWithCodeAndMessage) {
  Fixture f;
  const absl::Status error = absl::InvalidArgumentError("cp_size must be <= 11, got 12");
  EXPECT_CALL(*f.mock, Plan(_, _)).WillOnce(Return(error));
  EXPECT_EQ(f.client.Plan(Request(), {}).status(), error);
  EXPECT_THAT(f.lines, ElementsAre("Plan batch_id=3 docs=3 cp=2 strategy=ring -> "
                                   "INVALID_ARGUMENT: cp_size must be <= 11, got 12 in 0.250ms"));
}

TEST(LoggingPlannerClientTest, LogsAsyncCompletion) {
  Fixture f;
  EXPECT_CALL(*f.mock, PlanAsync(_, _, _))
      .WillOnce([](const v1::PlanRequest&, const CallOptions&, PlanCallback done) {
        std::move(done)(absl::UnavailableError("down"));
      });
  std::optional<PlanResult> got;
  f.client.PlanAsync(Request(), {}, [&](PlanResult r) { got = std::move(r); });
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status(), absl::UnavailableError("down"));
  EXPECT_THAT(f.lines, ElementsAre("PlanAsync batch_id=3 docs=3 cp=2 strategy=ring -> "
                                   "UNAVAILABLE: down in 0.250ms"));
}

TEST(LoggingPlannerClientTest, LogsListStrategiesAndServerInfo) {
  Fixture f;
  EXPECT_CALL(*f.mock, ListStrategies(_)).WillOnce(Return(v1::ListStrategiesResponse()));
  EXPECT_CALL(*f.mock, GetServerInfo(_)).WillOnce(Return(absl::UnavailableError("down")));
  EXPECT_THAT(f.client.ListStrategies({}), IsOk());
  EXPECT_EQ(f.client.GetServerInfo({}).status(), absl::UnavailableError("down"));
  EXPECT_THAT(f.lines, ElementsAre("ListStrategies -> OK in 0.250ms",
                                   "GetServerInfo -> UNAVAILABLE: down in 0.250ms"));
}

}  // namespace
}  // namespace flashcp::client
