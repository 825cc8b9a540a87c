#include "worker/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::worker {
namespace {

using core::testing::IsOk;

// Issue 31 item 8: a thread that cannot be created (EAGAIN under a low
// ulimit) is an error, not std::terminate from a joinable thread's
// destructor during the unwinding.
TEST(ThreadPoolTest, AThreadThatCannotBeCreatedIsAnErrorNotAnAbort) {
  int spawned = 0;
  const ThreadPool::Spawn third_fails = [&spawned](std::function<void()> loop) {
    if (++spawned == 3) {
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "pthread_create");
    }
    return std::thread(std::move(loop));
  };
  absl::StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(8, third_fails);
  EXPECT_EQ(pool.status(),
            absl::ResourceExhaustedError(
                "threads: cannot create thread 4 of 8: pthread_create: Resource temporarily "
                "unavailable"));
  // The constructor keeps a pool that runs on the caller alone.
  spawned = 0;
  ThreadPool degraded(8, third_fails);
  EXPECT_EQ(degraded.threads(), 1);
  EXPECT_EQ(degraded.status().code(), absl::StatusCode::kResourceExhausted);
  std::atomic<int64_t> sum{0};
  degraded.ParallelFor(100, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPoolTest, RunsEveryItemOnceOnAllThreads) {
  absl::StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(4);
  ASSERT_THAT(pool.status(), IsOk());
  EXPECT_EQ((*pool)->threads(), 4);
  std::vector<std::atomic<int>> hits(1000);
  (*pool)->ParallelFor(1000, [&](int64_t i) { ++hits[i]; });
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace flashcp::worker
