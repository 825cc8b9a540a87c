// A PlannerClient decorator that retries UNAVAILABLE (server not up yet,
// connection lost) with exponential backoff. Other codes come back at once:
// INVALID_ARGUMENT will not change on retry, and RESOURCE_EXHAUSTED and
// DEADLINE_EXCEEDED are for the caller to judge. Time is injected so that
// tests run without sleeping.
//
// To wait for a server that is still starting, CallOptions::wait_for_ready is
// the quicker tool: gRPC's sync client drives a failed channel's reconnection
// from an idle backup poller every 5 s, so fail-fast retries may see
// UNAVAILABLE for up to ~5 s after the server listens. This decorator is for
// servers that go away and come back while calls are being made.
#ifndef FLASHCP_CLIENT_RETRYING_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_RETRYING_PLANNER_CLIENT_H_

#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/planner_client.h"
#include "core/clock.h"

namespace flashcp::client {
namespace internal {
class DelayThread;  // retrying_planner_client.cc
}  // namespace internal

struct RetryPolicy {
  int max_attempts = 5;                                 // >= 1, first attempt included
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  double backoff_multiplier = 2.0;                      // >= 1
  // All attempts and waits together; no attempt starts after it has passed,
  // and each attempt's deadline is cut to what remains.
  absl::Duration total_timeout = absl::Seconds(60);
};

// The clock the decorator reads and the waits it does between attempts.
struct RetryClock {
  // Now, and the blocking calls' wait (SleepFor, in the calling thread). Null:
  // the wall clock (core::RealClock). Must outlive the decorator.
  const core::WaitClock* clock = nullptr;
  // PlanAsync's wait: runs `task` once, after `delay`, on a thread of its own,
  // so that the inner client's callback thread (gRPC's) never blocks. Null:
  // the decorator's own timer thread, started on the first async retry.
  std::function<void(absl::Duration delay, absl::AnyInvocable<void() &&> task)> run_after =
      nullptr;
};

// Backoff before attempt `attempt` + 1 (attempt >= 1 failed):
// min(initial * multiplier^(attempt-1), max).
absl::Duration RetryBackoff(const RetryPolicy& policy, int attempt);

class RetryingPlannerClient final : public PlannerClient {
 public:
  RetryingPlannerClient(std::shared_ptr<PlannerClient> inner, RetryPolicy policy,
                        RetryClock clock = {});
  ~RetryingPlannerClient() override;

  // Blocking calls retry in the calling thread.
  PlanResult Plan(const v1::PlanRequest& request, const CallOptions& options) override;
  absl::StatusOr<v1::ListStrategiesResponse> ListStrategies(const CallOptions& options) override;
  absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& options) override;
  // Not retried: passed straight to the wrapped client (planner_client.h).
  absl::StatusOr<v1::ReportStepTimesResponse> ReportStepTimes(
      const v1::ReportStepTimesRequest& request, const CallOptions& options) override;
  // A failed attempt's callback schedules the next attempt with
  // clock.run_after and returns at once; the retry starts on the timer's
  // thread. The decorator must outlive its pending PlanAsync calls (a retry
  // still waiting when it is destroyed is dropped with its callback).
  void PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                 PlanCallback done) override;
  // Not retried: a stream's items may already have been consumed when it
  // breaks; the pipelined helper reports the stream's status instead.
  std::unique_ptr<PlanStream> OpenPlanStream(const CallOptions& options) override;

 private:
  template <typename T, typename Call>
  absl::StatusOr<T> Retry(const CallOptions& options, Call call);
  void AsyncAttempt(std::shared_ptr<const v1::PlanRequest> request, CallOptions options,
                    absl::Time deadline, int attempt, PlanCallback done);

  void RunAfter(absl::Duration delay, absl::AnyInvocable<void() &&> task);

  std::shared_ptr<PlannerClient> inner_;
  RetryPolicy policy_;
  RetryClock clock_;
  core::RealClock real_clock_;  // clock_.clock when none was injected
  const core::WaitClock& time_;  // *clock_.clock or real_clock_
  absl::Mutex timer_mu_;
  // clock_.run_after when none was injected; made on first use. Declared
  // last: destroyed (its thread joined) while the rest is still alive.
  std::unique_ptr<internal::DelayThread> timer_ ABSL_GUARDED_BY(timer_mu_);
};

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_RETRYING_PLANNER_CLIENT_H_
