// A fixed-size pool of worker threads for the CPU kernels. The parallelism is
// injected (constructor argument), never read from the machine here, so that
// ranks that share a machine can split its cores between them.
#ifndef FLASHCP_WORKER_THREAD_POOL_H_
#define FLASHCP_WORKER_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace flashcp::worker {

class ThreadPool {
 public:
  // Starts one background thread running `loop`; throws std::system_error
  // when it cannot (std::thread's contract). Injected by tests.
  using Spawn = std::function<std::thread(std::function<void()> loop)>;
  static std::thread DefaultSpawn(std::function<void()> loop) { return std::thread(std::move(loop)); }

  // `threads` >= 1 workers in total: the calling thread plus threads - 1
  // background threads (values below 1 are treated as 1). Where a thread
  // cannot be created the pool keeps none (status() says why) and runs
  // everything on the calling thread; Create refuses it instead.
  explicit ThreadPool(int threads, const Spawn& spawn = DefaultSpawn);
  // ResourceExhausted naming the thread that could not be created.
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(int threads,
                                                           const Spawn& spawn = DefaultSpawn);
  const absl::Status& status() const { return status_; }
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n), each exactly once, spread over the pool
  // (dynamic scheduling: items are claimed one at a time, in index order, so
  // callers put their most expensive items first). Returns when all are done.
  // Not reentrant: fn must not call ParallelFor on the same pool; calls from
  // different threads are serialised.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunItems();

  absl::Mutex call_mu_;  // serialises ParallelFor calls
  absl::Mutex mu_;
  const std::function<void(int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
  absl::Status status_;  // why a background thread is missing; OK when none is
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_THREAD_POOL_H_
