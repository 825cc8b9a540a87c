#include "planner_service/planning_pool.h"

#include <pthread.h>

#include <algorithm>
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
  if (options.client_capacity < 0 || options.client_capacity > options.queue_capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("planning pool: client_capacity must be in [0, queue_capacity = ",
                     options.queue_capacity, "], got ", options.client_capacity));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PlanningPool>> PlanningPool::Create(
    const Options& options, std::function<void(int64_t)> on_depth) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return std::unique_ptr<PlanningPool>(new PlanningPool(options, std::move(on_depth)));
}

PlanningPool::PlanningPool(const Options& options, std::function<void(int64_t)> on_depth)
    : options_(options),
      client_capacity_(options.client_capacity > 0 ? options.client_capacity
                                                   : options.queue_capacity),
      reserve_(std::min(client_capacity_, options.queue_capacity - 1)),
      on_depth_(std::move(on_depth)),
      held_(options.start_held) {
  threads_.reserve(options_.threads);  // >= 1 (Create validated)
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

PlanningPool::~PlanningPool() { Shutdown(); }

absl::Status PlanningPool::RoomLocked(const std::string& client, int reserve) const {
  if (stopping_) return absl::UnavailableError("planner: the server is shutting down");
  if (static_cast<int64_t>(queue_.size()) + reserve >= options_.queue_capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("planner: the planning queue is full (", queue_.size(),
                     " jobs waiting); retry later"));
  }
  auto line = lines_.find(client);
  if (line != lines_.end() && static_cast<int64_t>(line->second.size()) >= client_capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("planner: this client already has ", line->second.size(),
                     " planning jobs waiting (--queue_per_client ", client_capacity_,
                     "); retry later"));
  }
  return absl::OkStatus();
}

PlanningPool::Ticket PlanningPool::EnqueueLocked(Job job, std::string client) {
  const Ticket ticket = next_id_++;
  std::deque<Ticket>& line = lines_[client];
  if (line.empty()) turns_.push_back(client);
  line.push_back(ticket);
  queue_.emplace(ticket, Entry{std::move(job), std::move(client)});
  ReportDepthLocked();
  return ticket;
}

absl::StatusOr<PlanningPool::Ticket> PlanningPool::Submit(Job job, absl::string_view client) {
  absl::MutexLock lock(&mu_);
  const std::string key(client);
  if (absl::Status room = RoomLocked(key, /*reserve=*/0); !room.ok()) return room;
  return EnqueueLocked(std::move(job), key);
}

absl::StatusOr<PlanningPool::Queued> PlanningPool::SubmitOrWait(Job* job, absl::string_view client,
                                                                std::function<void()> on_room) {
  absl::MutexLock lock(&mu_);
  const std::string key(client);
  const absl::Status room = RoomLocked(key, reserve_);
  if (room.ok()) return Queued{EnqueueLocked(std::move(*job), key), 0};
  if (room.code() != absl::StatusCode::kResourceExhausted) return room;
  const WaitId id = next_id_++;
  waiters_.emplace(id, std::move(on_room));
  return Queued{0, id};
}

PlanningPool::Job PlanningPool::RemoveLocked(std::map<Ticket, Entry>::iterator it) {
  auto line = lines_.find(it->second.client);
  std::deque<Ticket>& tickets = line->second;
  tickets.erase(std::find(tickets.begin(), tickets.end(), it->first));
  if (tickets.empty()) {
    turns_.erase(std::find(turns_.begin(), turns_.end(), line->first));
    lines_.erase(line);
  }
  Job job = std::move(it->second.job);
  queue_.erase(it);
  ReportDepthLocked();
  return job;
}

std::function<void()> PlanningPool::PopWaiterLocked() {
  if (waiters_.empty()) return nullptr;
  std::function<void()> f = std::move(waiters_.begin()->second);
  waiters_.erase(waiters_.begin());
  return f;
}

bool PlanningPool::Cancel(Ticket ticket) {
  Job removed;  // destroyed outside the lock: it may own large captures
  std::function<void()> waiter;
  {
    absl::MutexLock lock(&mu_);
    auto it = queue_.find(ticket);
    if (it == queue_.end()) return false;
    removed = RemoveLocked(it);
    waiter = PopWaiterLocked();
  }
  if (waiter) waiter();
  return true;
}

bool PlanningPool::CancelWait(WaitId id) {
  absl::MutexLock lock(&mu_);
  return waiters_.erase(id) > 0;
}

void PlanningPool::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
}

void PlanningPool::Shutdown() {
  absl::MutexLock join_lock(&join_mu_);
  std::map<WaitId, std::function<void()>> waiters;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    held_ = false;  // draining runs held jobs too
    waiters.swap(waiters_);
  }
  for (auto& [id, on_room] : waiters) on_room();  // their Submit now fails Unavailable
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
  // Named for profiles and per-thread CPU figures (bench/service_overhead);
  // at most 15 characters.
  pthread_setname_np(pthread_self(), "flashcp-pool");
  for (;;) {
    Job job;
    std::function<void()> waiter;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PlanningPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return (!p->held_ && !p->queue_.empty()) || (p->stopping_ && p->queue_.empty());
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      // The client whose turn it is: its oldest job; then it goes last.
      const std::string client = turns_.front();
      job = RemoveLocked(queue_.find(lines_[client].front()));
      if (lines_.count(client) > 0) {  // still has jobs: still first in turns_
        turns_.pop_front();
        turns_.push_back(client);
      }
      waiter = PopWaiterLocked();
    }
    if (waiter) waiter();
    job();
  }
}

}  // namespace flashcp::planner_service
