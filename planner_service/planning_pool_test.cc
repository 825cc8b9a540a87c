#include "planner_service/planning_pool.h"

#include <atomic>
#include <string>
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
  EXPECT_THAT(pool.Submit([&] { ++ran; }), IsOk());
  EXPECT_THAT(pool.Submit([&] { ++ran; }), IsOk());
  EXPECT_THAT(pool.Submit([&] { ++ran; }),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "planner: the planning queue is full (2 jobs waiting); retry later"));
  EXPECT_EQ(pool.depth(), 2);
  EXPECT_EQ(ran.load(), 0);
  pool.Shutdown();  // drains held jobs too
  EXPECT_EQ(ran.load(), 2);
  absl::MutexLock l(&mu);
  EXPECT_THAT(depths, ElementsAre(1, 2, 1, 0));
}

TEST(PlanningPoolTest, CancelRemovesOnlyQueuedJobs) {
  auto created = PlanningPool::Create({1, 4, /*start_held=*/true});
  ASSERT_THAT(created.status(), IsOk());
  PlanningPool& pool = **created;
  std::atomic<int> ran{0};
  absl::StatusOr<PlanningPool::Ticket> a = pool.Submit([&] { ran += 1; });
  absl::StatusOr<PlanningPool::Ticket> b = pool.Submit([&] { ran += 10; });
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_TRUE(pool.Cancel(*a));
  EXPECT_FALSE(pool.Cancel(*a));  // already gone
  EXPECT_EQ(pool.depth(), 1);
  absl::Notification done;
  ASSERT_THAT(pool.Submit([&] { done.Notify(); }), IsOk());
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
                  }),
              IsOk());
  done.WaitForNotification();
  EXPECT_TRUE(other_thread.load());
  pool.Shutdown();
  EXPECT_THAT(pool.Submit([] {}),
              StatusIs(absl::StatusCode::kUnavailable, "planner: the server is shutting down"));
}

TEST(PlanningPoolTest, OneClientIsBoundedAndTurnsGoRoundRobin) {
  auto created = PlanningPool::Create(
      {/*threads=*/1, /*queue_capacity=*/8, /*start_held=*/true, /*client_capacity=*/3});
  ASSERT_THAT(created.status(), IsOk());
  PlanningPool& pool = **created;
  absl::Mutex mu;
  std::vector<std::string> order;
  const auto job = [&](std::string name) {
    return [&, name] {
      absl::MutexLock l(&mu);
      order.push_back(name);
    };
  };
  for (const char* name : {"a1", "a2", "a3"}) ASSERT_THAT(pool.Submit(job(name), "a"), IsOk());
  EXPECT_THAT(pool.Submit(job("a4"), "a"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "planner: this client already has 3 planning jobs waiting "
                       "(--queue_per_client 3); retry later"));
  ASSERT_THAT(pool.Submit(job("b1"), "b"), IsOk());
  ASSERT_THAT(pool.Submit(job("b2"), "b"), IsOk());
  ASSERT_THAT(pool.Submit(job("c1"), "c"), IsOk());
  pool.Shutdown();
  absl::MutexLock l(&mu);
  // a came first, then b, then c; each takes one turn in that order.
  EXPECT_THAT(order, ElementsAre("a1", "b1", "c1", "a2", "b2", "a3"));
}

TEST(PlanningPoolTest, WaitingJobsLeaveAReserveAndAreWokenWhenRoomOpens) {
  auto created = PlanningPool::Create(
      {/*threads=*/1, /*queue_capacity=*/4, /*start_held=*/true, /*client_capacity=*/2});
  ASSERT_THAT(created.status(), IsOk());
  PlanningPool& pool = **created;
  std::atomic<int> woken{0};
  std::atomic<int> ran{0};
  PlanningPool::Job job = [&] { ++ran; };
  // Capacity 4 less the reserve of 2 (client_capacity): two fit.
  absl::StatusOr<PlanningPool::Queued> q = pool.SubmitOrWait(&job, "s1", [&] { ++woken; });
  ASSERT_THAT(q, IsOk());
  EXPECT_NE(q->ticket, 0u);
  job = [&] { ++ran; };
  q = pool.SubmitOrWait(&job, "s2", [&] { ++woken; });
  ASSERT_THAT(q, IsOk());
  EXPECT_NE(q->ticket, 0u);
  job = [&] { ++ran; };
  q = pool.SubmitOrWait(&job, "s3", [&] { ++woken; });
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->ticket, 0u);
  EXPECT_NE(q->wait, 0u);
  EXPECT_TRUE(static_cast<bool>(job));  // not taken: the caller submits it again
  // The reserve is for the others: a unary call still fits, twice.
  EXPECT_THAT(pool.Submit([&] { ++ran; }, "u"), IsOk());
  EXPECT_THAT(pool.Submit([&] { ++ran; }, "u"), IsOk());
  EXPECT_EQ(woken.load(), 0);
  pool.Release();
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 4);
  EXPECT_EQ(woken.load(), 1);  // once, when the first job left the queue
  // A wait can be called off before it is woken.
  auto again = PlanningPool::Create({1, 2, /*start_held=*/true, 1});
  ASSERT_THAT(again.status(), IsOk());
  job = [] {};
  ASSERT_THAT((*again)->SubmitOrWait(&job, "s", [] {}), IsOk());  // capacity 2 less reserve 1
  job = [] {};
  q = (*again)->SubmitOrWait(&job, "s", [&] { ++woken; });
  ASSERT_THAT(q, IsOk());
  ASSERT_NE(q->wait, 0u);
  EXPECT_TRUE((*again)->CancelWait(q->wait));
  EXPECT_FALSE((*again)->CancelWait(q->wait));
  (*again)->Shutdown();
  EXPECT_EQ(woken.load(), 1);
}

TEST(PlanningPoolTest, CreateRefusesNoThreadsOrNoQueue) {
  EXPECT_EQ(PlanningPool::Create({0, 8, false}).status(),
            absl::InvalidArgumentError("planning pool: threads must be at least 1, got 0"));
  EXPECT_EQ(PlanningPool::Create({2, 0, false}).status(),
            absl::InvalidArgumentError("planning pool: queue_capacity must be at least 1, got 0"));
  EXPECT_EQ(PlanningPool::Create({2, 4, false, 5}).status(),
            absl::InvalidArgumentError(
                "planning pool: client_capacity must be in [0, queue_capacity = 4], got 5"));
  EXPECT_EQ(PlanningPool::Create({-1, -1, false}).status(),
            absl::InvalidArgumentError("planning pool: threads must be at least 1, got -1"));
}

}  // namespace
}  // namespace flashcp::planner_service
