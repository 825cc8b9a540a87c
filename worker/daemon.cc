#include "worker/daemon.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/pipelined_planner.h"
#include "core/backoff.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "proto/rendezvous_limits.h"
#include "worker/gloo_communicator.h"

namespace flashcp::worker {
namespace {

// ---- wire messages of the group protocol (fixed size, native layout: every
// rank runs the same binary on the same architecture) ------------------------
enum class Kind : uint32_t { kStep = 1, kIdle = 2, kWaiting = 3, kExit = 4 };
struct StepHeader {
  uint32_t kind = 0;
  uint32_t scheme = 0;
  int64_t batch = 0;          // batch index (seeds the data)
  int64_t steps_total = 0;    // steps of the current run
  int64_t payload_bytes = 0;  // serialized PlanResponse that follows (kStep)
  char strategy[32] = {};
};
static_assert(sizeof(StepHeader) == 64 && std::is_trivially_copyable_v<StepHeader>);

struct RankReport {
  double attention_seconds = 0;  // CPU: forward + backward minus communication; CUDA: kernel time
  double attention_cpu_seconds = 0;  // StepMeasurement's; 0 where not measured
  uint8_t stop = 0;              // this rank wants the group to stop
  uint8_t pad[7] = {};
};
static_assert(sizeof(RankReport) == 24 && std::is_trivially_copyable_v<RankReport>);

// Rank 0's `bytes` to every rank (an all-gather where only rank 0 contributes).
absl::Status Broadcast(Communicator& comm, std::byte* data, int64_t bytes) {
  std::vector<int64_t> counts(comm.size(), 0);
  counts[0] = bytes;
  const int64_t mine = comm.rank() == 0 ? bytes : 0;
  std::vector<std::byte> in(data, data + mine);
  return comm.AllGatherV(in, absl::MakeSpan(data, bytes), counts);
}

std::vector<double> DurationBuckets() {
  std::vector<double> b;
  for (double x = 0.0005; x < 70; x *= 2) b.push_back(x);  // 0.5 ms .. 65 s
  return b;
}

}  // namespace

// ---- group failure -------------------------------------------------------------

absl::Status AbortGroup(RendezvousClient& rdv, const absl::Status& failure) {
  if (!rdv.Abort(std::string(failure.message())).ok()) return failure;  // unreachable: as is
  // Every call on an aborted group answers ABORTED with its first reason.
  const absl::StatusOr<std::vector<std::string>> probe =
      rdv.Get({"flashcp.first_failure"}, absl::ZeroDuration());
  const std::string mine = absl::StrCat("aborted: rank ", rdv.rank(), ": ");
  if (probe.status().code() != absl::StatusCode::kAborted ||
      absl::StrContains(probe.status().message(), mine)) {
    return failure;
  }
  return absl::Status(failure.code(), absl::StrCat(failure.message(),
                                                   "; first failure in the group: ",
                                                   probe.status().message()));
}

// ---- options -----------------------------------------------------------------

absl::Status ValidateDaemonOptions(const DaemonOptions& o) {
  if (o.world_size < 1 || o.world_size > proto::rendezvous::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size: must be in [1, ",
                                                   proto::rendezvous::kMaxWorldSize, "], got ",
                                                   o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--rank: must be in [0, ", o.world_size,
                                                   "), got ", o.rank));
  }
  FLASHCP_RETURN_IF_ERROR(ParseDevice(o.device).status());
  if (o.context < o.world_size || o.context > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("--context: must be in [world_size, 2^24], got ",
                                                   o.context));
  }
  if (!core::ParseStrategy(o.strategy).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--strategy: unknown \"", o.strategy, "\""));
  }
  if (o.heads < 1 || o.heads > 1024 || o.head_dim < 1 || o.head_dim > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--heads, --head_dim: must be in [1, 1024], got ",
                                                   o.heads, ", ", o.head_dim));
  }
  if (o.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: must be >= 0, got ", o.steps));
  }
  if (!o.cost_profile.empty()) {
    if (absl::Status s = core::CostProfile(o.cost_profile).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cost_profile: ", s.message()));
    }
  }
  if (o.report_every < 1 || o.report_every > proto::kMaxReportSteps) {
    return absl::InvalidArgumentError(absl::StrCat("--report_every: must be in [1, ",
                                                   proto::kMaxReportSteps, "], got ",
                                                   o.report_every));
  }
  if (o.prefetch < 1 || o.prefetch > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefetch: must be in [1, 1024], got ", o.prefetch));
  }
  // The group's rendezvous waits (AwaitMembers, Gloo's store) take this
  // timeout, and the planner refuses waits beyond its limit.
  if (o.timeout < absl::Seconds(1) || o.timeout > proto::rendezvous::kMaxTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout_s: must be in [1, ", absl::ToInt64Seconds(proto::rendezvous::kMaxTimeout),
        "] (the planner's rendezvous wait limit), got ", absl::ToDoubleSeconds(o.timeout)));
  }
  if (o.threads < 1 || o.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: must be in [1, 1024], got ", o.threads));
  }
  return absl::OkStatus();
}

// ---- metrics -----------------------------------------------------------------

namespace {

// The WorkerLabels as Prometheus constant labels; empty values are left out.
prometheus::Labels ConstLabels(const WorkerLabels& l) {
  prometheus::Labels out = {{"device", l.device}};
  if (!l.gpu.empty()) out["gpu"] = l.gpu;
  if (!l.local_rank.empty()) out["local_rank"] = l.local_rank;
  return out;
}

}  // namespace

WorkerLabels LabelsForDevice(const std::string& device, const std::string& local_rank) {
  WorkerLabels l;
  l.local_rank = local_rank;
  const absl::StatusOr<int32_t> index = ParseDevice(device);
  if (index.ok() && *index >= 0) {
    l.device = "cuda";
    l.gpu = absl::StrCat(*index);
  }
  return l;
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry, const std::string& version,
                             const WorkerLabels& labels)
    : step_(prometheus::BuildHistogram()
                .Name("flashcp_worker_step_duration_seconds")
                .Help("Wall time of a training step (plan wait, attention forward and backward, "
                      "reporting), by strategy and scheme")
                .Labels(ConstLabels(labels))
                .Register(registry)),
      forward_(prometheus::BuildHistogram()
                   .Name("flashcp_worker_attention_forward_duration_seconds")
                   .Help("Attention forward pass per step: device=cpu, wall time with its "
                         "collectives; device=cuda, device time of the attention kernels only")
                   .Labels(ConstLabels(labels))
                   .Register(registry)),
      backward_(prometheus::BuildHistogram()
                    .Name("flashcp_worker_attention_backward_duration_seconds")
                    .Help("Attention backward pass per step: device=cpu, wall time with its "
                          "collectives; device=cuda, device time of the attention kernels only")
                    .Labels(ConstLabels(labels))
                    .Register(registry)),
      comm_(prometheus::BuildHistogram()
                .Name("flashcp_worker_comm_duration_seconds")
                .Help("Time inside KV and gradient collectives per step (waiting for peers "
                      "included)")
                .Labels(ConstLabels(labels))
                .Register(registry)),
      plan_wait_(prometheus::BuildHistogram()
                     .Name("flashcp_worker_plan_wait_duration_seconds")
                     .Help("Time a step waited for its plan")
                     .Labels(ConstLabels(labels))
                     .Register(registry)),
      bytes_sent_(prometheus::BuildCounter()
                      .Name("flashcp_worker_bytes_sent_total")
                      .Help("KV and gradient payload bytes this rank sent")
                      .Labels(ConstLabels(labels))
                      .Register(registry)),
      bytes_received_(prometheus::BuildCounter()
                          .Name("flashcp_worker_bytes_received_total")
                          .Help("KV and gradient payload bytes this rank received")
                          .Labels(ConstLabels(labels))
                          .Register(registry)),
      full_kv_(prometheus::BuildCounter()
                   .Name("flashcp_worker_full_kv_bytes_total")
                   .Help("Bytes this rank would have sent under a full-KV all-gather for the "
                         "same steps")
                   .Labels(ConstLabels(labels))
                   .Register(registry)),
      steps_(prometheus::BuildCounter()
                 .Name("flashcp_worker_steps_total")
                 .Help("Training steps completed")
                 .Labels(ConstLabels(labels))
                 .Register(registry)),
      attention_(prometheus::BuildCounter()
                     .Name("flashcp_worker_attention_seconds_total")
                     .Help("Attention compute seconds of this rank, what its group's measured "
                           "imbalance compares: device=cpu, forward + backward minus time in "
                           "collectives; device=cuda, device time of the attention kernels")
                     .Labels(ConstLabels(labels))
                     .Register(registry)),
      predicted_sent_(prometheus::BuildCounter()
                          .Name("flashcp_worker_predicted_bytes_sent_total")
                          .Help("Bytes the plans predicted this rank sends under the scheme run, "
                                "for the same steps as flashcp_worker_bytes_sent_total")
                          .Labels(ConstLabels(labels))
                          .Register(registry)),
      predicted_workload_(prometheus::BuildCounter()
                              .Name("flashcp_worker_predicted_workload_pairs_total")
                              .Help("Attention (query, key) pairs the plans gave this rank "
                                    "(SPEC Eq. 3), for the same steps as "
                                    "flashcp_worker_attention_seconds_total")
                              .Labels(ConstLabels(labels))
                              .Register(registry)),
      predicted_cost_(prometheus::BuildCounter()
                          .Name("flashcp_worker_predicted_cost_total")
                          .Help("Attention cost the plans predicted for this rank under their "
                                "cost profile (seconds for a measured profile, pairs for "
                                "`pairs`), for the same steps as "
                                "flashcp_worker_attention_seconds_total")
                          .Labels(ConstLabels(labels))
                          .Register(registry)),
      time_ratio_(prometheus::BuildGauge()
                      .Name("flashcp_worker_attention_time_ratio")
                      .Help("This rank's attention compute time over its group's mean, last step")
                      .Labels(ConstLabels(labels))
                      .Register(registry)),
      predicted_imbalance_(prometheus::BuildGauge()
                               .Name("flashcp_worker_predicted_imbalance_ratio")
                               .Help("The planner's imbalance ratio (max/mean workload) of the "
                                     "plan of the last step")
                               .Labels(ConstLabels(labels))
                               .Register(registry)),
      world_size_(prometheus::BuildGauge()
                      .Name("flashcp_worker_world_size")
                      .Help("Ranks in this rank's CP group (--world_size)")
                      .Labels(ConstLabels(labels))
                      .Register(registry)
                      .Add({})) {
  prometheus::BuildGauge()
      .Name("flashcp_worker_build_info")
      .Help("flashcp-worker build; always 1")
      .Labels(ConstLabels(labels))
      .Register(registry)
      .Add({{"version", version}})
      .Set(1);
}

void WorkerMetrics::SetWorldSize(int32_t ranks) { world_size_.Set(ranks); }

void WorkerMetrics::Prepare(const std::string& strategy, const std::string& scheme) {
  const prometheus::Labels l = {{"strategy", strategy}, {"scheme", scheme}};
  const auto buckets = DurationBuckets();
  for (auto* h : {&step_, &forward_, &backward_, &comm_, &plan_wait_}) h->Add(l, buckets);
  for (auto* c : {&bytes_sent_, &bytes_received_, &full_kv_, &steps_, &attention_,
                  &predicted_sent_, &predicted_workload_, &predicted_cost_}) {
    c->Add(l);
  }
}

void WorkerMetrics::Record(const std::string& strategy, const std::string& scheme,
                           const StepRecord& r) {
  const prometheus::Labels l = {{"strategy", strategy}, {"scheme", scheme}};
  const auto buckets = DurationBuckets();
  step_.Add(l, buckets).Observe(r.step_seconds);
  forward_.Add(l, buckets).Observe(r.forward_seconds);
  backward_.Add(l, buckets).Observe(r.backward_seconds);
  comm_.Add(l, buckets).Observe(r.comm_seconds);
  plan_wait_.Add(l, buckets).Observe(r.plan_wait_seconds);
  bytes_sent_.Add(l).Increment(static_cast<double>(r.bytes_sent));
  bytes_received_.Add(l).Increment(static_cast<double>(r.bytes_received));
  full_kv_.Add(l).Increment(static_cast<double>(r.full_kv_bytes_sent));
  steps_.Add(l).Increment();
  attention_.Add(l).Increment(r.attention_seconds);
  predicted_sent_.Add(l).Increment(static_cast<double>(r.predicted_bytes_sent));
  predicted_workload_.Add(l).Increment(r.predicted_workload);
  predicted_cost_.Add(l).Increment(r.predicted_cost);
  time_ratio_.Add({{"strategy", strategy}}).Set(r.attention_time_ratio);
  predicted_imbalance_.Add({{"strategy", strategy}}).Set(r.predicted_imbalance);
}

// ---- PlanFeed ------------------------------------------------------------------

PlanFeed::PlanFeed(std::shared_ptr<client::PlannerClient> planner, Config config,
                   const core::WaitClock* clock)
    : planner_(std::move(planner)), config_(std::move(config)), clock_(*clock) {
  {
    absl::MutexLock lock(&mu_);
    waiting_since_ = clock_.Now();
  }
  thread_ = std::thread([this] { Loop(); });
  watchdog_ = std::thread([this] { Watch(); });
}

PlanFeed::~PlanFeed() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // Unblocks a PlanPipelined waiting on a planner that never answers.
  canceller_.Cancel();
  watchdog_.join();
  thread_.join();
}

absl::StatusOr<std::optional<v1::PlanResponse>> PlanFeed::Next(absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  clock_.AwaitWithTimeout(mu_,
                          absl::Condition(
                              +[](std::deque<absl::StatusOr<v1::PlanResponse>>* q) {
                                return !q->empty();
                              },
                              &ready_),
                          wait);
  if (ready_.empty()) return std::optional<v1::PlanResponse>();
  // Taking from a full queue restarts the watchdog's clock (see waiting_since_).
  if (Full()) waiting_since_ = clock_.Now();
  absl::StatusOr<v1::PlanResponse> r = std::move(ready_.front());
  ready_.pop_front();
  if (!r.ok()) return r.status();
  return std::optional<v1::PlanResponse>(*std::move(r));
}

void PlanFeed::Watch() {
  bool fire = false;
  {
    absl::MutexLock lock(&mu_);
    while (!stop_ && !loop_done_) {
      if (Full()) {  // the driver is behind: nothing to time
        mu_.Await(absl::Condition(
            +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
              return f->stop_ || f->loop_done_ || !f->Full();
            },
            this));
        continue;
      }
      const absl::Time deadline = waiting_since_ + config_.timeout;
      if (clock_.Now() >= deadline) {
        timed_out_ = true;
        fire = true;
        break;
      }
      // Wakes early on stop; a new plan only moves the deadline, which the
      // next pass sees.
      clock_.AwaitWithDeadline(mu_,
                               absl::Condition(
                                   +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
                                     return f->stop_ || f->loop_done_ || f->Full();
                                   },
                                   this),
                               deadline);
    }
  }
  // Outside mu_: cancelling wakes the Loop thread, whose sink takes mu_.
  if (fire) canceller_.Cancel();
}

void PlanFeed::Loop() {
  int64_t delivered = 0;
  core::Backoff backoff;  // 100 ms doubling to 1 s
  const auto push = [this](absl::StatusOr<v1::PlanResponse> r) {
    absl::MutexLock lock(&mu_);
    ready_.push_back(std::move(r));
  };
  // Wakes the watchdog when this returns, whichever way.
  struct Done {
    PlanFeed* f;
    ~Done() {
      absl::MutexLock lock(&f->mu_);
      f->loop_done_ = true;
    }
  } done{this};
  // Ends the loop: stopped, or the watchdog gave up (then UNAVAILABLE is
  // delivered, with the stream's last status).
  const auto finished = [&](const absl::Status& last) {
    absl::MutexLock lock(&mu_);
    if (stop_) return true;
    if (!timed_out_) return false;
    ready_.push_back(absl::UnavailableError(
        absl::StrCat("plan stream: no plan for ", absl::FormatDuration(config_.timeout),
                     "; last error: ", last.ToString())));
    return true;
  };
  absl::StatusOr<core::Strategy> strategy = core::ParseStrategy(config_.strategy);
  if (!strategy.ok()) {
    push(strategy.status());
    return;
  }
  core::PlanOptions plan_options;
  if (config_.target_imbalance > 0) plan_options.target_imbalance = config_.target_imbalance;
  const core::ModelShape shape{config_.heads, config_.head_dim, config_.dtype_bytes};
  absl::Status last = absl::OkStatus();
  while (delivered < config_.count && !finished(last)) {
    int64_t next = delivered;
    absl::Status source_error;
    const auto source = [&]() -> std::optional<v1::PlanRequest> {
      if (next >= config_.count || !source_error.ok()) return std::nullopt;
      absl::StatusOr<std::vector<int64_t>> lens = core::SampleBatch(
          config_.dataset, config_.context, config_.seed, config_.first_batch + next);
      if (!lens.ok()) {
        source_error = lens.status();
        return std::nullopt;
      }
      core::Batch batch{*std::move(lens), config_.cp_size};
      ++next;
      return proto::RequestToProto(0, batch, *strategy, plan_options, shape, false,
                                   config_.cost_profile);
    };
    const auto sink = [&](int64_t, client::PlanResult r) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
            return f->stop_ || !f->Full();
          },
          this));
      if (stop_) return;
      // PlanPipelined already turned a per-item `error` into r's status.
      ready_.push_back(std::move(r));
      ++delivered;
      waiting_since_ = clock_.Now();
    };
    client::PipelineOptions options;
    options.inflight = config_.prefetch;
    // No stream deadline: the watchdog (`timeout` without a plan) and the
    // destructor end a stream through canceller_, whatever its length.
    options.call.timeout = absl::InfiniteDuration();
    options.canceller = &canceller_;
    const absl::Status s = client::PlanPipelined(*planner_, options, source, sink);
    if (!source_error.ok()) {
      push(source_error);
      return;
    }
    if (s.ok()) return;
    last = s;
    if (finished(last)) return;
    const bool retryable = s.code() == absl::StatusCode::kUnavailable ||
                           s.code() == absl::StatusCode::kCancelled ||
                           s.code() == absl::StatusCode::kAborted;
    if (!retryable) {
      push(absl::Status(s.code(), absl::StrCat("plan stream: ", s.message())));
      return;
    }
    const absl::Duration wait = backoff.Next();
    FLASHCP_LOG(WARNING) << "plan stream broke after " << delivered << " plans (" << s.ToString()
                         << "); reconnecting in " << absl::FormatDuration(wait);
    absl::MutexLock lock(&mu_);
    clock_.AwaitWithTimeout(mu_,
                            absl::Condition(
                                +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
                                  return f->stop_ || f->timed_out_;
                                },
                                this),
                            wait);
  }
}

// ---- WorkerDaemon -----------------------------------------------------------------

WorkerDaemon::WorkerDaemon(DaemonOptions options,
                           std::shared_ptr<v1::Rendezvous::StubInterface> rendezvous,
                           std::shared_ptr<client::PlannerClient> planner,
                           std::unique_ptr<RankBackend> backend, WorkerMetrics* metrics,
                           const core::WaitClock* clock)
    : options_(std::move(options)),
      rendezvous_(std::move(rendezvous)),
      planner_(std::move(planner)),
      backend_(std::move(backend)),
      metrics_(metrics),
      clock_(*clock) {
  status_.set_state(v1::WorkerStatus::IDLE);
  status_.set_group(options_.group);
  status_.set_rank(options_.rank);
  status_.set_world_size(options_.world_size);
  status_.set_device(options_.device);
  status_.set_strategy(options_.strategy);
  status_.set_scheme(std::string(core::CommSchemeName(options_.scheme)));
  if (options_.rank == 0 && options_.steps > 0) {
    pending_run_ = RunConfig{options_.steps, options_.strategy, options_.scheme};
  }
}

void WorkerDaemon::SetState(v1::WorkerStatus::State state) {
  absl::MutexLock lock(&mu_);
  status_.set_state(state);
}

v1::WorkerStatus WorkerDaemon::Status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void WorkerDaemon::RequestExit() {
  absl::MutexLock lock(&mu_);
  exit_wanted_ = true;
}

absl::Status WorkerDaemon::StartRun(int64_t steps, const std::string& strategy,
                                    const std::string& scheme) {
  if (options_.rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.rank, " is not the driver; send StartRun to rank 0 of group ",
        options_.group));
  }
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("steps: must be >= 1, got ", steps));
  }
  absl::MutexLock lock(&mu_);
  RunConfig run{steps, strategy.empty() ? status_.strategy() : strategy, options_.scheme};
  if (!core::ParseStrategy(run.strategy).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("strategy: unknown \"", run.strategy, "\""));
  }
  FLASHCP_ASSIGN_OR_RETURN(run.scheme,
                           core::ParseCommScheme(scheme.empty() ? status_.scheme() : scheme));
  if (pending_run_.has_value() || status_.state() == v1::WorkerStatus::RUNNING ||
      status_.state() == v1::WorkerStatus::STOPPING) {
    return absl::FailedPreconditionError("a run is already going; StopRun first");
  }
  if (status_.state() == v1::WorkerStatus::FAILED) {
    return absl::FailedPreconditionError(absl::StrCat("the worker failed: ", status_.error()));
  }
  pending_run_ = run;
  return absl::OkStatus();
}

absl::Status WorkerDaemon::StopRun() {
  if (options_.rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.rank, " is not the driver; send StopRun to rank 0 of group ",
        options_.group));
  }
  absl::MutexLock lock(&mu_);
  pending_run_.reset();
  if (status_.state() == v1::WorkerStatus::RUNNING) {
    stop_run_wanted_ = true;
    status_.set_state(v1::WorkerStatus::STOPPING);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> WorkerDaemon::FormGroup(RendezvousClient& rdv) {
  // The planner may come up after the workers (a pod restart): retry an
  // unreachable planner until the timeout, with backoff.
  const absl::Time join_deadline = clock_.Now() + options_.timeout;
  core::Backoff backoff;  // 100 ms doubling to 1 s
  absl::Duration wait = backoff.Next();
  absl::StatusOr<int32_t> joined = rdv.Join(options_.world_size);
  while (joined.status().code() == absl::StatusCode::kUnavailable &&
         clock_.Now() + wait < join_deadline) {
    clock_.SleepFor(wait);  // between attempts, bounded by the deadline
    wait = backoff.Next();
    joined = rdv.Join(options_.world_size);
  }
  FLASHCP_ASSIGN_OR_RETURN(const int32_t world_size, std::move(joined));
  absl::StatusOr<std::vector<int32_t>> members = rdv.AwaitMembers(options_.timeout);
  if (!members.ok()) {
    (void)rdv.Leave();
    return members.status();
  }
  GrpcStore store(&rdv, options_.timeout);
  GlooOptions gloo;
  gloo.hostname = options_.gloo_hostname;
  gloo.timeout = options_.timeout;
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      ConnectGloo(store, options_.rank, world_size, gloo);
  // The backend's own transport (NCCL) joins through the same store.
  absl::Status s = comm.status();
  if (s.ok()) s = backend_->Connect(store, options_.rank, world_size, options_.timeout);
  if (!s.ok()) {
    // The store's own failure keeps the rendezvous service's exact code.
    if (!store.first_error().ok()) s = store.first_error();
    (void)rdv.Abort(std::string(s.message()));
    (void)rdv.Leave();
    return s;
  }
  return comm;
}

absl::Status WorkerDaemon::Run() {
  FLASHCP_RETURN_IF_ERROR(ValidateDaemonOptions(options_));
  if (backend_ == nullptr) return absl::FailedPreconditionError("the daemon has no rank backend");
  metrics_->Prepare(options_.strategy, std::string(core::CommSchemeName(options_.scheme)));
  SetState(v1::WorkerStatus::FORMING_GROUP);
  RendezvousClient rdv(rendezvous_, options_.group, options_.rank, options_.incarnation);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = FormGroup(rdv);
  absl::Status s = comm.status();
  if (s.ok()) {
    FLASHCP_LOG(INFO) << "rank " << options_.rank << " of " << options_.world_size << ": group "
                      << options_.group << " formed";
    SetState(v1::WorkerStatus::IDLE);
    s = Loop(**comm);
    if (!s.ok()) s = AbortGroup(rdv, s);  // the service prefixes the reason with "rank R: "
    (void)rdv.Leave();
  }
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    status_.set_state(v1::WorkerStatus::FAILED);
    status_.set_error(s.ToString());
  } else {
    status_.set_state(v1::WorkerStatus::IDLE);
  }
  return s;
}

absl::Status WorkerDaemon::Heartbeat(Communicator& comm, bool* stop_anywhere) {
  RankReport mine;
  {
    absl::MutexLock lock(&mu_);
    mine.stop = exit_wanted_ ? 1 : 0;
  }
  std::vector<RankReport> all(comm.size());
  const std::vector<int64_t> counts(comm.size(), sizeof(RankReport));
  FLASHCP_RETURN_IF_ERROR(comm.AllGatherV(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(&mine), sizeof(mine)),
      absl::MakeSpan(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(RankReport)),
      counts));
  for (const RankReport& r : all) *stop_anywhere |= r.stop != 0;
  return absl::OkStatus();
}

namespace {

// The time the calibration fits: every rank's thread CPU time where all
// ranks measured it (one kernel thread each), else wall attention time.
bool UseCpuSeconds(const std::vector<RankReport>& all) {
  return std::all_of(all.begin(), all.end(),
                     [](const RankReport& r) { return r.attention_cpu_seconds > 0; });
}

double MinSeconds(const std::vector<RankReport>& all) {
  const bool cpu = UseCpuSeconds(all);
  double m = std::numeric_limits<double>::infinity();
  for (const RankReport& r : all) {
    m = std::min(m, cpu ? r.attention_cpu_seconds : r.attention_seconds);
  }
  return all.empty() ? 0.0 : m;
}

// The ranks' CPU attention seconds; empty where not all measured.
std::vector<double> CpuSeconds(const std::vector<RankReport>& all) {
  std::vector<double> t;
  if (all.empty() || !UseCpuSeconds(all)) return t;
  for (const RankReport& r : all) t.push_back(r.attention_cpu_seconds);
  return t;
}

// Adds per-rank values into per-rank sums (a window's totals).
void AddPerRank(std::vector<double>& sums, absl::Span<const double> v) {
  if (sums.size() < v.size()) sums.resize(v.size(), 0.0);
  for (size_t i = 0; i < v.size(); ++i) sums[i] += v[i];
}

// max / mean of a window's per-rank sums; 0 for an empty window (nothing
// measured), as the per-step CPU figures are.
double Windowed(const std::vector<double>& sums) {
  return sums.empty() ? 0.0 : core::MaxOverMean(sums);
}

}  // namespace

bool WorkerDaemon::Reports() const {
  return !options_.cost_profile.empty() && options_.cost_profile != core::kPairsProfile;
}

// Telemetry: a report the planner refuses or never answers is logged and
// dropped (the run goes on); it is not retried (ReportStepTimes is not
// idempotent).
void WorkerDaemon::FlushReport(int32_t cp_size) {
  absl::StatusOr<v1::ReportStepTimesResponse> r = planner_->ReportStepTimes(
      proto::StepTimesToProto(options_.cost_profile, cp_size, pending_report_),
      client::CallOptions{.timeout = absl::Seconds(5)});
  if (!r.ok()) {
    FLASHCP_LOG(WARNING) << "ReportStepTimes (" << pending_report_.size()
                         << " rank-steps) failed: " << r.status();
  } else if (options_.progress_every > 0) {
    FLASHCP_LOG(INFO) << "cost profile " << options_.cost_profile << ": "
                      << r->profile_samples() << " samples, "
                      << (r->calibrated() ? absl::StrFormat("calibrated, fit error %.2f%%",
                                                            100 * r->fit_mean_abs_rel_error())
                                          : absl::StrCat("not calibrated: ", r->fit_status()));
  }
  pending_report_.clear();
}

absl::Status WorkerDaemon::Step(Communicator& comm, const v1::PlanResponse& response,
                                core::CommScheme scheme, int64_t batch, double plan_wait_seconds,
                                absl::Time start, bool* stop_anywhere) {
  FLASHCP_ASSIGN_OR_RETURN(const proto::PlanResult plan, proto::ResponseFromProto(response));
  if (plan.plan.cp_size != comm.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan for ", plan.plan.cp_size,
                                                   " ranks in a group of ", comm.size()));
  }
  FLASHCP_ASSIGN_OR_RETURN(const StepMeasurement m,
                           backend_->Run(plan.plan, scheme,
                                         options_.seed ^ (uint64_t(batch) << 20), comm));

  StepRecord r;
  r.plan_wait_seconds = plan_wait_seconds;
  r.forward_seconds = m.forward_seconds;
  r.backward_seconds = m.backward_seconds;
  r.comm_seconds = m.comm_seconds;
  r.bytes_sent = m.bytes_sent;
  r.bytes_received = m.bytes_received;
  // ResponseFromProto guarantees cp_size (= comm.size()) entries or none (a
  // scheme the server did not send); anything else is refused here too, so
  // indexing by rank never reads past the list.
  const auto& full = plan.metrics.bytes[static_cast<int>(core::CommScheme::kFullKv)];
  const auto& predicted = plan.metrics.bytes[static_cast<int>(scheme)];
  for (const auto* sent : {&full.sent, &predicted.sent}) {
    if (!sent->empty() && static_cast<int64_t>(sent->size()) != comm.size()) {
      return absl::InvalidArgumentError(absl::StrCat("plan metrics: ", sent->size(),
                                                     " sent_bytes entries for ", comm.size(),
                                                     " ranks"));
    }
  }
  r.full_kv_bytes_sent = full.sent.empty() ? 0 : full.sent[comm.rank()];
  r.predicted_bytes_sent = predicted.sent.empty() ? 0 : predicted.sent[comm.rank()];
  r.predicted_imbalance = plan.metrics.imbalance;
  // ResponseFromProto checks rank_workload has cp_size entries (or none).
  r.predicted_workload = plan.metrics.rank_workload.empty()
                             ? 0.0
                             : plan.metrics.rank_workload[comm.rank()];
  // ResponseFromProto checks rank_predicted_cost has cp_size entries (or none).
  r.predicted_cost = plan.cost.prediction.rank_cost.empty()
                         ? 0.0
                         : plan.cost.prediction.rank_cost[comm.rank()];
  r.attention_seconds = m.attention_seconds;
  if (!predicted.sent.empty() && predicted.sent[comm.rank()] != r.bytes_sent) {
    FLASHCP_LOG(WARNING) << "rank " << comm.rank() << " batch " << batch << ": sent "
                         << r.bytes_sent << " bytes, the plan predicts "
                         << predicted.sent[comm.rank()];
  }

  // Everyone's attention compute time (and stop wishes) to everyone.
  RankReport mine;
  mine.attention_seconds = m.attention_seconds;
  mine.attention_cpu_seconds = m.attention_cpu_seconds;
  {
    absl::MutexLock lock(&mu_);
    mine.stop = exit_wanted_ ? 1 : 0;
  }
  std::vector<RankReport> all(comm.size());
  const std::vector<int64_t> counts(comm.size(), sizeof(RankReport));
  FLASHCP_RETURN_IF_ERROR(comm.AllGatherV(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(&mine), sizeof(mine)),
      absl::MakeSpan(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(RankReport)),
      counts));
  double sum = 0, max = 0;
  for (const RankReport& x : all) {
    sum += x.attention_seconds;
    max = std::max(max, x.attention_seconds);
    *stop_anywhere |= x.stop != 0;
  }
  const double mean = sum / comm.size();
  r.attention_time_ratio = mean > 0 ? mine.attention_seconds / mean : 1.0;
  r.step_seconds = absl::ToDoubleSeconds(clock_.Now() - start);

  const std::string scheme_name(core::CommSchemeName(scheme));
  metrics_->Record(plan.strategy, scheme_name, r);
  summary_.steps += 1;
  summary_.step_seconds += r.step_seconds;
  summary_.attention_seconds += m.forward_seconds + m.backward_seconds;
  summary_.comm_seconds += r.comm_seconds;
  summary_.plan_wait_seconds += r.plan_wait_seconds;
  summary_.measured_imbalance += mean > 0 ? max / mean : 1.0;
  summary_.predicted_imbalance += r.predicted_imbalance;
  // The cost model: the plan's prediction against this step's measurement,
  // split by calibration; the driver queues the step for the planner's fit.
  const std::vector<double> cpu = CpuSeconds(all);
  const double cpu_imbalance = cpu.empty() ? 0.0 : core::MaxOverMean(cpu);
  summary_.measured_cpu_imbalance += cpu_imbalance;
  // Windows count only steps where every rank measured CPU time, so the
  // measured and predicted sums cover the same steps.
  if (!cpu.empty()) {
    AddPerRank(summary_.rank_cpu, cpu);
    AddPerRank(summary_.rank_pairs, plan.metrics.rank_workload);
  }
  if (!plan.cost.prediction.rank_cost.empty()) {
    const int c = plan.cost.calibrated ? 1 : 0;
    summary_.predicted_cost_imbalance += plan.cost.prediction.imbalance;
    summary_.cost_steps[c] += 1;
    summary_.cost_measured[c] += mean > 0 ? max / mean : 1.0;
    summary_.cost_measured_cpu[c] += cpu_imbalance;
    summary_.cost_predicted[c] += plan.cost.prediction.imbalance;
    if (!cpu.empty()) {
      AddPerRank(summary_.cost_rank_cpu[c], cpu);
      AddPerRank(summary_.cost_rank_predicted[c], plan.cost.prediction.rank_cost);
    }
    if (c == 1 && summary_.first_calibrated_step < 0) {
      summary_.first_calibrated_step = summary_.steps - 1;
    }
  }
  if (comm.rank() == 0 && Reports() && MinSeconds(all) > 0) {
    const std::vector<core::RankFeatures> f = core::PlanRankFeatures(plan.plan);
    const bool cpu = UseCpuSeconds(all);
    for (size_t i = 0; i < all.size(); ++i) {
      pending_report_.push_back(
          {f[i], cpu ? all[i].attention_cpu_seconds : all[i].attention_seconds});
    }
    if (static_cast<int64_t>(pending_report_.size()) >=
        int64_t{options_.report_every} * comm.size()) {
      FlushReport(comm.size());
    }
  }
  const auto& sent = plan.metrics.bytes[static_cast<int>(scheme)].sent;
  for (const int64_t b : sent) summary_.bytes_sent += b;
  for (const int64_t b : full.sent) summary_.full_kv_bytes += b;
  absl::MutexLock lock(&mu_);
  status_.set_steps_done(status_.steps_done() + 1);
  status_.set_last_step_seconds(r.step_seconds);
  return absl::OkStatus();
}

absl::Status WorkerDaemon::Loop(Communicator& comm) {
  const bool driver = comm.rank() == 0;
  const absl::Duration heartbeat = std::min(absl::Seconds(1), options_.timeout / 4);
  std::unique_ptr<PlanFeed> feed;
  std::optional<RunConfig> run;  // driver: the run going
  int64_t done = 0;
  absl::Time last_end = clock_.Now();
  const auto finish_run = [&] {
    const int64_t n = std::max<int64_t>(1, summary_.steps);
    if (!pending_report_.empty()) FlushReport(comm.size());
    const auto mean_of = [](double sum, int64_t k) { return k > 0 ? sum / k : 0.0; };
    const std::string cost = absl::StrFormat(
        ",\"measured_cpu_imbalance\":%.4f,\"cost_profile\":\"%s\","
        "\"predicted_cost_imbalance\":%.4f,\"calibrated_steps\":%d,"
        "\"first_calibrated_step\":%d,"
        "\"windowed\":{\"measured_cpu\":%.4f,\"predicted\":%.4f},"
        "\"uncalibrated\":{\"measured\":%.4f,\"measured_cpu\":%.4f,\"predicted\":%.4f,"
        "\"windowed_measured_cpu\":%.4f,\"windowed_predicted\":%.4f},"
        "\"calibrated\":{\"measured\":%.4f,\"measured_cpu\":%.4f,\"predicted\":%.4f,"
        "\"windowed_measured_cpu\":%.4f,\"windowed_predicted\":%.4f}",
        summary_.measured_cpu_imbalance / n,
        options_.cost_profile.empty() ? std::string(core::kPairsProfile) : options_.cost_profile,
        summary_.predicted_cost_imbalance / n, summary_.cost_steps[1],
        summary_.first_calibrated_step, Windowed(summary_.rank_cpu),
        Windowed(summary_.rank_pairs), mean_of(summary_.cost_measured[0], summary_.cost_steps[0]),
        mean_of(summary_.cost_measured_cpu[0], summary_.cost_steps[0]),
        mean_of(summary_.cost_predicted[0], summary_.cost_steps[0]),
        Windowed(summary_.cost_rank_cpu[0]), Windowed(summary_.cost_rank_predicted[0]),
        mean_of(summary_.cost_measured[1], summary_.cost_steps[1]),
        mean_of(summary_.cost_measured_cpu[1], summary_.cost_steps[1]),
        mean_of(summary_.cost_predicted[1], summary_.cost_steps[1]),
        Windowed(summary_.cost_rank_cpu[1]), Windowed(summary_.cost_rank_predicted[1]));
    const std::string line = SummaryLine(
        run->strategy, std::string(core::CommSchemeName(run->scheme)), summary_.steps,
        summary_.step_seconds / n, summary_.attention_seconds / n, summary_.comm_seconds / n,
        summary_.plan_wait_seconds / n, summary_.measured_imbalance / n,
        summary_.predicted_imbalance / n, summary_.bytes_sent, summary_.full_kv_bytes, cost);
    std::fprintf(stdout, "%s\n", line.c_str());
    std::fflush(stdout);
    feed.reset();
    run.reset();
  };
  for (;;) {
    StepHeader h;
    std::string payload;
    if (driver) {
      bool stop_run = false;
      {
        absl::MutexLock lock(&mu_);
        if (!run.has_value() && pending_run_.has_value()) {
          run = *pending_run_;
          pending_run_.reset();
          stop_run_wanted_ = false;
          done = 0;
          summary_ = {};
          status_.set_state(v1::WorkerStatus::RUNNING);
          status_.set_steps_done(0);
          status_.set_steps_total(run->steps);
          status_.set_strategy(run->strategy);
          status_.set_scheme(std::string(core::CommSchemeName(run->scheme)));
          metrics_->Prepare(run->strategy, status_.scheme());
          PlanFeed::Config c;
          c.dataset = options_.dataset;
          c.context = options_.context;
          c.cp_size = comm.size();
          c.strategy = run->strategy;
          c.target_imbalance = options_.target_imbalance;
          c.heads = options_.heads;
          c.head_dim = options_.head_dim;
          c.dtype_bytes = backend_->dtype_bytes();
          c.seed = options_.seed;
          c.first_batch = next_batch_;
          c.count = run->steps;
          c.prefetch = options_.prefetch;
          c.timeout = options_.timeout;
          c.cost_profile = options_.cost_profile;
          // Before the feed starts: its first plan's wait is all plan wait.
          last_end = clock_.Now();
          feed = std::make_unique<PlanFeed>(planner_, c, &clock_);
        }
        stop_run = stop_run_wanted_;
      }
      if (run.has_value() && (done == run->steps || stop_run)) {
        finish_run();
        const bool linger = options_.linger || options_.steps == 0;
        absl::MutexLock lock(&mu_);
        status_.set_state(v1::WorkerStatus::IDLE);
        if (!linger) h.kind = static_cast<uint32_t>(Kind::kExit);
      }
      if (h.kind == 0 && run.has_value()) {
        FLASHCP_ASSIGN_OR_RETURN(std::optional<v1::PlanResponse> plan, feed->Next(heartbeat));
        if (plan.has_value()) {
          h.kind = static_cast<uint32_t>(Kind::kStep);
          h.scheme = static_cast<uint32_t>(run->scheme);
          h.batch = next_batch_++;
          h.steps_total = run->steps;
          std::snprintf(h.strategy, sizeof(h.strategy), "%s", run->strategy.c_str());
          payload = plan->SerializeAsString();
          h.payload_bytes = static_cast<int64_t>(payload.size());
        } else {
          h.kind = static_cast<uint32_t>(Kind::kWaiting);
        }
      } else if (h.kind == 0) {
        absl::MutexLock lock(&mu_);
        clock_.AwaitWithTimeout(mu_,
                                absl::Condition(
                                    +[](WorkerDaemon* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
                                      return d->pending_run_.has_value() || d->exit_wanted_;
                                    },
                                    this),
                                heartbeat);
        h.kind = static_cast<uint32_t>(Kind::kIdle);
      }
    }
    FLASHCP_RETURN_IF_ERROR(Broadcast(comm, reinterpret_cast<std::byte*>(&h), sizeof(h)));
    const Kind kind = static_cast<Kind>(h.kind);
    if (kind == Kind::kExit) return absl::OkStatus();
    if (kind == Kind::kStep) {
      if (h.payload_bytes < 0 || h.payload_bytes > (int64_t{1} << 30) || h.scheme > 2) {
        return absl::DataLossError(absl::StrCat("bad step header from the driver: payload ",
                                                h.payload_bytes, " bytes, scheme ", h.scheme));
      }
      payload.resize(static_cast<size_t>(h.payload_bytes));
      FLASHCP_RETURN_IF_ERROR(
          Broadcast(comm, reinterpret_cast<std::byte*>(payload.data()), h.payload_bytes));
      v1::PlanResponse response;
      if (!response.ParseFromString(payload)) {
        return absl::DataLossError("the driver's plan does not parse");
      }
      const auto scheme = static_cast<core::CommScheme>(h.scheme);
      if (!driver) {
        absl::MutexLock lock(&mu_);
        if (status_.state() != v1::WorkerStatus::RUNNING ||
            status_.strategy() != response.strategy() ||
            status_.scheme() != core::CommSchemeName(scheme)) {
          status_.set_state(v1::WorkerStatus::RUNNING);
          status_.set_steps_done(0);
          status_.set_strategy(response.strategy());
          status_.set_scheme(std::string(core::CommSchemeName(scheme)));
          summary_ = {};
        }
        status_.set_steps_total(h.steps_total);
      }
      const absl::Time header_at = clock_.Now();
      bool stop_anywhere = false;
      FLASHCP_RETURN_IF_ERROR(Step(comm, response, scheme, h.batch,
                                   absl::ToDoubleSeconds(header_at - last_end), last_end,
                                   &stop_anywhere));
      last_end = clock_.Now();
      ++done;
      if (driver && options_.progress_every > 0 &&
          (done % options_.progress_every == 0 || done == run->steps)) {
        FLASHCP_LOG(INFO) << "group " << options_.group << " " << run->strategy << "/"
                          << core::CommSchemeName(run->scheme) << ": step " << done << "/"
                          << run->steps << " (" << absl::StrFormat("%.3f", summary_.step_seconds / done)
                          << " s/step)";
      }
      if (stop_anywhere) {
        if (driver && run.has_value()) finish_run();
        return absl::OkStatus();
      }
      continue;
    }
    if (kind != Kind::kIdle && kind != Kind::kWaiting) {
      return absl::DataLossError(absl::StrCat("bad step header kind ", h.kind));
    }
    if (!driver && kind == Kind::kIdle) {
      absl::MutexLock lock(&mu_);
      if (status_.state() == v1::WorkerStatus::RUNNING) status_.set_state(v1::WorkerStatus::IDLE);
    }
    bool stop_anywhere = false;
    FLASHCP_RETURN_IF_ERROR(Heartbeat(comm, &stop_anywhere));
    if (kind == Kind::kIdle) last_end = clock_.Now();
    if (stop_anywhere) {
      if (driver && run.has_value()) finish_run();
      return absl::OkStatus();
    }
  }
}

std::string SummaryLine(const std::string& strategy, const std::string& scheme, int64_t steps,
                        double mean_step_s, double mean_attention_s, double mean_comm_s,
                        double mean_plan_wait_s, double measured_imbalance,
                        double predicted_imbalance, int64_t bytes_sent, int64_t full_kv_bytes,
                        absl::string_view extra_json) {
  return absl::StrFormat(
      "RUN {\"strategy\":\"%s\",\"scheme\":\"%s\",\"steps\":%d,\"step_seconds\":%.6f,"
      "\"attention_seconds\":%.6f,\"comm_seconds\":%.6f,\"plan_wait_seconds\":%.6f,"
      "\"measured_imbalance\":%.4f,\"predicted_imbalance\":%.4f,\"bytes_sent\":%d,"
      "\"full_kv_bytes\":%d%s}",
      strategy, scheme, steps, mean_step_s, mean_attention_s, mean_comm_s, mean_plan_wait_s,
      measured_imbalance, predicted_imbalance, bytes_sent, full_kv_bytes, extra_json);
}

// ---- WorkerControl --------------------------------------------------------------

grpc::Status WorkerControlService::GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                                             v1::WorkerStatus* response) {
  *response = daemon_->Status();
  return grpc::Status::OK;
}

grpc::Status WorkerControlService::StartRun(grpc::ServerContext*,
                                            const v1::StartRunRequest* request,
                                            v1::StartRunResponse*) {
  return proto::ToGrpcStatus(
      daemon_->StartRun(request->steps(), request->strategy(), request->scheme()));
}

grpc::Status WorkerControlService::StopRun(grpc::ServerContext*, const v1::StopRunRequest*,
                                           v1::StopRunResponse*) {
  return proto::ToGrpcStatus(daemon_->StopRun());
}

}  // namespace flashcp::worker
