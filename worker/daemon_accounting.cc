// WorkerDaemon's measurements (daemon.h): each step's accounting, the rank
// speeds, the calibration reports to the planner, the run's summary line.
// The step loop and its rounds are in daemon.cc.
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
                                          : absl::StrCat("not calibrated: ", r->fit_status()))
                      << (r->calibrated() && !r->fit_status().empty()
                              ? absl::StrCat(" (the last refit: ", r->fit_status(), ")")
                              : "");
  }
  pending_report_.clear();
}

namespace {

// The ranks' CPU attention seconds; empty where not all measured.
std::vector<double> CpuSeconds(const std::vector<RankReport>& all, const GroupTimes& group) {
  std::vector<double> t;
  if (!group.use_cpu_seconds) return t;
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

void WorkerDaemon::Account(const proto::PlanResult& plan, core::CommScheme scheme,
                           const std::vector<RankReport>& all, const GroupTimes& group,
                           const StepRecord& r, const StepMeasurement& m) {
  summary_.steps += 1;
  summary_.step_seconds += r.step_seconds;
  summary_.attention_seconds += m.forward_seconds + m.backward_seconds;
  summary_.comm_seconds += r.comm_seconds;
  summary_.plan_wait_seconds += r.plan_wait_seconds;
  summary_.measured_imbalance += group.measured_imbalance;
  summary_.predicted_imbalance += r.predicted_imbalance;
  // The cost model: the plan's prediction against this step's measurement,
  // split by calibration; the driver queues the step for the planner's fit.
  summary_.measured_cpu_imbalance += group.cpu_imbalance;
  // Windows count only steps where every rank measured CPU time, so the
  // measured and predicted sums cover the same steps.
  const std::vector<double> cpu = CpuSeconds(all, group);
  if (!cpu.empty()) {
    AddPerRank(summary_.rank_cpu, cpu);
    AddPerRank(summary_.rank_pairs, plan.metrics.rank_workload);
  }
  if (!plan.cost.prediction.rank_cost.empty()) {
    const int c = !plan.cost.calibrated ? 0 : plan.cost.prediction.rank_speed.empty() ? 1 : 2;
    summary_.predicted_cost_imbalance += plan.cost.prediction.imbalance;
    summary_.cost_steps[c] += 1;
    summary_.cost_measured[c] += group.measured_imbalance;
    summary_.cost_measured_cpu[c] += group.cpu_imbalance;
    summary_.cost_predicted[c] += plan.cost.prediction.imbalance;
    if (!cpu.empty()) {
      AddPerRank(summary_.cost_rank_cpu[c], cpu);
      AddPerRank(summary_.cost_rank_predicted[c], plan.cost.prediction.rank_cost);
    }
    if (c >= 1 && summary_.first_calibrated_step < 0) {
      summary_.first_calibrated_step = summary_.steps - 1;
    }
    if (c == 2 && summary_.first_speed_step < 0) summary_.first_speed_step = summary_.steps - 1;
    if (run_.has_value() /* the driver */ && plan.cost.calibrated && !cpu.empty()) {
      UpdateRankSpeeds(plan, cpu);
    }
  }
  const int32_t cp_size = static_cast<int32_t>(all.size());
  if (run_.has_value() /* the driver */ && Reports() && group.min_fit_seconds > 0) {
    const std::vector<core::RankFeatures> f = core::PlanRankFeatures(plan.plan);
    for (size_t i = 0; i < all.size(); ++i) {
      pending_report_.push_back(
          {f[i], group.use_cpu_seconds ? all[i].attention_cpu_seconds : all[i].attention_seconds});
    }
    if (static_cast<int64_t>(pending_report_.size()) >= int64_t{options_.report_every} * cp_size) {
      FlushReport(cp_size);
    }
  }
  for (const int64_t b : plan.metrics.bytes[static_cast<int>(scheme)].sent) {
    summary_.bytes_sent += b;
  }
  for (const int64_t b : plan.metrics.bytes[static_cast<int>(core::CommScheme::kFullKv)].sent) {
    summary_.full_kv_bytes += b;
  }
}

// Rank speeds: measured over predicted CPU seconds per rank over the window,
// all its steps' costs under the newest plan's coefficients (the planner's
// latest fit), so that a refit changes them at once.
void WorkerDaemon::UpdateRankSpeeds(const proto::PlanResult& plan, const std::vector<double>& cpu) {
  const int32_t window = options_.rank_speed_window;
  if (window < 1) return;
  speed_window_.push_back({core::PlanRankFeatures(plan.plan), cpu});
  while (static_cast<int32_t>(speed_window_.size()) > window) speed_window_.pop_front();
  if (2 * static_cast<int32_t>(speed_window_.size()) < window) return;
  std::vector<std::vector<double>> measured, predicted;
  for (const SpeedStep& s : speed_window_) {
    measured.push_back(s.seconds);
    predicted.push_back(core::PredictCost(plan.cost.coefficients, s.features).rank_cost);
  }
  std::vector<double> speeds = core::FitRankSpeeds(measured, predicted);
  absl::MutexLock lock(&speed_mu_);
  rank_speed_ = std::move(speeds);
}

std::vector<double> WorkerDaemon::LastRankSpeeds() {
  absl::MutexLock lock(&speed_mu_);
  return rank_speed_;
}

void WorkerDaemon::FinishRun(int32_t cp_size) {
  const int64_t n = std::max<int64_t>(1, summary_.steps);
  if (!pending_report_.empty()) FlushReport(cp_size);
  const auto mean_of = [](double sum, int64_t k) { return k > 0 ? sum / k : 0.0; };
  // One phase's figures (Summary::kPhases).
  const auto phase = [&](int c) {
    return absl::StrFormat(
        "{\"steps\":%d,\"measured\":%.4f,\"measured_cpu\":%.4f,\"predicted\":%.4f,"
        "\"windowed_measured_cpu\":%.4f,\"windowed_predicted\":%.4f}",
        summary_.cost_steps[c], mean_of(summary_.cost_measured[c], summary_.cost_steps[c]),
        mean_of(summary_.cost_measured_cpu[c], summary_.cost_steps[c]),
        mean_of(summary_.cost_predicted[c], summary_.cost_steps[c]),
        Windowed(summary_.cost_rank_cpu[c]), Windowed(summary_.cost_rank_predicted[c]));
  };
  const std::string cost = absl::StrFormat(
      ",\"measured_cpu_imbalance\":%.4f,\"cost_profile\":\"%s\","
      "\"predicted_cost_imbalance\":%.4f,\"calibrated_steps\":%d,"
      "\"first_calibrated_step\":%d,\"speed_steps\":%d,\"first_speed_step\":%d,"
      "\"rank_speed\":[%s],"
      "\"windowed\":{\"measured_cpu\":%.4f,\"predicted\":%.4f},"
      "\"uncalibrated\":%s,\"calibrated\":%s,\"speed_adjusted\":%s",
      summary_.measured_cpu_imbalance / n,
      options_.cost_profile.empty() ? std::string(core::kPairsProfile) : options_.cost_profile,
      summary_.predicted_cost_imbalance / n, summary_.cost_steps[1] + summary_.cost_steps[2],
      summary_.first_calibrated_step, summary_.cost_steps[2], summary_.first_speed_step,
      absl::StrJoin(LastRankSpeeds(), ",",
                    [](std::string* out, double v) { absl::StrAppendFormat(out, "%.4f", v); }),
      Windowed(summary_.rank_cpu), Windowed(summary_.rank_pairs), phase(0), phase(1), phase(2));
  const RunConfig& run = run_->config;
  const std::string line = SummaryLine(
      run.strategy, std::string(core::CommSchemeName(run.scheme)), summary_.steps,
      summary_.step_seconds / n, summary_.attention_seconds / n, summary_.comm_seconds / n,
      summary_.plan_wait_seconds / n, summary_.measured_imbalance / n,
      summary_.predicted_imbalance / n, summary_.bytes_sent, summary_.full_kv_bytes, cost);
  observer_.OnRunEnd(line);
  run_.reset();
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

}  // namespace flashcp::worker
