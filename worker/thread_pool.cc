#include "worker/thread_pool.h"

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"

namespace flashcp::worker {

ThreadPool::ThreadPool(int threads, const Spawn& spawn) {
  const int background = std::max(threads, 1) - 1;
  try {
    workers_.reserve(background);
    for (int i = 0; i < background; ++i) workers_.push_back(spawn([this] { WorkerLoop(); }));
  } catch (const std::exception& e) {
    // A joinable std::thread destroyed by the unwinding would terminate the
    // process: stop and join the ones started, and run on the caller alone.
    status_ = absl::ResourceExhaustedError(absl::StrCat(
        "threads: cannot create thread ", workers_.size() + 2, " of ", background + 1, ": ",
        e.what()));
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
}

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(int threads, const Spawn& spawn) {
  auto pool = std::make_unique<ThreadPool>(threads, spawn);
  if (!pool->status().ok()) return pool->status();
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunItems() {
  // Claims items until none are left; mu_ is held only to claim and to count.
  absl::MutexLock lock(&mu_);
  while (fn_ != nullptr && next_ < n_) {
    const int64_t i = next_++;
    const std::function<void(int64_t)>* fn = fn_;
    mu_.Unlock();
    (*fn)(i);
    mu_.Lock();
    ++done_;
  }
}

void ThreadPool::WorkerLoop() {
  struct Wake {
    ThreadPool* pool;
    uint64_t seen;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return pool->stop_ || pool->generation_ != seen;
    }
  };
  Wake wake{this, 0};
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&wake));
      if (stop_) return;
      wake.seen = generation_;
    }
    RunItems();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    done_ = 0;
    ++generation_;
  }
  RunItems();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ThreadPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->done_ == p->n_; }, this));
  fn_ = nullptr;
}

}  // namespace flashcp::worker
