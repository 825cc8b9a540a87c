#include "worker/daemon.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "core/backoff.h"
#include "core/cost_model.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "core/strategies.h"
#include "proto/convert.h"
#include "worker/gloo_communicator.h"

namespace flashcp::worker {
// ---- group failure -------------------------------------------------------------

absl::Status AbortGroup(RendezvousClient& rdv, const absl::Status& raw, absl::Duration wait) {
  const absl::Status failure = TraceGroupFailure(rdv, raw, wait);
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

// ---- WorkerDaemon -----------------------------------------------------------------

WorkerDaemon::WorkerDaemon(DaemonOptions options,
                           std::shared_ptr<v1::Rendezvous::StubInterface> rendezvous,
                           std::shared_ptr<client::PlannerClient> planner,
                           std::unique_ptr<RankBackend> backend, WorkerObserver* observer,
                           const core::WaitClock* clock)
    : options_(std::move(options)),
      rendezvous_(std::move(rendezvous)),
      planner_(std::move(planner)),
      backend_(std::move(backend)),
      observer_(*observer),
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
  FLASHCP_RETURN_IF_ERROR(core::ParseStrategy(run.strategy).status());  // quotes it short
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
  absl::StatusOr<std::vector<int32_t>> members =
      AwaitGroup(rdv, world_size, clock_.Now() + options_.timeout, clock_);
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
  observer_.OnRunStart(options_.strategy, core::CommSchemeName(options_.scheme));
  SetState(v1::WorkerStatus::FORMING_GROUP);
  observer_.OnGroupEvent(WorkerObserver::GroupEvent::kForming, absl::OkStatus());
  RendezvousClient rdv(rendezvous_, options_.group, options_.rank, options_.incarnation,
                       options_.job_secret);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = FormGroup(rdv);
  absl::Status s = comm.status();
  if (s.ok()) {
    FLASHCP_LOG(INFO) << "rank " << options_.rank << " of " << options_.world_size << ": group "
                      << options_.group << " formed";
    SetState(v1::WorkerStatus::IDLE);
    observer_.OnGroupEvent(WorkerObserver::GroupEvent::kFormed, absl::OkStatus());
    // Before any step sizes a message from this rank's flags.
    s = AgreeOnShape(**comm, GroupShape{options_.context, options_.heads, options_.head_dim,
                                        backend_->dtype_bytes()});
    if (s.ok()) s = Loop(**comm);
    // Report before *comm (destroyed below) closes its pairs: a peer failing
    // on that closure then finds this rank's failure published. A peer this
    // rank timed out on gets one more timeout to publish its own.
    if (!s.ok()) s = AbortGroup(rdv, s, options_.timeout);
    (void)rdv.Leave();
  }
  observer_.OnGroupEvent(
      s.ok() ? WorkerObserver::GroupEvent::kEnded : WorkerObserver::GroupEvent::kFailed, s);
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    status_.set_state(v1::WorkerStatus::FAILED);
    status_.set_error(s.ToString());
  } else {
    status_.set_state(v1::WorkerStatus::IDLE);
  }
  return s;
}

absl::Status WorkerDaemon::Loop(Communicator& comm) {
  const bool driver = comm.rank() == 0;
  last_end_ = clock_.Now();
  for (;;) {
    StepHeader header;
    std::string payload;
    if (driver) FLASHCP_RETURN_IF_ERROR(DriverRound(comm.size(), header, payload));
    FLASHCP_RETURN_IF_ERROR(BroadcastRound(comm, header, payload));
    if (header.kind == RoundKind::kExit) return absl::OkStatus();
    absl::StatusOr<bool> stop = header.kind == RoundKind::kStep
                                    ? StepRound(comm, header, payload)
                                    : HeartbeatRound(comm, header);
    FLASHCP_RETURN_IF_ERROR(stop.status());
    if (*stop) {
      if (run_.has_value()) FinishRun(comm.size());
      return absl::OkStatus();
    }
  }
}

absl::Status WorkerDaemon::DriverRound(int32_t cp_size, StepHeader& header,
                                       std::string& payload) {
  bool stop_run = false;
  {
    absl::MutexLock lock(&mu_);
    if (!run_.has_value() && pending_run_.has_value()) {
      const RunConfig config = *pending_run_;
      pending_run_.reset();
      stop_run_wanted_ = false;
      summary_ = {};
      status_.clear_error();  // a failed run's
      status_.set_state(v1::WorkerStatus::RUNNING);
      status_.set_steps_done(0);
      status_.set_steps_total(config.steps);
      status_.set_strategy(config.strategy);
      status_.set_scheme(std::string(core::CommSchemeName(config.scheme)));
      observer_.OnRunStart(config.strategy, status_.scheme());
      const PlanFeed::Config c{.dataset = options_.dataset,
                               .context = options_.context,
                               .cp_size = cp_size,
                               .strategy = config.strategy,
                               .attention_mask = options_.attention_mask,
                               .target_imbalance = options_.target_imbalance,
                               .heads = options_.heads,
                               .head_dim = options_.head_dim,
                               .dtype_bytes = backend_->dtype_bytes(),
                               .seed = options_.seed,
                               .first_batch = next_batch_,
                               .count = config.steps,
                               .prefetch = options_.prefetch,
                               .timeout = options_.timeout,
                               .cost_profile = options_.cost_profile,
                               .rank_speed = [this] {
                                 absl::MutexLock lock(&speed_mu_);
                                 return rank_speed_;
                               },
                               .cluster = options_.cluster};
      // Before the feed starts: its first plan's wait is all plan wait.
      last_end_ = clock_.Now();
      run_ = DriverRun{config, std::make_unique<PlanFeed>(planner_, c, &clock_), 0};
    }
    stop_run = stop_run_wanted_;
  }
  if (run_.has_value() && (run_->done == run_->config.steps || stop_run)) {
    FinishRun(cp_size);
    absl::MutexLock lock(&mu_);
    status_.set_state(v1::WorkerStatus::IDLE);
    if (!options_.linger && options_.steps != 0) {
      header.kind = RoundKind::kExit;
      return absl::OkStatus();
    }
  }
  if (run_.has_value()) {
    absl::StatusOr<std::optional<v1::PlanResponse>> next = run_->feed->Next(HeartbeatInterval());
    if (!next.ok()) {
      // A plan the planner refused (a per-item error) or could not give
      // (the feed's timeout): that run fails; the group stays, for the next
      // StartRun, or ends as after any run where it was started for one.
      const absl::Status failure(
          next.status().code(),
          absl::StrCat("run failed after ", run_->done, " of ", run_->config.steps,
                       " steps: ", next.status().message()));
      FLASHCP_LOG(ERROR) << "group " << options_.group << ": " << failure;
      FinishRun(cp_size);
      {
        absl::MutexLock lock(&mu_);
        status_.set_state(v1::WorkerStatus::IDLE);
        status_.set_error(failure.ToString());
      }
      header.kind = !options_.linger && options_.steps != 0 ? RoundKind::kExit : RoundKind::kIdle;
      return absl::OkStatus();
    }
    std::optional<v1::PlanResponse>& plan = *next;
    if (!plan.has_value()) {
      header.kind = RoundKind::kWaiting;
      return absl::OkStatus();
    }
    header.kind = RoundKind::kStep;
    FLASHCP_ASSIGN_OR_RETURN(header.strategy, core::ParseStrategy(run_->config.strategy));
    header.scheme = run_->config.scheme;
    header.batch = next_batch_++;
    header.steps_total = run_->config.steps;
    payload = plan->SerializeAsString();
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  clock_.AwaitWithTimeout(mu_,
                          absl::Condition(
                              +[](WorkerDaemon* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
                                return d->pending_run_.has_value() || d->exit_wanted_;
                              },
                              this),
                          HeartbeatInterval());
  header.kind = RoundKind::kIdle;
  return absl::OkStatus();
}

absl::Duration WorkerDaemon::HeartbeatInterval() const {
  return std::min(absl::Seconds(1), options_.timeout / 4);
}

void WorkerDaemon::FollowStep(const StepHeader& header) {
  const absl::string_view strategy = core::StrategyName(header.strategy);
  const absl::string_view scheme = core::CommSchemeName(header.scheme);
  absl::MutexLock lock(&mu_);
  if (status_.state() != v1::WorkerStatus::RUNNING || status_.strategy() != strategy ||
      status_.scheme() != scheme) {
    status_.set_state(v1::WorkerStatus::RUNNING);
    status_.set_steps_done(0);
    status_.set_strategy(std::string(strategy));
    status_.set_scheme(std::string(scheme));
    summary_ = {};
  }
  status_.set_steps_total(header.steps_total);
}

absl::StatusOr<bool> WorkerDaemon::StepRound(Communicator& comm, const StepHeader& header,
                                             const std::string& payload) {
  v1::PlanResponse response;
  if (!response.ParseFromString(payload)) {
    return absl::DataLossError("the driver's plan does not parse");
  }
  if (comm.rank() != 0) FollowStep(header);
  const absl::Time header_at = clock_.Now();
  FLASHCP_ASSIGN_OR_RETURN(const bool stop,
                           Step(comm, response, header,
                                absl::ToDoubleSeconds(header_at - last_end_)));
  last_end_ = clock_.Now();
  if (run_.has_value()) {  // the driver
    const int64_t done = ++run_->done;
    if (options_.progress_every > 0 &&
        (done % options_.progress_every == 0 || done == run_->config.steps)) {
      FLASHCP_LOG(INFO) << "group " << options_.group << " " << run_->config.strategy << "/"
                        << core::CommSchemeName(run_->config.scheme) << ": step " << done << "/"
                        << run_->config.steps << " ("
                        << absl::StrFormat("%.3f", summary_.step_seconds / done) << " s/step)";
    }
  }
  return stop;
}

absl::StatusOr<bool> WorkerDaemon::HeartbeatRound(Communicator& comm, const StepHeader& header) {
  if (comm.rank() != 0 && header.kind == RoundKind::kIdle) {
    absl::MutexLock lock(&mu_);
    if (status_.state() == v1::WorkerStatus::RUNNING) status_.set_state(v1::WorkerStatus::IDLE);
  }
  FLASHCP_ASSIGN_OR_RETURN(const std::vector<RankReport> all, Gather(comm, RankReport{}));
  if (header.kind == RoundKind::kIdle) last_end_ = clock_.Now();
  return SummarizeReports(all).stop;
}

absl::StatusOr<std::vector<RankReport>> WorkerDaemon::Gather(Communicator& comm,
                                                             RankReport mine) {
  {
    absl::MutexLock lock(&mu_);
    mine.stop = exit_wanted_;
  }
  return GatherReports(comm, mine);
}

bool WorkerDaemon::Reports() const {
  return !options_.cost_profile.empty() && options_.cost_profile != core::kPairsProfile;
}

absl::StatusOr<bool> WorkerDaemon::Step(Communicator& comm, const v1::PlanResponse& response,
                                        const StepHeader& header, double plan_wait_seconds) {
  const absl::Time start = last_end_;
  const core::CommScheme scheme = header.scheme;
  FLASHCP_ASSIGN_OR_RETURN(const proto::PlanResult plan, proto::ResponseFromProto(response));
  if (plan.plan.cp_size != comm.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan for ", plan.plan.cp_size,
                                                   " ranks in a group of ", comm.size()));
  }
  FLASHCP_ASSIGN_OR_RETURN(
      const StepMeasurement m,
      backend_->Run(plan.plan, scheme, options_.seed ^ (uint64_t(header.batch) << 20), comm));

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
  r.predicted_step_seconds = response.metrics().predicted_step_seconds();
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
    FLASHCP_LOG(WARNING) << "rank " << comm.rank() << " batch " << header.batch << ": sent "
                         << r.bytes_sent << " bytes, the plan predicts "
                         << predicted.sent[comm.rank()];
  }

  // Everyone's attention compute time (and stop wishes) to everyone.
  FLASHCP_ASSIGN_OR_RETURN(const std::vector<RankReport> all,
                           Gather(comm, {m.attention_seconds, m.attention_cpu_seconds, false}));
  const GroupTimes group = SummarizeReports(all);
  r.attention_time_ratio =
      group.mean_attention_seconds > 0 ? m.attention_seconds / group.mean_attention_seconds : 1.0;
  r.step_seconds = absl::ToDoubleSeconds(clock_.Now() - start);
  observer_.OnStep(plan.strategy, core::CommSchemeName(scheme), r);
  Account(plan, scheme, all, group, r, m);
  absl::MutexLock lock(&mu_);
  status_.set_steps_done(status_.steps_done() + 1);
  status_.set_last_step_seconds(r.step_seconds);
  return group.stop;
}

}  // namespace flashcp::worker
