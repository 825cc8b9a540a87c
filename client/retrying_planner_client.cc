#include "client/retrying_planner_client.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/backoff.h"

namespace flashcp::client {
namespace {

bool Retryable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable;
}

// The last attempt's status, same code, saying how many attempts were made.
absl::Status Exhausted(const absl::Status& last, int attempts) {
  return absl::Status(last.code(),
                      absl::StrCat("after ", attempts, " attempts: ", last.message()));
}

}  // namespace

namespace internal {

// One thread running tasks at their due time (real time), earliest first.
class DelayThread {
 public:
  DelayThread() : thread_([this] { Loop(); }) {}
  ~DelayThread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();  // tasks still waiting are dropped (see PlanAsync's contract)
  }
  void Add(absl::Duration delay, absl::AnyInvocable<void() &&> task) {
    absl::MutexLock lock(&mu_);
    tasks_.emplace(absl::Now() + delay, std::move(task));
    ++added_;
  }

 private:
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || added_ != seen_; }

  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      const absl::Time due = tasks_.empty() ? absl::InfiniteFuture() : tasks_.begin()->first;
      if (absl::Now() < due) {
        // Until `due`, or earlier for stop or a new (maybe earlier) task.
        seen_ = added_;
        mu_.AwaitWithDeadline(absl::Condition(this, &DelayThread::Woken), due);
        continue;
      }
      absl::AnyInvocable<void() &&> task = std::move(tasks_.begin()->second);
      tasks_.erase(tasks_.begin());
      mu_.Unlock();  // the task starts an attempt: never under mu_
      std::move(task)();
      mu_.Lock();
    }
  }

  absl::Mutex mu_;
  std::multimap<absl::Time, absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t added_ ABSL_GUARDED_BY(mu_) = 0;  // tasks ever added
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;   // added_ when the thread last waited
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace internal

absl::Duration RetryBackoff(const RetryPolicy& policy, int attempt) {
  return core::BackoffDelay(
      {policy.initial_backoff, policy.max_backoff, policy.backoff_multiplier}, attempt);
}

RetryingPlannerClient::RetryingPlannerClient(std::shared_ptr<PlannerClient> inner,
                                             RetryPolicy policy, RetryClock clock)
    : inner_(std::move(inner)),
      policy_(policy),
      clock_(std::move(clock)),
      time_(clock_.clock != nullptr ? *clock_.clock : real_clock_) {}

RetryingPlannerClient::~RetryingPlannerClient() = default;

void RetryingPlannerClient::RunAfter(absl::Duration delay, absl::AnyInvocable<void() &&> task) {
  if (clock_.run_after) {
    clock_.run_after(delay, std::move(task));
    return;
  }
  absl::MutexLock lock(&timer_mu_);
  if (timer_ == nullptr) timer_ = std::make_unique<internal::DelayThread>();
  timer_->Add(delay, std::move(task));
}

template <typename T, typename Call>
absl::StatusOr<T> RetryingPlannerClient::Retry(const CallOptions& options, Call call) {
  const absl::Time deadline = time_.Now() + policy_.total_timeout;
  for (int attempt = 1;; ++attempt) {
    CallOptions attempt_options = options;
    attempt_options.timeout = std::min(options.timeout, deadline - time_.Now());
    absl::StatusOr<T> result = call(attempt_options);
    if (result.ok() || !Retryable(result.status())) return result;
    const absl::Duration backoff = RetryBackoff(policy_, attempt);
    if (attempt >= policy_.max_attempts || time_.Now() + backoff >= deadline) {
      return Exhausted(result.status(), attempt);
    }
    time_.SleepFor(backoff);
  }
}

PlanResult RetryingPlannerClient::Plan(const v1::PlanRequest& request,
                                       const CallOptions& options) {
  return Retry<v1::PlanResponse>(
      options, [&](const CallOptions& o) { return inner_->Plan(request, o); });
}

absl::StatusOr<v1::ListStrategiesResponse> RetryingPlannerClient::ListStrategies(
    const CallOptions& options) {
  return Retry<v1::ListStrategiesResponse>(
      options, [&](const CallOptions& o) { return inner_->ListStrategies(o); });
}

absl::StatusOr<v1::ServerInfo> RetryingPlannerClient::GetServerInfo(const CallOptions& options) {
  return Retry<v1::ServerInfo>(options,
                               [&](const CallOptions& o) { return inner_->GetServerInfo(o); });
}

// Not retried: a report that reached the planner and lost its answer would
// add its samples twice.
absl::StatusOr<v1::ReportStepTimesResponse> RetryingPlannerClient::ReportStepTimes(
    const v1::ReportStepTimesRequest& request, const CallOptions& options) {
  return inner_->ReportStepTimes(request, options);
}

void RetryingPlannerClient::PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                                      PlanCallback done) {
  AsyncAttempt(std::make_shared<const v1::PlanRequest>(request), options,
               time_.Now() + policy_.total_timeout, 1, std::move(done));
}

void RetryingPlannerClient::AsyncAttempt(std::shared_ptr<const v1::PlanRequest> request,
                                         CallOptions options, absl::Time deadline, int attempt,
                                         PlanCallback done) {
  CallOptions attempt_options = options;
  attempt_options.timeout = std::min(options.timeout, deadline - time_.Now());
  const v1::PlanRequest& request_ref = *request;
  inner_->PlanAsync(
      request_ref, attempt_options,
      [this, request = std::move(request), options, deadline, attempt,
       done = std::move(done)](PlanResult result) mutable {
        if (result.ok() || !Retryable(result.status())) {
          std::move(done)(std::move(result));
          return;
        }
        const absl::Duration backoff = RetryBackoff(policy_, attempt);
        if (attempt >= policy_.max_attempts || time_.Now() + backoff >= deadline) {
          std::move(done)(Exhausted(result.status(), attempt));
          return;
        }
        // Off this (the inner client's callback) thread: it must not block.
        RunAfter(backoff, [this, request = std::move(request), options, deadline, attempt,
                           done = std::move(done)]() mutable {
          AsyncAttempt(std::move(request), options, deadline, attempt + 1, std::move(done));
        });
      });
}

std::unique_ptr<PlanStream> RetryingPlannerClient::OpenPlanStream(const CallOptions& options) {
  return inner_->OpenPlanStream(options);
}

}  // namespace flashcp::client
