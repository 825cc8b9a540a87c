#include "planner_service/metrics.h"

#include <algorithm>
#include <string>

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

const prometheus::Histogram::BucketBoundaries& PrometheusMetrics::PhaseBuckets() {
  // Fine below 1 (sharding-aware plans at small N), then doubling to full KV at N = 256.
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5, 2, 3, 4, 8, 16, 32, 64, 128, 256};
  return *b;
}

absl::string_view PrometheusMetrics::EventName(Event event) {
  switch (event) {
    case Event::kJoin: return "join";
    case Event::kFormed: return "formed";
    case Event::kAbort: return "abort";
    case Event::kReform: return "reform";
    case Event::kExpired: return "expired";
  }
  return "unknown";
}

namespace {

// One family each, registered in `registry` under `name` with `help`.
prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}
prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& registry,
                                                           const char* name, const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}
// A family with its one unlabelled gauge.
prometheus::Gauge& UnlabelledGauge(prometheus::Registry& registry, const char* name,
                                   const char* help) {
  return GaugeFamily(registry, name, help).Add({});
}

}  // namespace

PrometheusMetrics::PrometheusMetrics(prometheus::Registry& registry, absl::string_view version)
    : requests_(CounterFamily(registry, "flashcp_planner_requests_total",
          "Requests answered, by method and gRPC status code; a PlanStream "
          "item counts as one request")),
      request_duration_(HistogramFamily(registry, "flashcp_planner_request_duration_seconds",
          "Seconds from receiving a request (or stream item) to "
          "answering it, by method")),
      planning_duration_(HistogramFamily(registry, "flashcp_planner_planning_duration_seconds",
          "Seconds spent planning and analysing one batch, by strategy")),
      inflight_(UnlabelledGauge(registry, "flashcp_planner_inflight_requests",
          "Requests and stream items received and not yet answered")),
      queue_depth_(UnlabelledGauge(registry, "flashcp_planner_queue_depth",
          "Planning jobs waiting for a planning thread")),
      queue_capacity_(UnlabelledGauge(registry, "flashcp_planner_queue_capacity",
          "Planning jobs the queue holds before refusing with "
          "RESOURCE_EXHAUSTED (--queue_size)")),
      stream_held_bytes_(UnlabelledGauge(registry, "flashcp_planner_stream_held_bytes",
          "Response bytes PlanStreams hold unread by their clients, "
          "reserved at each item's bound until it is planned "
          "(bounded by --stream_buffer_bytes)")),
      imbalance_(HistogramFamily(registry, "flashcp_planner_plan_imbalance_ratio",
          "Predicted imbalance (max / mean attention workload) of the plans "
          "served, by strategy and cp_size")),
      comm_saving_(HistogramFamily(registry, "flashcp_planner_plan_comm_saving_ratio",
          "Predicted saving of the plans served against a full-KV "
          "all-gather, by strategy, cp_size and scheme: allgather, 1 - max "
          "non-last tokens / (C/N); targeted, 1 - its phase bottleneck / "
          "the full-KV phase bottleneck")),
      phase_bottleneck_(HistogramFamily(registry, "flashcp_planner_plan_phase_bottleneck_ratio",
          "Predicted tokens the busiest rank sends (direction=send) or "
          "receives (direction=receive) in one phase, over C/N, by "
          "strategy, scheme (allgather, targeted) and cp_size; full KV "
          "is N - 1")),
      rendezvous_groups_(UnlabelledGauge(registry, "flashcp_planner_rendezvous_groups",
          "Rendezvous groups held (forming, formed or aborted)")),
      rendezvous_members_(UnlabelledGauge(registry, "flashcp_planner_rendezvous_members",
          "Members of all rendezvous groups")),
      rendezvous_events_(CounterFamily(registry, "flashcp_planner_rendezvous_events_total",
          "Rendezvous events: join (a member joined or replaced one), "
          "formed (a group became complete the first time), abort, "
          "reform (an aborted group restarted by a new incarnation), "
          "expired (an idle group dropped)")) {
  for (const Event e : {Event::kJoin, Event::kFormed, Event::kAbort, Event::kReform,
                        Event::kExpired}) {
    rendezvous_events_.Add({{"event", std::string(EventName(e))}});  // at 0 from the start
  }
  GaugeFamily(registry, "flashcp_planner_build_info",
          "Always 1; the version label names the planner's build")
      .Add({{"version", std::string(version)}})
      .Set(1);
  cost_coefficient_ = &GaugeFamily(registry, "flashcp_planner_cost_coefficient",
          "Cost model coefficient a profile's plans use once calibrated, "
          "seconds per unit of the term (whole_pair, prefixed_pair, "
          "sequence, token)");
  cost_samples_ = &GaugeFamily(registry, "flashcp_planner_cost_samples",
          "Rank-step samples in a profile's calibration window; windows "
          "are per tenant: this and the fit gauges show the tenant "
          "refitted last");
  cost_reported_ = &CounterFamily(registry, "flashcp_planner_cost_reported_samples_total",
          "Rank-step samples accepted by ReportStepTimes, by profile, all tenants");
  cost_fit_error_ = &GaugeFamily(registry, "flashcp_planner_cost_fit_error_ratio",
          "Mean |predicted - measured| / measured rank time of the "
          "profile's fit in use, over its inliers");
  cost_calibrated_ = &GaugeFamily(registry, "flashcp_planner_cost_calibrated",
          "1 once a profile's plans use its online fit");
}

void PrometheusMetrics::OnRequestDone(absl::string_view method, absl::StatusCode code,
                                      double seconds) {
  prometheus::Counter* requests = nullptr;
  prometheus::Histogram* duration = nullptr;
  {
    absl::MutexLock lock(&series_mu_);
    auto it = method_series_.find(method);
    if (it == method_series_.end()) {
      it = method_series_.emplace(std::string(method), MethodSeries{}).first;
      it->second.duration =
          &request_duration_.Add({{"method", it->first}}, LatencyBuckets());
    }
    prometheus::Counter*& counter = it->second.requests[static_cast<int>(code)];
    // gRPC's code names ("OK", "INVALID_ARGUMENT", ...), as absl spells them.
    if (counter == nullptr) {
      counter = &requests_.Add({{"method", it->first}, {"code", absl::StatusCodeToString(code)}});
    }
    requests = counter;
    duration = it->second.duration;
  }
  requests->Increment();
  duration->Observe(seconds);
}

void PrometheusMetrics::OnInflightChange(int delta) { inflight_.Increment(delta); }

void PrometheusMetrics::OnQueueDepth(int64_t depth) {
  queue_depth_.Set(static_cast<double>(depth));
}

void PrometheusMetrics::SetQueueCapacity(int64_t jobs) {
  queue_capacity_.Set(static_cast<double>(jobs));
}

void PrometheusMetrics::OnRendezvousEvent(Event event) {
  rendezvous_events_.Add({{"event", std::string(EventName(event))}}).Increment();
}

void PrometheusMetrics::OnRendezvousSize(int64_t groups, int64_t members) {
  rendezvous_groups_.Set(static_cast<double>(groups));
  rendezvous_members_.Set(static_cast<double>(members));
}

void PrometheusMetrics::OnStreamHeldBytes(int64_t bytes) {
  stream_held_bytes_.Set(static_cast<double>(bytes));
}

const PrometheusMetrics::PlanSeries& PrometheusMetrics::PlanSeriesFor(core::Strategy strategy,
                                                                    int64_t cp_size) {
  absl::MutexLock lock(&series_mu_);
  std::unique_ptr<PlanSeries>& series =
      plan_series_[std::make_pair(static_cast<int>(strategy), cp_size)];
  if (series != nullptr) return *series;
  series = std::make_unique<PlanSeries>();
  const std::string s(core::StrategyName(strategy));
  const std::string n = std::to_string(cp_size);
  series->duration = &planning_duration_.Add({{"strategy", s}, {"cp_size", n}}, LatencyBuckets());
  series->imbalance = &imbalance_.Add({{"strategy", s}, {"cp_size", n}}, ImbalanceBuckets());
  for (const core::CommScheme scheme :
       {core::CommScheme::kAllGather, core::CommScheme::kTargeted}) {
    const int i = scheme == core::CommScheme::kAllGather ? 0 : 1;
    const std::string name(core::CommSchemeName(scheme));
    series->saving[i] =
        &comm_saving_.Add({{"strategy", s}, {"scheme", name}, {"cp_size", n}}, SavingBuckets());
    series->sent[i] = &phase_bottleneck_.Add(
        {{"strategy", s}, {"scheme", name}, {"cp_size", n}, {"direction", "send"}},
        PhaseBuckets());
    series->received[i] = &phase_bottleneck_.Add(
        {{"strategy", s}, {"scheme", name}, {"cp_size", n}, {"direction", "receive"}},
        PhaseBuckets());
  }
  return *series;
}

void PrometheusMetrics::OnPlanned(core::Strategy strategy, double planning_seconds,
                                  const core::PlanMetrics& metrics) {
  // One workload per rank: its count is the plan's cp_size.
  const PlanSeries& series =
      PlanSeriesFor(strategy, static_cast<int64_t>(metrics.rank_workload.size()));
  series.duration->Observe(planning_seconds);
  series.imbalance->Observe(metrics.imbalance);
  const double per_rank = static_cast<double>(std::max<int64_t>(1, metrics.tokens_per_rank));
  for (const core::CommScheme scheme :
       {core::CommScheme::kAllGather, core::CommScheme::kTargeted}) {
    const int i = scheme == core::CommScheme::kAllGather ? 0 : 1;
    series.saving[i]->Observe(scheme == core::CommScheme::kAllGather ? metrics.comm_saving
                                                                     : metrics.targeted_saving);
    const core::PhaseTraffic& phase = metrics.bytes[static_cast<int>(scheme)].phase;
    series.sent[i]->Observe(static_cast<double>(phase.max_sent_tokens) / per_rank);
    series.received[i]->Observe(static_cast<double>(phase.max_received_tokens) / per_rank);
  }
}

void PrometheusMetrics::OnCalibration(absl::string_view profile, int64_t accepted,
                                      const core::CostCalibrator::State& state) {
  const std::string p(profile);
  absl::MutexLock lock(&cost_mu_);
  cost_samples_->Add({{"profile", p}}).Set(static_cast<double>(state.samples));
  cost_reported_->Add({{"profile", p}}).Increment(static_cast<double>(accepted));
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
