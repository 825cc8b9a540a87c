#include "client/retrying_planner_client.h"

#include <future>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

#include "client/testing/mock_planner_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::client {
namespace {

using ::flashcp::client::testing::MockPlannerClient;
using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::Return;

// Time moves only when the decorator waits: a blocking sleep, or an async
// retry's run_after (which then runs the task at once, on the caller's stack).
// With sleep_fails, a blocking sleep is a test failure.
class FakeClock final : public core::WaitClock {
 public:
  absl::Time Now() const override { return now; }
  void SleepFor(absl::Duration d) const override {
    if (sleep_fails) ADD_FAILURE() << "slept " << d;
    sleeps.push_back(d);
    now += d;
  }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                         absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ADD_FAILURE() << "the decorator does not wait on a condition";
    return cond.Eval();
  }
  RetryClock AsRetryClock() {
    return {.clock = this, .run_after = [this](absl::Duration d, absl::AnyInvocable<void() &&> task) {
              sleeps.push_back(d);
              now += d;
              std::move(task)();
            }};
  }

  mutable absl::Time now = absl::FromUnixSeconds(1000);
  mutable std::vector<absl::Duration> sleeps;
  bool sleep_fails = false;
};

v1::PlanResponse Response(uint64_t batch_id) {
  v1::PlanResponse r;
  r.set_batch_id(batch_id);
  return r;
}

// A PlanAsync action that answers UNAVAILABLE to the first `failures` calls
// and the request's batch_id after them, inline (as if on gRPC's callback
// thread); `calls` counts them.
auto FailThenAnswer(int failures, int& calls) {
  return [failures, &calls](const v1::PlanRequest& request, const CallOptions&,
                            PlanCallback done) {
    if (++calls <= failures) {
      std::move(done)(absl::UnavailableError("down"));
    } else {
      std::move(done)(Response(request.batch_id()));
    }
  };
}

RetryPolicy Policy() {
  return {.max_attempts = 5,
          .initial_backoff = absl::Milliseconds(50),
          .max_backoff = absl::Milliseconds(300),
          .backoff_multiplier = 2.0,
          .total_timeout = absl::Seconds(60)};
}

TEST(RetryBackoffTest, GrowsGeometricallyUpToTheCap) {
  const RetryPolicy policy = Policy();
  // 50 * 2^(k-1) ms, capped at 300 ms.
  EXPECT_EQ(RetryBackoff(policy, 1), absl::Milliseconds(50));
  EXPECT_EQ(RetryBackoff(policy, 2), absl::Milliseconds(100));
  EXPECT_EQ(RetryBackoff(policy, 3), absl::Milliseconds(200));
  EXPECT_EQ(RetryBackoff(policy, 4), absl::Milliseconds(300));
  EXPECT_EQ(RetryBackoff(policy, 9), absl::Milliseconds(300));
}

TEST(RetryingPlannerClientTest, SuccessOnFirstAttemptDoesNotSleep) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryingPlannerClient client(mock, Policy(), clock.AsRetryClock());
  EXPECT_CALL(*mock, Plan(_, _)).WillOnce(Return(Response(7)));
  PlanResult result = client.Plan(v1::PlanRequest(), {});
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->batch_id(), 7u);
  EXPECT_TRUE(clock.sleeps.empty());
}

TEST(RetryingPlannerClientTest, RetriesUnavailableWithBackoff) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryingPlannerClient client(mock, Policy(), clock.AsRetryClock());
  EXPECT_CALL(*mock, Plan(_, _))
      .WillOnce(Return(absl::UnavailableError("connection refused")))
      .WillOnce(Return(absl::UnavailableError("connection refused")))
      .WillOnce(Return(Response(3)));
  PlanResult result = client.Plan(v1::PlanRequest(), {});
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->batch_id(), 3u);
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(50), absl::Milliseconds(100)));
}

TEST(RetryingPlannerClientTest, OtherCodesComeBackAtOnce) {
  for (const absl::Status& status :
       {absl::InvalidArgumentError("cp_size must be >= 1, got 0"),
        absl::ResourceExhaustedError("queue full"), absl::DeadlineExceededError("late")}) {
    auto mock = std::make_shared<MockPlannerClient>();
    FakeClock clock;
    RetryingPlannerClient client(mock, Policy(), clock.AsRetryClock());
    EXPECT_CALL(*mock, Plan(_, _)).WillOnce(Return(status));
    EXPECT_EQ(client.Plan(v1::PlanRequest(), {}).status(), status);
    EXPECT_TRUE(clock.sleeps.empty());
  }
}

TEST(RetryingPlannerClientTest, GivesUpAfterMaxAttempts) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryPolicy policy = Policy();
  policy.max_attempts = 3;
  RetryingPlannerClient client(mock, policy, clock.AsRetryClock());
  EXPECT_CALL(*mock, Plan(_, _)).Times(3).WillRepeatedly(Return(absl::UnavailableError("down")));
  EXPECT_EQ(client.Plan(v1::PlanRequest(), {}).status(),
            absl::UnavailableError("after 3 attempts: down"));
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(50), absl::Milliseconds(100)));
}

TEST(RetryingPlannerClientTest, TotalTimeoutBoundsAttemptsAndTheirDeadlines) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryPolicy policy = Policy();
  policy.total_timeout = absl::Milliseconds(120);
  RetryingPlannerClient client(mock, policy, clock.AsRetryClock());
  // Attempt 1 at t=0 gets the whole 120 ms; after 50 ms of backoff attempt 2
  // gets the remaining 70 ms; the next backoff (100 ms) would pass the
  // deadline, so it stops there.
  EXPECT_CALL(*mock, Plan(_, Field(&CallOptions::timeout, absl::Milliseconds(120))))
      .WillOnce(Return(absl::UnavailableError("down")));
  EXPECT_CALL(*mock, Plan(_, Field(&CallOptions::timeout, absl::Milliseconds(70))))
      .WillOnce(Return(absl::UnavailableError("down")));
  EXPECT_EQ(client.Plan(v1::PlanRequest(), {.timeout = absl::Seconds(1)}).status(),
            absl::UnavailableError("after 2 attempts: down"));
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(50)));
}

TEST(RetryingPlannerClientTest, PerAttemptTimeoutKeptWhenShorterThanWhatRemains) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryingPlannerClient client(mock, Policy(), clock.AsRetryClock());
  EXPECT_CALL(*mock, Plan(_, Field(&CallOptions::timeout, absl::Milliseconds(250))))
      .WillOnce(Return(Response(1)));
  EXPECT_THAT(client.Plan(v1::PlanRequest(), {.timeout = absl::Milliseconds(250)}), IsOk());
}

TEST(RetryingPlannerClientTest, ListStrategiesAndServerInfoRetry) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryingPlannerClient client(mock, Policy(), clock.AsRetryClock());
  v1::ListStrategiesResponse strategies;
  strategies.add_strategies()->set_name("ring");
  v1::ServerInfo info;
  info.set_api_version("flashcp.v1");
  EXPECT_CALL(*mock, ListStrategies(_))
      .WillOnce(Return(absl::UnavailableError("down")))
      .WillOnce(Return(strategies));
  EXPECT_CALL(*mock, GetServerInfo(_))
      .WillOnce(Return(absl::UnavailableError("down")))
      .WillOnce(Return(info));
  auto got_strategies = client.ListStrategies({});
  ASSERT_THAT(got_strategies, IsOk());
  EXPECT_EQ(got_strategies->strategies(0).name(), "ring");
  auto got_info = client.GetServerInfo({});
  ASSERT_THAT(got_info, IsOk());
  EXPECT_EQ(got_info->api_version(), "flashcp.v1");
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(50), absl::Milliseconds(50)));
}

TEST(RetryingPlannerClientTest, PlanAsyncRetriesAndCallsBackOnce) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryingPlannerClient client(mock, Policy(), clock.AsRetryClock());
  int calls = 0;
  EXPECT_CALL(*mock, PlanAsync(_, _, _)).Times(3).WillRepeatedly(FailThenAnswer(2, calls));
  v1::PlanRequest request;
  request.set_batch_id(42);
  std::optional<PlanResult> got;
  int callbacks = 0;
  client.PlanAsync(request, {}, [&](PlanResult r) {
    ++callbacks;
    got = std::move(r);
  });
  EXPECT_EQ(callbacks, 1);
  ASSERT_TRUE(got.has_value());
  ASSERT_THAT(*got, IsOk());
  EXPECT_EQ((*got)->batch_id(), 42u);
  EXPECT_THAT(clock.sleeps, ElementsAre(absl::Milliseconds(50), absl::Milliseconds(100)));
}

TEST(RetryingPlannerClientTest, PlanAsyncBackoffDoesNotBlockTheCallbackThread) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  std::vector<std::pair<absl::Duration, absl::AnyInvocable<void() &&>>> timers;
  clock.sleep_fails = true;
  RetryClock retry_clock = clock.AsRetryClock();
  retry_clock.run_after = [&](absl::Duration d, absl::AnyInvocable<void() &&> task) {
    timers.emplace_back(d, std::move(task));  // runs when the test says so
  };
  RetryingPlannerClient client(mock, Policy(), retry_clock);
  int calls = 0;
  EXPECT_CALL(*mock, PlanAsync(_, _, _)).Times(2).WillRepeatedly(FailThenAnswer(1, calls));
  v1::PlanRequest request;
  request.set_batch_id(7);
  std::optional<PlanResult> got;
  client.PlanAsync(request, {}, [&](PlanResult r) { got = std::move(r); });
  // The failed attempt's callback has returned; the retry waits on the timer.
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(got.has_value());
  ASSERT_EQ(timers.size(), 1u);
  EXPECT_EQ(timers[0].first, absl::Milliseconds(50));
  std::move(timers[0].second)();
  EXPECT_EQ(calls, 2);
  ASSERT_TRUE(got.has_value());
  ASSERT_THAT(*got, IsOk());
  EXPECT_EQ((*got)->batch_id(), 7u);
}

TEST(RetryingPlannerClientTest, PlanAsyncDefaultTimerRetriesOnItsOwnThread) {
  auto mock = std::make_shared<MockPlannerClient>();
  RetryPolicy policy = Policy();
  policy.initial_backoff = absl::Milliseconds(1);
  RetryClock real;  // the decorator's own timer thread
  RetryingPlannerClient client(mock, policy, real);
  absl::Mutex mu;
  bool first_callback_returned = false;
  bool returned_before_retry = false;
  EXPECT_CALL(*mock, PlanAsync(_, _, _))
      .WillOnce([&](const v1::PlanRequest&, const CallOptions&, PlanCallback done) {
        std::move(done)(absl::UnavailableError("down"));
        absl::MutexLock lock(&mu);
        first_callback_returned = true;
      })
      .WillOnce([&](const v1::PlanRequest& request, const CallOptions&, PlanCallback done) {
        {
          absl::MutexLock lock(&mu);
          // Instant with the timer; a retry run inside the first callback
          // (a sleep there) waits out the 30 s bound and fails.
          returned_before_retry =
              mu.AwaitWithTimeout(absl::Condition(&first_callback_returned), absl::Seconds(30));
        }
        std::move(done)(Response(request.batch_id()));
      });
  v1::PlanRequest request;
  request.set_batch_id(9);
  std::future<PlanResult> future = client.PlanFuture(request, {});
  const PlanResult got = future.get();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->batch_id(), 9u);
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(returned_before_retry);
}

TEST(RetryingPlannerClientTest, PlanAsyncGivesUpWithTheLastCode) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryPolicy policy = Policy();
  policy.max_attempts = 2;
  RetryingPlannerClient client(mock, policy, clock.AsRetryClock());
  EXPECT_CALL(*mock, PlanAsync(_, _, _))
      .Times(2)
      .WillRepeatedly([](const v1::PlanRequest&, const CallOptions&, PlanCallback done) {
        std::move(done)(absl::UnavailableError("down"));
      });
  std::optional<PlanResult> got;
  client.PlanAsync(v1::PlanRequest(), {}, [&](PlanResult r) { got = std::move(r); });
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status(), absl::UnavailableError("after 2 attempts: down"));
}

TEST(RetryingPlannerClientTest, PlanFutureDeliversTheResult) {
  auto mock = std::make_shared<MockPlannerClient>();
  FakeClock clock;
  RetryingPlannerClient client(mock, Policy(), clock.AsRetryClock());
  EXPECT_CALL(*mock, PlanAsync(_, _, _))
      .WillOnce([](const v1::PlanRequest&, const CallOptions&, PlanCallback done) {
        std::move(done)(absl::InvalidArgumentError("doc_lens[2] must be >= 1, got 0"));
      });
  std::future<PlanResult> future = client.PlanFuture(v1::PlanRequest(), {});
  EXPECT_THAT(future.get(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "doc_lens[2] must be >= 1, got 0"));
}

}  // namespace
}  // namespace flashcp::client
