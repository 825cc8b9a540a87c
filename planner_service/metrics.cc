#include "planner_service/metrics.h"

#include "core/analysis.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace flashcp::planner_service {

const prometheus::Histogram::BucketBoundaries& PrometheusMetrics::LatencyBuckets() {
  // 50 us (a small unary plan on loopback) to 60 s (the ILP's time limit and more).
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025,
      0.05,    0.1,    0.25,    0.5,    1,     2.5,   5,     10,   30,    60};
  return *b;
}

const prometheus::Histogram::BucketBoundaries& PrometheusMetrics::ImbalanceBuckets() {
  // max/mean workload: 1.0 is perfect; finer near the usual targets (1.02..1.1).
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      1.0, 1.005, 1.01, 1.02, 1.03, 1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0};
  return *b;
}

const prometheus::Histogram::BucketBoundaries& PrometheusMetrics::SavingBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  return *b;
}

PrometheusMetrics::PrometheusMetrics(prometheus::Registry& registry, absl::string_view version)
    : requests_(prometheus::BuildCounter()
                    .Name("flashcp_planner_requests_total")
                    .Help("Requests answered, by method and gRPC status code; a PlanStream "
                          "item counts as one request")
                    .Register(registry)),
      request_duration_(prometheus::BuildHistogram()
                            .Name("flashcp_planner_request_duration_seconds")
                            .Help("Seconds from receiving a request (or stream item) to "
                                  "answering it, by method")
                            .Register(registry)),
      planning_duration_(prometheus::BuildHistogram()
                             .Name("flashcp_planner_planning_duration_seconds")
                             .Help("Seconds spent planning and analysing one batch, by strategy")
                             .Register(registry)),
      inflight_(prometheus::BuildGauge()
                    .Name("flashcp_planner_inflight_requests")
                    .Help("Requests and stream items received and not yet answered")
                    .Register(registry)
                    .Add({})),
      queue_depth_(prometheus::BuildGauge()
                       .Name("flashcp_planner_queue_depth")
                       .Help("Planning jobs waiting for a planning thread")
                       .Register(registry)
                       .Add({})),
      stream_held_bytes_(prometheus::BuildGauge()
                             .Name("flashcp_planner_stream_held_bytes")
                             .Help("Response bytes PlanStreams hold unread by their clients, "
                                   "reserved at each item's bound until it is planned "
                                   "(bounded by --stream_buffer_bytes)")
                             .Register(registry)
                             .Add({})),
      imbalance_(prometheus::BuildHistogram()
                     .Name("flashcp_planner_plan_imbalance_ratio")
                     .Help("Predicted imbalance (max / mean attention workload) of the plans "
                           "served, by strategy")
                     .Register(registry)),
      comm_saving_(prometheus::BuildHistogram()
                       .Name("flashcp_planner_plan_comm_saving_ratio")
                       .Help("Predicted communication saving against a full-KV all-gather of "
                             "the plans served, by strategy and scheme")
                       .Register(registry)) {
  prometheus::BuildGauge()
      .Name("flashcp_planner_build_info")
      .Help("Always 1; the version label names the planner's build")
      .Register(registry)
      .Add({{"version", std::string(version)}})
      .Set(1);
  cost_coefficient_ = &prometheus::BuildGauge()
                           .Name("flashcp_planner_cost_coefficient")
                           .Help("Cost model coefficient a profile's plans use once calibrated, "
                                 "seconds per unit of the term (whole_pair, prefixed_pair, "
                                 "sequence, token)")
                           .Register(registry);
  cost_samples_ = &prometheus::BuildGauge()
                       .Name("flashcp_planner_cost_samples")
                       .Help("Rank-step samples in a profile's calibration window")
                       .Register(registry);
  cost_reported_ = &prometheus::BuildCounter()
                        .Name("flashcp_planner_cost_reported_samples_total")
                        .Help("Rank-step samples accepted by ReportStepTimes, by profile")
                        .Register(registry);
  cost_fit_error_ = &prometheus::BuildGauge()
                         .Name("flashcp_planner_cost_fit_error_ratio")
                         .Help("Mean |predicted - measured| / measured rank time of the "
                               "profile's fit in use, over its inliers")
                         .Register(registry);
  cost_calibrated_ = &prometheus::BuildGauge()
                          .Name("flashcp_planner_cost_calibrated")
                          .Help("1 once a profile's plans use its online fit")
                          .Register(registry);
}

void PrometheusMetrics::OnRequestDone(absl::string_view method, absl::StatusCode code,
                                      double seconds) {
  const std::string m(method);
  // gRPC's code names ("OK", "INVALID_ARGUMENT", ...), as absl spells them.
  requests_.Add({{"method", m}, {"code", absl::StatusCodeToString(code)}}).Increment();
  request_duration_.Add({{"method", m}}, LatencyBuckets()).Observe(seconds);
}

void PrometheusMetrics::OnInflightChange(int delta) { inflight_.Increment(delta); }

void PrometheusMetrics::OnQueueDepth(int64_t depth) {
  queue_depth_.Set(static_cast<double>(depth));
}

void PrometheusMetrics::OnStreamHeldBytes(int64_t bytes) {
  stream_held_bytes_.Set(static_cast<double>(bytes));
}

void PrometheusMetrics::OnPlanned(core::Strategy strategy, double planning_seconds,
                                  const core::PlanMetrics& metrics) {
  const std::string s(core::StrategyName(strategy));
  planning_duration_.Add({{"strategy", s}}, LatencyBuckets()).Observe(planning_seconds);
  imbalance_.Add({{"strategy", s}}, ImbalanceBuckets()).Observe(metrics.imbalance);
  comm_saving_
      .Add({{"strategy", s}, {"scheme", std::string(core::CommSchemeName(
                                            core::CommScheme::kAllGather))}},
           SavingBuckets())
      .Observe(metrics.comm_saving);
  comm_saving_
      .Add({{"strategy", s},
            {"scheme", std::string(core::CommSchemeName(core::CommScheme::kTargeted))}},
           SavingBuckets())
      .Observe(metrics.targeted_saving);
}

void PrometheusMetrics::OnCalibration(absl::string_view profile,
                                      const core::CostCalibrator::State& state) {
  const std::string p(profile);
  absl::MutexLock lock(&cost_mu_);
  cost_samples_->Add({{"profile", p}}).Set(static_cast<double>(state.samples));
  prometheus::Counter& reported = cost_reported_->Add({{"profile", p}});
  reported.Increment(static_cast<double>(state.total) - reported.Value());
  cost_calibrated_->Add({{"profile", p}}).Set(state.calibrated ? 1 : 0);
  if (!state.calibrated) return;
  const core::CostCoefficients& c = state.fit.coefficients;
  cost_coefficient_->Add({{"profile", p}, {"term", "whole_pair"}}).Set(c.whole_pair);
  cost_coefficient_->Add({{"profile", p}, {"term", "prefixed_pair"}}).Set(c.prefixed_pair);
  cost_coefficient_->Add({{"profile", p}, {"term", "sequence"}}).Set(c.sequence);
  cost_coefficient_->Add({{"profile", p}, {"term", "token"}}).Set(c.token);
  cost_fit_error_->Add({{"profile", p}}).Set(state.fit.mean_abs_rel_error);
}

}  // namespace flashcp::planner_service
