// Prometheus metrics for the planner service: a ServiceObserver that records
// into a registry made by main (STYLE item 9). Names are a stable interface:
// deploy/prometheus rules and the Grafana dashboards use them verbatim.
//   flashcp_planner_requests_total{method,code}                 counter
//   flashcp_planner_request_duration_seconds{method}            histogram
//   flashcp_planner_planning_duration_seconds{strategy}         histogram
//   flashcp_planner_inflight_requests                           gauge
//   flashcp_planner_queue_depth                                 gauge
//   flashcp_planner_plan_imbalance_ratio{strategy}              histogram
//   flashcp_planner_plan_comm_saving_ratio{strategy,scheme}     histogram
//   flashcp_planner_build_info{version}                         gauge, always 1
//   flashcp_planner_cost_coefficient{profile,term}              gauge, the fit in use
//   flashcp_planner_cost_samples{profile}                       gauge, in the window
//   flashcp_planner_cost_reported_samples_total{profile}        counter
//   flashcp_planner_cost_fit_error_ratio{profile}               gauge, mean |rel. error|
//   flashcp_planner_cost_calibrated{profile}                    gauge, 1 once a fit is used
// A PlanStream item counts as one request of method "PlanStream".
#ifndef FLASHCP_PLANNER_SERVICE_METRICS_H_
#define FLASHCP_PLANNER_SERVICE_METRICS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "planner_service/observer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace flashcp::planner_service {

class PrometheusMetrics final : public ServiceObserver {
 public:
  // Registers every family in `registry`, which must outlive this object.
  PrometheusMetrics(prometheus::Registry& registry, absl::string_view version);

  void OnRequestDone(absl::string_view method, absl::StatusCode code, double seconds) override;
  void OnInflightChange(int delta) override;
  void OnQueueDepth(int64_t depth) override;
  void OnStreamHeldBytes(int64_t bytes) override;
  void OnPlanned(core::Strategy strategy, double planning_seconds,
                 const core::PlanMetrics& metrics) override;
  void OnCalibration(absl::string_view profile, const core::CostCalibrator::State& state) override;

  // Bucket upper bounds, exposed for tests.
  static const prometheus::Histogram::BucketBoundaries& LatencyBuckets();    // seconds
  static const prometheus::Histogram::BucketBoundaries& ImbalanceBuckets();  // ratio >= 1
  static const prometheus::Histogram::BucketBoundaries& SavingBuckets();     // ratio in [0, 1]

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& planning_duration_;
  prometheus::Gauge& inflight_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& stream_held_bytes_;
  prometheus::Family<prometheus::Histogram>& imbalance_;
  prometheus::Family<prometheus::Histogram>& comm_saving_;
  // Calibration (OnCalibration); set in the constructor's body.
  prometheus::Family<prometheus::Gauge>* cost_coefficient_ = nullptr;
  prometheus::Family<prometheus::Gauge>* cost_samples_ = nullptr;
  prometheus::Family<prometheus::Counter>* cost_reported_ = nullptr;
  prometheus::Family<prometheus::Gauge>* cost_fit_error_ = nullptr;
  prometheus::Family<prometheus::Gauge>* cost_calibrated_ = nullptr;
  absl::Mutex cost_mu_;  // serialises OnCalibration (the counter is set from State::total)
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_METRICS_H_
