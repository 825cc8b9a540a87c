// flashcp-worker's daemon: one rank of a CP group, formed through the
// planner's Rendezvous service, executing planned batches step after step.
//
// Each round (worker/group_protocol.h has the messages; every message is a
// collective on the group's Communicator):
//  1. The driver (rank 0) decides the round and broadcasts its StepHeader
//     and, for a step, the serialized flashcp.v1.PlanResponse it got from
//     the planner's PlanStream (worker/plan_feed.h); an idle or plan-waiting
//     driver sends a heartbeat instead, so no rank's receive outlives the
//     group timeout, and a driver whose run is over without linger sends exit.
//  2. For a step, every rank runs forward and backward of its part of the
//     plan on seeded Q, K, V and dO through its RankBackend (worker/
//     rank_backend.h: the CPU engine over the group's Gloo communicator, or
//     the CUDA backend over NCCL), and
//  3. after a step or heartbeat all ranks gather each other's RankReport
//     {attention seconds, attention CPU seconds, stop wanted}: each rank's measured
//     imbalance is its time over the group mean, and a stop anywhere
//     (SIGTERM, StopRun) ends the group after the same round.
// A failure on any rank (peer death, timeout, planner error) aborts the
// rendezvous group with the reason and the rank returns the Status.
#ifndef FLASHCP_WORKER_DAEMON_H_
#define FLASHCP_WORKER_DAEMON_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/planner_client.h"
#include "core/analysis.h"
#include "core/clock.h"
#include "core/cost_model.h"
#include "flashcp/v1/worker.grpc.pb.h"
#include "proto/convert.h"
#include "worker/communicator.h"
#include "worker/daemon_options.h"
#include "worker/group_protocol.h"
#include "worker/grpc_store.h"
#include "worker/observer.h"
#include "worker/plan_feed.h"
#include "worker/rank_backend.h"

namespace flashcp::worker {

// Aborts the rendezvous group with `failure` traced through the group
// (TraceGroupFailure, waiting up to `wait` for a peer it timed out on; the
// service prefixes the reason with "rank R: ") and returns that, extended
// with the group's first failure when another rank's abort came first: a
// survivor that lost a peer which had itself failed (its socket closed, or
// its timeout ran out first) would otherwise name only the peer, not the rank
// that caused it. `failure` as it is when the abort cannot be sent.
absl::Status AbortGroup(RendezvousClient& rdv, const absl::Status& failure,
                        absl::Duration wait = absl::ZeroDuration());

// The daemon's state as WorkerControl reports it, and the requests that
// steer it; thread-safe.
class WorkerDaemon {
 public:
  // `observer` and `clock` must outlive the daemon.
  WorkerDaemon(DaemonOptions options, std::shared_ptr<v1::Rendezvous::StubInterface> rendezvous,
               std::shared_ptr<client::PlannerClient> planner,
               std::unique_ptr<RankBackend> backend, WorkerObserver* observer,
               const core::WaitClock* clock);

  // Forms the group, runs (and, with linger, serves StartRun) until done or
  // stopped; OK after a clean end. Call once.
  absl::Status Run();

  // SIGTERM: the group stops after the step in flight.
  void RequestExit();

  // The status; after a run whose plans failed (a per-item plan error),
  // state IDLE with `error` "<CODE>: run failed after k of n steps: ...".
  v1::WorkerStatus Status() const;
  // Driver only (FAILED_PRECONDITION elsewhere, or while a run is going).
  absl::Status StartRun(int64_t steps, const std::string& strategy, const std::string& scheme);
  absl::Status StopRun();

 private:
  struct RunConfig {
    int64_t steps = 0;
    std::string strategy;
    core::CommScheme scheme = core::CommScheme::kAllGather;
  };
  // Sums over a run's steps, for its summary line (the driver prints it).
  struct Summary {
    int64_t steps = 0;
    double step_seconds = 0, attention_seconds = 0, comm_seconds = 0, plan_wait_seconds = 0,
           measured_imbalance = 0, predicted_imbalance = 0;
    int64_t bytes_sent = 0, full_kv_bytes = 0;  // group totals
    // The cost model's prediction, and the steps split by whether their plan
    // used the planner's calibrated fit (index 1) or not (index 0).
    double predicted_cost_imbalance = 0;
    // max / mean of thread CPU attention seconds (0 for a step where some
    // rank did not measure it).
    double measured_cpu_imbalance = 0;
    // Phases by the plan's cost: 0 the shipped profile, 1 the planner's fit,
    // 2 the fit with rank speeds (PlanRequest.rank_speed).
    static constexpr int kPhases = 3;
    int64_t cost_steps[kPhases] = {0, 0, 0};
    double cost_measured[kPhases] = {0, 0, 0}, cost_measured_cpu[kPhases] = {0, 0, 0},
           cost_predicted[kPhases] = {0, 0, 0};
    int64_t first_calibrated_step = -1;  // 0-based step of the run; -1: none
    int64_t first_speed_step = -1;       // the first of phase 2; -1: none
    // Windowed figures (docs/workers.md, "Calibration"): per rank, the sums
    // over the same steps of its thread CPU attention seconds and of its
    // predicted cost (pairs for the whole run, the cost model per phase), so
    // max/mean of the sums is the imbalance over the window, as Prometheus
    // computes it from rates. Empty until a step measured CPU time.
    std::vector<double> rank_cpu, rank_pairs, cost_rank_cpu[kPhases], cost_rank_predicted[kPhases];
  };
  // The driver's run in progress.
  struct DriverRun {
    RunConfig config;
    std::unique_ptr<PlanFeed> feed;
    int64_t done = 0;  // steps completed
  };

  absl::StatusOr<std::unique_ptr<Communicator>> FormGroup(RendezvousClient& rdv);
  // Rounds until an exit header or a stop anywhere.
  absl::Status Loop(Communicator& comm);
  // Rank 0: starts a pending run, ends a finished or stopped one, and fills
  // the round's header (and a step's plan) for BroadcastRound.
  absl::Status DriverRound(int32_t cp_size, StepHeader& header, std::string& payload);
  // A step round on any rank; whether a stop was wanted anywhere.
  absl::StatusOr<bool> StepRound(Communicator& comm, const StepHeader& header,
                                 const std::string& payload);
  // A heartbeat round on any rank; whether a stop was wanted anywhere.
  absl::StatusOr<bool> HeartbeatRound(Communicator& comm, const StepHeader& header);
  // Ranks > 0: the status follows the driver's step header.
  void FollowStep(const StepHeader& header);
  // Runs one step and records it; whether a stop was wanted anywhere.
  absl::StatusOr<bool> Step(Communicator& comm, const v1::PlanResponse& plan,
                            const StepHeader& header, double plan_wait_seconds);
  // This rank's report, and the group's.
  absl::StatusOr<std::vector<RankReport>> Gather(Communicator& comm, RankReport mine);
  // Adds a step to the run's summary and (driver) to the pending report.
  // Driver: adds a calibrated step's CPU seconds to the rank speeds' window
  // and refits them (DaemonOptions::rank_speed_window).
  void UpdateRankSpeeds(const proto::PlanResult& plan, const std::vector<double>& cpu);
  std::vector<double> LastRankSpeeds();
  void Account(const proto::PlanResult& plan, core::CommScheme scheme,
               const std::vector<RankReport>& all, const GroupTimes& group,
               const StepRecord& r, const StepMeasurement& m);
  // The driver's run is over: flush reports, print the summary line, drop the feed.
  void FinishRun(int32_t cp_size);
  void SetState(v1::WorkerStatus::State state);
  // How long an idle or plan-waiting driver waits before its heartbeat.
  absl::Duration HeartbeatInterval() const;
  // The group outlives a run (linger, or runs only by StartRun): a run's plan
  // error ends the run, not the group.
  bool ServesRuns() const { return options_.linger || options_.steps == 0; }
  bool Reports() const;  // the driver reports step times (cost_profile)
  void FlushReport(int32_t cp_size);

  const DaemonOptions options_;
  std::shared_ptr<v1::Rendezvous::StubInterface> rendezvous_;
  std::shared_ptr<client::PlannerClient> planner_;
  std::unique_ptr<RankBackend> backend_;
  WorkerObserver& observer_;
  // Every time the daemon measures (step, plan wait) or waits on (join
  // backoff, idle heartbeat); the backend times its collectives on the clock
  // in its BackendConfig. Must outlive the daemon.
  const core::WaitClock& clock_;

  mutable absl::Mutex mu_;
  v1::WorkerStatus status_ ABSL_GUARDED_BY(mu_);
  bool exit_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_run_wanted_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<RunConfig> pending_run_ ABSL_GUARDED_BY(mu_);

  // The daemon's thread only.
  int64_t next_batch_ = 0;         // batch index of the next step (driver)
  std::optional<DriverRun> run_;   // driver
  absl::Time last_end_;            // the last step's (or idle round's) end
  Summary summary_;
  // Driver: measured rank-steps not yet reported (ReportStepTimes).
  std::vector<core::CostSample> pending_report_;
  // Driver: the last rank_speed_window steps planned on the calibrated fit,
  // per step each rank's features and thread CPU seconds (the rank speeds' input).
  struct SpeedStep {
    std::vector<core::RankFeatures> features;
    std::vector<double> seconds;
  };
  std::deque<SpeedStep> speed_window_;
  // The speeds the plan feed sends (its thread reads them); empty: none yet.
  absl::Mutex speed_mu_;
  std::vector<double> rank_speed_ ABSL_GUARDED_BY(speed_mu_);
};

// The run summary line the driver reports (WorkerObserver::OnRunEnd) at the
// end of each run:
//   RUN {"strategy":...,"scheme":...,"steps":N,"step_seconds":mean,...}
std::string SummaryLine(const std::string& strategy, const std::string& scheme, int64_t steps,
                        double mean_step_s, double mean_attention_s, double mean_comm_s,
                        double mean_plan_wait_s, double measured_imbalance,
                        double predicted_imbalance, int64_t bytes_sent, int64_t full_kv_bytes,
                        absl::string_view extra_json = "");

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_DAEMON_H_
