// WaitForServer: which of its two calls' results it returns.
#include "client/planner_client.h"

#include "client/testing/mock_planner_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::client {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::flashcp::client::testing::MockPlannerClient;
using ::testing::AllOf;
using ::testing::Field;
using ::testing::Return;

auto Waiting(absl::Duration timeout) {
  return AllOf(Field(&CallOptions::timeout, timeout), Field(&CallOptions::wait_for_ready, true));
}
auto FailingFast(absl::Duration timeout) {
  return AllOf(Field(&CallOptions::timeout, timeout), Field(&CallOptions::wait_for_ready, false));
}

v1::ServerInfo Info() {
  v1::ServerInfo info;
  info.set_api_version("flashcp.v1");
  return info;
}

TEST(WaitForServerTest, AnswerOrOtherErrorOfTheWaitIsReturnedAsIs) {
  MockPlannerClient client;
  EXPECT_CALL(client, GetServerInfo(Waiting(absl::Seconds(10))))
      .WillOnce(Return(Info()))
      .WillOnce(Return(absl::UnimplementedError("no GetServerInfo")));
  auto info = WaitForServer(client, absl::Seconds(10));
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->api_version(), "flashcp.v1");
  EXPECT_THAT(WaitForServer(client, absl::Seconds(10)),
              StatusIs(absl::StatusCode::kUnimplemented, "no GetServerInfo"));
}

TEST(WaitForServerTest, DeadlineCarriesTheFailFastCallsReason) {
  MockPlannerClient client;
  EXPECT_CALL(client, GetServerInfo(Waiting(absl::Seconds(10))))
      .WillOnce(Return(absl::DeadlineExceededError("Deadline Exceeded")));
  EXPECT_CALL(client, GetServerInfo(FailingFast(absl::Seconds(1))))
      .WillOnce(Return(absl::UnavailableError("Ssl handshake failed")));
  EXPECT_THAT(WaitForServer(client, absl::Seconds(10)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "Deadline Exceeded; last connection error: UNAVAILABLE: Ssl handshake "
                       "failed"));
}

TEST(WaitForServerTest, FailFastDeadlineIsAtMostTheTimeout) {
  MockPlannerClient client;
  EXPECT_CALL(client, GetServerInfo(Waiting(absl::Milliseconds(500))))
      .WillOnce(Return(absl::DeadlineExceededError("first")));
  EXPECT_CALL(client, GetServerInfo(FailingFast(absl::Milliseconds(500))))
      .WillOnce(Return(absl::DeadlineExceededError("second")));
  EXPECT_THAT(WaitForServer(client, absl::Milliseconds(500)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "first; last connection error: DEADLINE_EXCEEDED: second"));
}

TEST(WaitForServerTest, ServerThatCameUpJustThenAnswersTheFailFastCall) {
  MockPlannerClient client;
  EXPECT_CALL(client, GetServerInfo(Waiting(absl::Seconds(10))))
      .WillOnce(Return(absl::DeadlineExceededError("Deadline Exceeded")));
  EXPECT_CALL(client, GetServerInfo(FailingFast(absl::Seconds(1)))).WillOnce(Return(Info()));
  EXPECT_THAT(WaitForServer(client, absl::Seconds(10)), IsOk());
}

}  // namespace
}  // namespace flashcp::client
