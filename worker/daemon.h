// flashcp-worker's daemon: one rank of a CP group, formed through the
// planner's Rendezvous service, executing planned batches step after step.
//
// Group protocol (every message a collective on the group's Communicator):
//  1. The driver (rank 0) broadcasts a StepHeader (fixed size) and, for a
//     step, the serialized flashcp.v1.PlanResponse it got from the planner's
//     PlanStream (PlanFeed keeps `prefetch` batches in flight and reconnects
//     when the planner restarts); an idle or plan-waiting driver broadcasts a
//     heartbeat instead, so no rank's receive outlives the group timeout.
//  2. For a step, every rank runs forward and backward of its part of the
//     plan on seeded Q, K, V and dO through its RankBackend (worker/
//     rank_backend.h: the CPU engine over the group's Gloo communicator, or
//     the CUDA backend over NCCL), and
//  3. all ranks all-gather {attention compute seconds, stop wanted}: each
//     rank's measured imbalance is its time over the group mean, and a stop
//     anywhere (SIGTERM, StopRun) ends the group after the same step.
// A failure on any rank (peer death, timeout, planner error) aborts the
// rendezvous group with the reason and the rank returns the Status.
#ifndef FLASHCP_WORKER_DAEMON_H_
#define FLASHCP_WORKER_DAEMON_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/pipelined_planner.h"
#include "client/planner_client.h"
#include "core/analysis.h"
#include "core/clock.h"
#include "core/datasets.h"
#include "core/strategies.h"
#include "core/types.h"
#include "flashcp/v1/worker.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/communicator.h"
#include "worker/grpc_store.h"
#include "worker/rank_backend.h"

namespace flashcp::worker {

struct DaemonOptions {
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string group = "g0";          // [A-Za-z0-9._-]{1,64}
  std::string device = "cpu";        // "cpu" or "cuda:K" (the backend is made for it)
  core::Dataset dataset = core::Dataset::kPile;
  int64_t context = 16384;           // tokens per batch (C)
  std::string strategy = "flashcp";  // a planner strategy name
  core::CommScheme scheme = core::CommScheme::kAllGather;
  double target_imbalance = 0.0;     // 0: the planner's default
  int32_t heads = 4;                 // H
  int32_t head_dim = 64;             // D
  int64_t steps = 100;               // first run's steps; 0: wait for StartRun
  int32_t prefetch = 4;              // plans in flight ahead of the step (K)
  absl::Duration timeout = absl::Seconds(30);  // group formation and every collective
  int32_t threads = 1;               // kernel threads of this rank
  uint64_t seed = 1;                 // batches and Q, K, V data
  bool linger = false;               // after a run: stay (control, metrics) until SIGTERM
  uint64_t incarnation = 0;          // this process's identity for Join/Leave
  int64_t progress_every = 0;        // driver logs progress every N steps; 0: never
  std::string gloo_hostname = "127.0.0.1";  // address this rank's Gloo transport listens on
  // The cost profile the plans balance (core::CostProfileNames; "" or
  // "pairs": SPEC Eq. 3, no reports). Any other: the driver reports every
  // rank's measured attention time with its plan features to the planner
  // (ReportStepTimes) every `report_every` steps (1..64), so the planner
  // calibrates the profile (docs/workers.md, "Calibration").
  std::string cost_profile;
  int32_t report_every = 8;
};

// InvalidArgument naming the flag. Whether a cuda:K device can be used is the
// backend's to say (MakeRankBackend).
absl::Status ValidateDaemonOptions(const DaemonOptions& options);

// Aborts the rendezvous group with `failure` (the service prefixes the reason
// with "rank R: ") and returns `failure`, its message extended with the
// group's first failure when another rank's abort came first: a survivor
// that lost a peer which had itself failed (its socket closed, or its
// timeout ran out first) would otherwise name only the peer, not the rank
// that caused it. `failure` as it is when the abort cannot be sent.
absl::Status AbortGroup(RendezvousClient& rdv, const absl::Status& failure);

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
};

// Labels every series of one worker process carries (constant labels).
struct WorkerLabels {
  // "cpu" or "cuda": what the duration series measure differs (docs/deploy.md,
  // "Metrics and labels"), so every series says which.
  std::string device = "cpu";
  std::string gpu;         // CUDA device index ("0"), as dcgm-exporter's gpu label; empty: none
  std::string local_rank;  // the rank's index on its host; empty: none
};

// The WorkerLabels of a --device value that ValidateDaemonOptions accepted
// (device "cpu" or "cuda", gpu "" or "K") and of `local_rank` ("": none).
WorkerLabels LabelsForDevice(const std::string& device, const std::string& local_rank);

// The worker's Prometheus series (names are deploy/'s contract; base units;
// docs/deploy.md, "Metrics and labels", says what each means). Every series
// carries the WorkerLabels; histograms and counters carry strategy and scheme,
// the two last-step gauges strategy; group and rank come from the scrape
// target's labels.
class WorkerMetrics {
 public:
  WorkerMetrics(prometheus::Registry& registry, const std::string& version,
                const WorkerLabels& labels = {});
  // Ranks in this rank's group (--world_size): what the missing-rank alert
  // compares the group's live targets with.
  void SetWorldSize(int32_t ranks);
  // Creates the run's series at zero, so that the first scrape sees 0.
  void Prepare(const std::string& strategy, const std::string& scheme);
  void Record(const std::string& strategy, const std::string& scheme, const StepRecord& r);

 private:
  prometheus::Family<prometheus::Histogram>& step_;
  prometheus::Family<prometheus::Histogram>& forward_;
  prometheus::Family<prometheus::Histogram>& backward_;
  prometheus::Family<prometheus::Histogram>& comm_;
  prometheus::Family<prometheus::Histogram>& plan_wait_;
  prometheus::Family<prometheus::Counter>& bytes_sent_;
  prometheus::Family<prometheus::Counter>& bytes_received_;
  prometheus::Family<prometheus::Counter>& full_kv_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& attention_;
  prometheus::Family<prometheus::Counter>& predicted_sent_;
  prometheus::Family<prometheus::Counter>& predicted_workload_;
  prometheus::Family<prometheus::Counter>& predicted_cost_;
  prometheus::Family<prometheus::Gauge>& time_ratio_;
  prometheus::Family<prometheus::Gauge>& predicted_imbalance_;
  prometheus::Gauge& world_size_;
};

// The driver's supply of plans: one thread runs PlanStream (client/
// PlanPipelined) with `prefetch` batches in flight and, when the stream
// breaks with UNAVAILABLE (planner restart), reopens it from the first batch
// not yet delivered with backoff. A watchdog thread gives up when no plan has
// arrived for `timeout` while the feed had room for one (a planner that is
// down, or one that hangs without dropping the connection): it cancels the
// stream and the feed delivers UNAVAILABLE. A per-item error is delivered as
// that item's result. The destructor cancels the stream too, so it never
// waits on the planner.
class PlanFeed {
 public:
  struct Config {
    core::Dataset dataset = core::Dataset::kPile;
    int64_t context = 0;
    int32_t cp_size = 1;
    std::string strategy;
    double target_imbalance = 0.0;
    int32_t heads = 1, head_dim = 1;
    int32_t dtype_bytes = 4;  // the backend's element size, for the plans' byte counts
    uint64_t seed = 1;
    int64_t first_batch = 0;  // batch index of the first step
    int64_t count = 0;        // batches to plan
    int32_t prefetch = 4;
    absl::Duration timeout = absl::Seconds(30);
    std::string cost_profile;  // PlanRequest.cost_profile; "" sends none
  };
  // `clock` (the watchdog's, Next's and the backoff's time) must outlive the feed.
  PlanFeed(std::shared_ptr<client::PlannerClient> planner, Config config,
           const core::WaitClock* clock);
  ~PlanFeed();  // cancels the stream and stops the threads

  // The next plan in order, waiting up to `wait` (of the clock's time);
  // nullopt if none yet.
  absl::StatusOr<std::optional<v1::PlanResponse>> Next(absl::Duration wait);

 private:
  void Loop();
  void Watch();
  bool Full() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int32_t>(ready_.size()) >= config_.prefetch;
  }
  std::shared_ptr<client::PlannerClient> planner_;
  const Config config_;
  const core::WaitClock& clock_;
  client::PipelineCanceller canceller_;
  absl::Mutex mu_;
  std::deque<absl::StatusOr<v1::PlanResponse>> ready_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool loop_done_ ABSL_GUARDED_BY(mu_) = false;  // Loop returned
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;  // the watchdog cancelled the stream
  // Since when the feed has been waiting for the planner: the last plan's
  // arrival, or the moment ready_ stopped being full. The watchdog's clock;
  // it does not run while ready_ is full (the driver is behind, not the planner).
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  std::thread watchdog_;
};

// The daemon's state as WorkerControl reports it, and the requests that
// steer it; thread-safe.
class WorkerDaemon {
 public:
  WorkerDaemon(DaemonOptions options, std::shared_ptr<v1::Rendezvous::StubInterface> rendezvous,
               std::shared_ptr<client::PlannerClient> planner,
               std::unique_ptr<RankBackend> backend, WorkerMetrics* metrics,
               const core::WaitClock* clock);

  // Forms the group, runs (and, with linger, serves StartRun) until done or
  // stopped; OK after a clean end. Call once.
  absl::Status Run();

  // SIGTERM: the group stops after the step in flight.
  void RequestExit();

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
  absl::StatusOr<std::unique_ptr<Communicator>> FormGroup(RendezvousClient& rdv);
  absl::Status Loop(Communicator& comm);
  absl::Status Step(Communicator& comm, const v1::PlanResponse& plan, core::CommScheme scheme,
                    int64_t step_index, double plan_wait_seconds, absl::Time start,
                    bool* stop_wanted_anywhere);
  absl::Status Heartbeat(Communicator& comm, bool* stop_wanted_anywhere);
  void SetState(v1::WorkerStatus::State state);

  const DaemonOptions options_;
  std::shared_ptr<v1::Rendezvous::StubInterface> rendezvous_;
  std::shared_ptr<client::PlannerClient> planner_;
  std::unique_ptr<RankBackend> backend_;
  WorkerMetrics* const metrics_;
  // Every time the daemon measures (step, plan wait) or waits on (join
  // backoff, idle heartbeat); the backend times its collectives on the clock
  // in its BackendConfig. Must outlive the daemon.
  const core::WaitClock& clock_;

  mutable absl::Mutex mu_;
  v1::WorkerStatus status_ ABSL_GUARDED_BY(mu_);
  bool exit_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_run_wanted_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<RunConfig> pending_run_ ABSL_GUARDED_BY(mu_);
  int64_t next_batch_ = 0;  // batch index of the next run's first step (driver)

  // Run summary (driver prints it): sums over the run's steps.
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
    int64_t cost_steps[2] = {0, 0};
    double cost_measured[2] = {0, 0}, cost_measured_cpu[2] = {0, 0}, cost_predicted[2] = {0, 0};
    int64_t first_calibrated_step = -1;  // 0-based step of the run; -1: none
    // Windowed figures (docs/workers.md, "Calibration"): per rank, the sums
    // over the same steps of its thread CPU attention seconds and of its
    // predicted cost (pairs for the whole run, the cost model per phase), so
    // max/mean of the sums is the imbalance over the window, as Prometheus
    // computes it from rates. Empty until a step measured CPU time.
    std::vector<double> rank_cpu, rank_pairs, cost_rank_cpu[2], cost_rank_predicted[2];
  } summary_;
  // Driver: measured rank-steps not yet reported (ReportStepTimes).
  std::vector<core::CostSample> pending_report_;
  bool Reports() const;  // the driver reports step times (cost_profile)
  void FlushReport(int32_t cp_size);
};

// flashcp.v1.WorkerControl over a WorkerDaemon (sync API: calls are short).
class WorkerControlService final : public v1::WorkerControl::Service {
 public:
  explicit WorkerControlService(WorkerDaemon* daemon) : daemon_(daemon) {}
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::WorkerStatus* response) override;
  grpc::Status StartRun(grpc::ServerContext*, const v1::StartRunRequest* request,
                        v1::StartRunResponse*) override;
  grpc::Status StopRun(grpc::ServerContext*, const v1::StopRunRequest*,
                       v1::StopRunResponse*) override;

 private:
  WorkerDaemon* const daemon_;
};

// The run summary line the driver prints to stdout at the end of each run:
//   RUN {"strategy":...,"scheme":...,"steps":N,"step_seconds":mean,...}
std::string SummaryLine(const std::string& strategy, const std::string& scheme, int64_t steps,
                        double mean_step_s, double mean_attention_s, double mean_comm_s,
                        double mean_plan_wait_s, double measured_imbalance,
                        double predicted_imbalance, int64_t bytes_sent, int64_t full_kv_bytes,
                        absl::string_view extra_json = "");

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_DAEMON_H_
