#include "planner_service/planning_pool.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashcp::planner_service {

absl::Status PlanningPool::ValidateOptions(const Options& options) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("planning pool: threads must be at least 1, got ", options.threads));
  }
  if (options.queue_capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "planning pool: queue_capacity must be at least 1, got ", options.queue_capacity));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PlanningPool>> PlanningPool::Create(
    const Options& options, std::function<void(int64_t)> on_depth) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return std::unique_ptr<PlanningPool>(new PlanningPool(options, std::move(on_depth)));
}

PlanningPool::PlanningPool(const Options& options, std::function<void(int64_t)> on_depth)
    : options_(options), on_depth_(std::move(on_depth)), held_(options.start_held) {
  threads_.reserve(options_.threads);  // >= 1 (Create validated)
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

PlanningPool::~PlanningPool() { Shutdown(); }

absl::StatusOr<PlanningPool::Ticket> PlanningPool::Submit(Job job, Admission admission) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("planner: the server is shutting down");
  if (admission == Admission::kBounded &&
      static_cast<int64_t>(queue_.size()) >= options_.queue_capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("planner: the planning queue is full (", options_.queue_capacity,
                     " jobs waiting); retry later"));
  }
  const Ticket ticket = next_ticket_++;
  queue_.emplace(ticket, std::move(job));
  ReportDepthLocked();
  return ticket;
}

bool PlanningPool::Cancel(Ticket ticket) {
  Job removed;  // destroyed outside the lock: it may own large captures
  {
    absl::MutexLock lock(&mu_);
    auto it = queue_.find(ticket);
    if (it == queue_.end()) return false;
    removed = std::move(it->second);
    queue_.erase(it);
    ReportDepthLocked();
  }
  return true;
}

void PlanningPool::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
}

void PlanningPool::Shutdown() {
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    held_ = false;  // draining runs held jobs too
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

int64_t PlanningPool::depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void PlanningPool::ReportDepthLocked() {
  if (on_depth_) on_depth_(static_cast<int64_t>(queue_.size()));
}

void PlanningPool::WorkerLoop() {
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PlanningPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return (!p->held_ && !p->queue_.empty()) || (p->stopping_ && p->queue_.empty());
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      auto it = queue_.begin();
      job = std::move(it->second);
      queue_.erase(it);
      ReportDepthLocked();
    }
    job();
  }
}

}  // namespace flashcp::planner_service
