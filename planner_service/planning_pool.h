// A fixed pool of planning threads fed by a bounded FIFO queue. Planning never
// runs on gRPC's threads: the service submits jobs here and finishes RPCs from
// these threads.
#ifndef FLASHCP_PLANNER_SERVICE_PLANNING_POOL_H_
#define FLASHCP_PLANNER_SERVICE_PLANNING_POOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace flashcp::planner_service {

class PlanningPool {
 public:
  struct Options {
    int threads = 2;          // >= 1
    int queue_capacity = 64;  // jobs that may wait for a thread (kBounded admission), >= 1
    bool start_held = false;  // test hook: threads take no job until Release()
  };

  // How Submit treats a full queue.
  enum class Admission {
    kBounded,  // ResourceExhausted when queue_capacity jobs already wait (unary calls)
    kAlways,   // always queued: the caller bounds its own jobs (a stream's window)
  };

  // Identifies a queued job, for Cancel.
  using Ticket = uint64_t;
  using Job = std::function<void()>;

  // InvalidArgument naming the field unless threads >= 1 and
  // queue_capacity >= 1.
  static absl::Status ValidateOptions(const Options& options);

  // Validates `options` (ValidateOptions) and starts the threads. `on_depth`,
  // if set, is called with the number of waiting jobs after every change,
  // under the pool's lock (keep it cheap).
  static absl::StatusOr<std::unique_ptr<PlanningPool>> Create(
      const Options& options, std::function<void(int64_t)> on_depth = nullptr);
  ~PlanningPool();  // Shutdown()
  PlanningPool(const PlanningPool&) = delete;
  PlanningPool& operator=(const PlanningPool&) = delete;

  // Queues `job` to run once on a pool thread, FIFO. ResourceExhausted when
  // full (kBounded); Unavailable after Shutdown() began.
  absl::StatusOr<Ticket> Submit(Job job, Admission admission);

  // Removes a job that is still waiting: true if it was removed (it will never
  // run; the caller answers for it), false if it already started or finished.
  bool Cancel(Ticket ticket);

  // Lets held threads (Options::start_held) start taking jobs. Idempotent.
  void Release();

  // Stops admitting, runs every job already queued (held or not), joins the
  // threads. Idempotent; blocks until done.
  void Shutdown();

  int64_t depth() const;
  const Options& options() const { return options_; }

 private:
  PlanningPool(const Options& options, std::function<void(int64_t)> on_depth);
  void WorkerLoop();
  void ReportDepthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::function<void(int64_t)> on_depth_;

  mutable absl::Mutex mu_;
  // Waiting jobs by ticket; tickets increase, so begin() is the oldest (FIFO).
  std::map<Ticket, Job> queue_ ABSL_GUARDED_BY(mu_);
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  bool held_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex join_mu_;  // serializes Shutdown() callers around the joins
  std::vector<std::thread> threads_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_PLANNING_POOL_H_
