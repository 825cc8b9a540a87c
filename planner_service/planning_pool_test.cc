#include "planner_service/planning_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::planner_service {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;

using Admission = PlanningPool::Admission;

TEST(PlanningPoolTest, BoundedAdmissionStopsAtCapacityWhileHeld) {
  std::vector<int64_t> depths;
  absl::Mutex mu;
  auto created = PlanningPool::Create({/*threads=*/1, /*queue_capacity=*/2, /*start_held=*/true},
                                      [&](int64_t d) {
                                        absl::MutexLock l(&mu);
                                        depths.push_back(d);
                                      });
  ASSERT_THAT(created.status(), IsOk());
  PlanningPool& pool = **created;
  std::atomic<int> ran{0};
  EXPECT_THAT(pool.Submit([&] { ++ran; }, Admission::kBounded), IsOk());
  EXPECT_THAT(pool.Submit([&] { ++ran; }, Admission::kBounded), IsOk());
  EXPECT_THAT(pool.Submit([&] { ++ran; }, Admission::kBounded),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "planner: the planning queue is full (2 jobs waiting); retry later"));
  // A stream's job is admitted regardless: the stream's window bounds it.
  EXPECT_THAT(pool.Submit([&] { ++ran; }, Admission::kAlways), IsOk());
  EXPECT_EQ(pool.depth(), 3);
  EXPECT_EQ(ran.load(), 0);
  pool.Shutdown();  // drains held jobs too
  EXPECT_EQ(ran.load(), 3);
  absl::MutexLock l(&mu);
  EXPECT_THAT(depths, ElementsAre(1, 2, 3, 2, 1, 0));
}

TEST(PlanningPoolTest, CancelRemovesOnlyQueuedJobs) {
  auto created = PlanningPool::Create({1, 4, /*start_held=*/true});
  ASSERT_THAT(created.status(), IsOk());
  PlanningPool& pool = **created;
  std::atomic<int> ran{0};
  absl::StatusOr<PlanningPool::Ticket> a = pool.Submit([&] { ran += 1; }, Admission::kBounded);
  absl::StatusOr<PlanningPool::Ticket> b = pool.Submit([&] { ran += 10; }, Admission::kBounded);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_TRUE(pool.Cancel(*a));
  EXPECT_FALSE(pool.Cancel(*a));  // already gone
  EXPECT_EQ(pool.depth(), 1);
  absl::Notification done;
  ASSERT_THAT(pool.Submit([&] { done.Notify(); }, Admission::kBounded), IsOk());
  pool.Release();
  done.WaitForNotification();  // FIFO: b ran before this one
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(pool.Cancel(*b));  // ran
}

TEST(PlanningPoolTest, RunsOnItsOwnThreadsAndRefusesAfterShutdown) {
  auto created = PlanningPool::Create({2, 8, false});
  ASSERT_THAT(created.status(), IsOk());
  PlanningPool& pool = **created;
  const std::thread::id caller = std::this_thread::get_id();
  absl::Notification done;
  std::atomic<bool> other_thread{false};
  ASSERT_THAT(pool.Submit(
                  [&] {
                    other_thread = std::this_thread::get_id() != caller;
                    done.Notify();
                  },
                  Admission::kBounded),
              IsOk());
  done.WaitForNotification();
  EXPECT_TRUE(other_thread.load());
  pool.Shutdown();
  EXPECT_THAT(pool.Submit([] {}, Admission::kAlways),
              StatusIs(absl::StatusCode::kUnavailable, "planner: the server is shutting down"));
}

TEST(PlanningPoolTest, CreateRefusesNoThreadsOrNoQueue) {
  EXPECT_EQ(PlanningPool::Create({0, 8, false}).status(),
            absl::InvalidArgumentError("planning pool: threads must be at least 1, got 0"));
  EXPECT_EQ(PlanningPool::Create({2, 0, false}).status(),
            absl::InvalidArgumentError("planning pool: queue_capacity must be at least 1, got 0"));
  EXPECT_EQ(PlanningPool::Create({-1, -1, false}).status(),
            absl::InvalidArgumentError("planning pool: threads must be at least 1, got -1"));
}

}  // namespace
}  // namespace flashcp::planner_service
