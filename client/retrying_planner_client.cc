#include "client/retrying_planner_client.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

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

absl::Duration RetryBackoff(const RetryPolicy& policy, int attempt) {
  const double factor = std::pow(std::max(policy.backoff_multiplier, 1.0), attempt - 1);
  const absl::Duration backoff = policy.initial_backoff * factor;
  return std::min(backoff, policy.max_backoff);
}

RetryingPlannerClient::RetryingPlannerClient(std::shared_ptr<PlannerClient> inner,
                                             RetryPolicy policy, RetryClock clock)
    : inner_(std::move(inner)), policy_(policy), clock_(std::move(clock)) {}

template <typename T, typename Call>
absl::StatusOr<T> RetryingPlannerClient::Retry(const CallOptions& options, Call call) {
  const absl::Time deadline = clock_.now() + policy_.total_timeout;
  for (int attempt = 1;; ++attempt) {
    CallOptions attempt_options = options;
    attempt_options.timeout = std::min(options.timeout, deadline - clock_.now());
    absl::StatusOr<T> result = call(attempt_options);
    if (result.ok() || !Retryable(result.status())) return result;
    const absl::Duration backoff = RetryBackoff(policy_, attempt);
    if (attempt >= policy_.max_attempts || clock_.now() + backoff >= deadline) {
      return Exhausted(result.status(), attempt);
    }
    clock_.sleep(backoff);
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

void RetryingPlannerClient::PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                                      PlanCallback done) {
  AsyncAttempt(std::make_shared<const v1::PlanRequest>(request), options,
               clock_.now() + policy_.total_timeout, 1, std::move(done));
}

void RetryingPlannerClient::AsyncAttempt(std::shared_ptr<const v1::PlanRequest> request,
                                         CallOptions options, absl::Time deadline, int attempt,
                                         PlanCallback done) {
  CallOptions attempt_options = options;
  attempt_options.timeout = std::min(options.timeout, deadline - clock_.now());
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
        if (attempt >= policy_.max_attempts || clock_.now() + backoff >= deadline) {
          std::move(done)(Exhausted(result.status(), attempt));
          return;
        }
        clock_.sleep(backoff);
        AsyncAttempt(std::move(request), options, deadline, attempt + 1, std::move(done));
      });
}

std::unique_ptr<PlanStream> RetryingPlannerClient::OpenPlanStream(const CallOptions& options) {
  return inner_->OpenPlanStream(options);
}

}  // namespace flashcp::client
