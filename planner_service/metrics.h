// Prometheus metrics for the planner service: a ServiceObserver and
// RendezvousObserver that records into a registry made by main (STYLE item 9).
// Names are a stable interface: deploy/prometheus rules and the Grafana
// dashboards use them verbatim (docs/deploy.md, "Metrics and labels", says what
// each means).
//   flashcp_planner_requests_total{method,code}                         counter
//   flashcp_planner_request_duration_seconds{method}                    histogram
//   flashcp_planner_planning_duration_seconds{strategy,cp_size}         histogram
//   flashcp_planner_inflight_requests                                   gauge
//   flashcp_planner_queue_depth                                         gauge
//   flashcp_planner_queue_capacity                                      gauge
//   flashcp_planner_stream_held_bytes                                   gauge
//   flashcp_planner_plan_imbalance_ratio{strategy,cp_size}              histogram
//   flashcp_planner_plan_comm_saving_ratio{strategy,scheme,cp_size}     histogram
//   flashcp_planner_plan_phase_bottleneck_ratio{strategy,scheme,cp_size,direction}
//                                                                       histogram
//   flashcp_planner_rendezvous_groups                                   gauge
//   flashcp_planner_rendezvous_members                                  gauge
//   flashcp_planner_rendezvous_events_total{event}                      counter
//   flashcp_planner_build_info{version}                                 gauge, always 1
//   flashcp_planner_cost_coefficient{profile,term}                      gauge, the fit in use
//   flashcp_planner_cost_samples{profile}                               gauge, in the window
//   flashcp_planner_cost_reported_samples_total{profile}                counter
//   flashcp_planner_cost_fit_error_ratio{profile}                       gauge, mean |rel. error|
//   flashcp_planner_cost_calibrated{profile}                            gauge, 1 once a fit is used
// A PlanStream item counts as one request of method "PlanStream". cp_size is
// the plan's N, so plans for 8 and 32 ranks are never averaged together.
#ifndef FLASHCP_PLANNER_SERVICE_METRICS_H_
#define FLASHCP_PLANNER_SERVICE_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "planner_service/observer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace flashcp::planner_service {

class PrometheusMetrics final : public ServiceObserver, public RendezvousObserver {
 public:
  // Registers every family in `registry`, which must outlive this object.
  PrometheusMetrics(prometheus::Registry& registry, absl::string_view version);

  // The planning pool's queue bound (--queue_size), for the saturation alert.
  void SetQueueCapacity(int64_t jobs);

  void OnRequestDone(absl::string_view method, absl::StatusCode code, double seconds) override;
  void OnInflightChange(int delta) override;
  void OnQueueDepth(int64_t depth) override;
  void OnStreamHeldBytes(int64_t bytes) override;
  void OnPlanned(core::Strategy strategy, double planning_seconds,
                 const core::PlanMetrics& metrics) override;
  void OnRendezvousEvent(Event event) override;
  void OnRendezvousSize(int64_t groups, int64_t members) override;
  void OnCalibration(absl::string_view profile, int64_t accepted,
                     const core::CostCalibrator::State& state) override;

  // Bucket upper bounds, exposed for tests.
  static const prometheus::Histogram::BucketBoundaries& LatencyBuckets();    // seconds
  static const prometheus::Histogram::BucketBoundaries& ImbalanceBuckets();  // ratio >= 1
  static const prometheus::Histogram::BucketBoundaries& SavingBuckets();     // ratio in [0, 1]
  // A phase's busiest rank's tokens over C/N: 0 (nothing moves) to N - 1 (full KV).
  static const prometheus::Histogram::BucketBoundaries& PhaseBuckets();
  // The event label's value ("join", "formed", "abort", "reform", "expired").
  static absl::string_view EventName(Event event);

 private:
  // The series one plan records into, by (strategy, cp_size): found in their
  // families once and kept, so that a plan costs one map lookup instead of
  // ten label-set lookups (each building its labels on the heap).
  struct PlanSeries {
    prometheus::Histogram* duration = nullptr;
    prometheus::Histogram* imbalance = nullptr;
    // By core::CommScheme: kAllGather, kTargeted.
    prometheus::Histogram* saving[2] = {nullptr, nullptr};
    prometheus::Histogram* sent[2] = {nullptr, nullptr};
    prometheus::Histogram* received[2] = {nullptr, nullptr};
  };
  // The series one request records into, by method, then code.
  struct MethodSeries {
    prometheus::Histogram* duration = nullptr;
    std::map<int, prometheus::Counter*> requests;  // by absl::StatusCode
  };
  const PlanSeries& PlanSeriesFor(core::Strategy strategy, int64_t cp_size);

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& planning_duration_;
  prometheus::Gauge& inflight_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& queue_capacity_;
  prometheus::Gauge& stream_held_bytes_;
  prometheus::Family<prometheus::Histogram>& imbalance_;
  prometheus::Family<prometheus::Histogram>& comm_saving_;
  prometheus::Family<prometheus::Histogram>& phase_bottleneck_;
  prometheus::Gauge& rendezvous_groups_;
  prometheus::Gauge& rendezvous_members_;
  prometheus::Family<prometheus::Counter>& rendezvous_events_;
  // Calibration (OnCalibration); set in the constructor's body.
  prometheus::Family<prometheus::Gauge>* cost_coefficient_ = nullptr;
  prometheus::Family<prometheus::Gauge>* cost_samples_ = nullptr;
  prometheus::Family<prometheus::Counter>* cost_reported_ = nullptr;
  prometheus::Family<prometheus::Gauge>* cost_fit_error_ = nullptr;
  prometheus::Family<prometheus::Gauge>* cost_calibrated_ = nullptr;
  absl::Mutex cost_mu_;  // serialises OnCalibration

  absl::Mutex series_mu_;  // guards the two caches; their entries never move or go
  std::map<std::pair<int, int64_t>, std::unique_ptr<PlanSeries>> plan_series_
      ABSL_GUARDED_BY(series_mu_);
  std::map<std::string, MethodSeries, std::less<>> method_series_ ABSL_GUARDED_BY(series_mu_);
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_METRICS_H_
