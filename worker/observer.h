// What the worker daemon reports as it works: the seam between the daemon and
// its metrics (STYLE item 9), as planner_service/observer.h is the planner's.
// PrometheusWorkerMetrics (worker/metrics.h) implements it for the binary;
// the daemon's unit tests use a recording double. Called on the daemon's
// thread only.
#ifndef FLASHCP_WORKER_OBSERVER_H_
#define FLASHCP_WORKER_OBSERVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace flashcp::worker {

// What one step measured on this rank (seconds, bytes).
struct StepRecord {
  double step_seconds = 0, plan_wait_seconds = 0, forward_seconds = 0, backward_seconds = 0,
         comm_seconds = 0;
  double attention_seconds = 0;  // StepMeasurement::attention_seconds (what the group compares)
  int64_t bytes_sent = 0, bytes_received = 0, full_kv_bytes_sent = 0;
  int64_t predicted_bytes_sent = 0;  // the plan's sent bytes for this rank under the scheme
  double predicted_workload = 0;     // the plan's attention (query, key) pairs on this rank
  // The plan's predicted cost of this rank under its cost profile (seconds
  // for a measured profile, pairs for `pairs`); 0 from a server without one.
  double predicted_cost = 0;
  double attention_time_ratio = 1.0;  // this rank's attention compute time / group mean
  double predicted_imbalance = 1.0;   // the plan's (planner's) imbalance ratio
  // The plan's predicted attention step (PlanMetrics.predicted_step_seconds,
  // seconds, on the --cluster preset); 0 when the plans carry none.
  double predicted_step_seconds = 0;
};

class WorkerObserver {
 public:
  enum class GroupEvent {
    kForming,  // joining the rendezvous and connecting the transports
    kFormed,   // every rank connected; rounds begin
    kEnded,    // the group ended cleanly (a run's end without linger, or a stop)
    kFailed,   // the group failed (OnGroupEvent's status says why)
  };
  virtual ~WorkerObserver() = default;

  // A run of (strategy, scheme) is about to step on this rank (also the
  // configured pair before the group forms): its series should exist at zero.
  virtual void OnRunStart(absl::string_view strategy, absl::string_view scheme) = 0;

  // One step this rank completed.
  virtual void OnStep(absl::string_view strategy, absl::string_view scheme,
                      const StepRecord& record) = 0;

  // The group's life; `status` is OK except for kFailed.
  virtual void OnGroupEvent(GroupEvent event, const absl::Status& status) = 0;

  // The driver's (rank 0's) summary of a run that ended: SummaryLine's
  // `RUN {...}` line, without a newline (flashcp-worker prints it).
  virtual void OnRunEnd(absl::string_view summary) = 0;
};

// Reports nothing.
class NullWorkerObserver final : public WorkerObserver {
 public:
  void OnRunStart(absl::string_view, absl::string_view) override {}
  void OnStep(absl::string_view, absl::string_view, const StepRecord&) override {}
  void OnGroupEvent(GroupEvent, const absl::Status&) override {}
  void OnRunEnd(absl::string_view) override {}
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_OBSERVER_H_
