// A fixed pool of planning threads fed by a bounded queue. Planning never
// runs on gRPC's threads: the service submits jobs here and finishes RPCs from
// these threads.
//
// Fairness: jobs wait in one FIFO per client (the caller's key, e.g. the gRPC
// peer) and the threads take them round-robin over the clients, so a client
// with many jobs waiting delays another client's next job by at most one job
// per other client. Bounds: queue_capacity jobs wait in all, client_capacity
// per client; jobs that yield (a stream's items) also leave a reserve of
// client_capacity slots (at most queue_capacity - 1) to the others, so that
// streams, which wait for room instead of failing, cannot fill the queue
// against unary calls.
#ifndef FLASHCP_PLANNER_SERVICE_PLANNING_POOL_H_
#define FLASHCP_PLANNER_SERVICE_PLANNING_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace flashcp::planner_service {

class PlanningPool {
 public:
  struct Options {
    int threads = 2;          // >= 1
    int queue_capacity = 64;  // jobs that may wait for a thread, all clients, >= 1
    bool start_held = false;  // test hook: threads take no job until Release()
    // Jobs one client may have waiting, in [1, queue_capacity]; 0 means
    // queue_capacity (no bound per client).
    int client_capacity = 0;
  };

  // Identifies a queued job, for Cancel, and a waiting SubmitOrWait, for
  // CancelWait. Never 0.
  using Ticket = uint64_t;
  using WaitId = uint64_t;
  using Job = std::function<void()>;

  // InvalidArgument naming the field unless threads >= 1,
  // queue_capacity >= 1 and 0 <= client_capacity <= queue_capacity.
  static absl::Status ValidateOptions(const Options& options);

  // Validates `options` (ValidateOptions) and starts the threads. `on_depth`,
  // if set, is called with the number of waiting jobs after every change,
  // under the pool's lock (keep it cheap).
  static absl::StatusOr<std::unique_ptr<PlanningPool>> Create(
      const Options& options, std::function<void(int64_t)> on_depth = nullptr);
  ~PlanningPool();  // Shutdown()
  PlanningPool(const PlanningPool&) = delete;
  PlanningPool& operator=(const PlanningPool&) = delete;

  // Queues `job` for `client` to run once on a pool thread. ResourceExhausted
  // when queue_capacity jobs wait, or client_capacity of this client's;
  // Unavailable after Shutdown() began.
  absl::StatusOr<Ticket> Submit(Job job, absl::string_view client = {});

  // For jobs that wait instead of failing (a stream's items): queues `*job`
  // (moved from) and returns its ticket where it fits under the bounds less
  // the reserve; otherwise leaves `*job` alone, keeps `on_room` and returns
  // {0, id}: `on_room` is called once, on a pool thread without the pool's
  // lock, after a job leaves the queue, and the caller submits again then.
  // Unavailable after Shutdown() began.
  struct Queued {
    Ticket ticket = 0;  // set when queued
    WaitId wait = 0;    // set when waiting for room
  };
  absl::StatusOr<Queued> SubmitOrWait(Job* job, absl::string_view client,
                                      std::function<void()> on_room);

  // Removes a job that is still waiting: true if it was removed (it will never
  // run; the caller answers for it), false if it already started or finished.
  bool Cancel(Ticket ticket);

  // Forgets a waiting on_room: true if it was removed (it will not be
  // called), false if it was called or is being called.
  bool CancelWait(WaitId id);

  // Lets held threads (Options::start_held) start taking jobs. Idempotent.
  void Release();

  // Stops admitting, runs every job already queued (held or not), calls every
  // waiting on_room (whose Submit then fails Unavailable), joins the threads.
  // Idempotent; blocks until done.
  void Shutdown();

  int64_t depth() const;
  const Options& options() const { return options_; }

 private:
  struct Entry {
    Job job;
    std::string client;
  };

  PlanningPool(const Options& options, std::function<void(int64_t)> on_depth);
  void WorkerLoop();
  void ReportDepthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `client`'s next job may not be queued now, or OK; `reserve` slots
  // must stay free for others.
  absl::Status RoomLocked(const std::string& client, int reserve) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Ticket EnqueueLocked(Job job, std::string client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the job with `ticket` out of the queue and its client's line.
  Job RemoveLocked(std::map<Ticket, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The oldest on_room, removed; null when none waits.
  std::function<void()> PopWaiterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const int client_capacity_;  // options_.client_capacity, 0 resolved
  const int reserve_;          // slots SubmitOrWait leaves to others
  const std::function<void(int64_t)> on_depth_;

  mutable absl::Mutex mu_;
  // Waiting jobs by ticket (tickets increase), each also in its client's line.
  std::map<Ticket, Entry> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<Ticket>> lines_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> turns_ ABSL_GUARDED_BY(mu_);  // clients with a line, next first
  std::map<WaitId, std::function<void()>> waiters_ ABSL_GUARDED_BY(mu_);  // FIFO by id
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool held_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex join_mu_;  // serializes Shutdown() callers around the joins
  std::vector<std::thread> threads_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_PLANNING_POOL_H_
