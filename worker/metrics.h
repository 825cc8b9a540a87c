// The worker's WorkerObserver for the binary: Prometheus series in a registry
// made by the caller (STYLE item 9).
#ifndef FLASHCP_WORKER_METRICS_H_
#define FLASHCP_WORKER_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/observer.h"

namespace flashcp::worker {

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
// target's labels. Group events have no series: a rank's group state is
// WorkerControl's GetStatus, a group's the planner's rendezvous series.
class PrometheusWorkerMetrics final : public WorkerObserver {
 public:
  PrometheusWorkerMetrics(prometheus::Registry& registry, const std::string& version,
                          const WorkerLabels& labels = {});
  // Ranks in this rank's group (--world_size): what the missing-rank alert
  // compares the group's live targets with.
  void SetWorldSize(int32_t ranks);

  // Creates the run's series at zero, so that the first scrape sees 0.
  void OnRunStart(absl::string_view strategy, absl::string_view scheme) override;
  void OnStep(absl::string_view strategy, absl::string_view scheme,
              const StepRecord& r) override;
  void OnGroupEvent(GroupEvent, const absl::Status&) override {}
  void OnRunEnd(absl::string_view) override {}  // a line, not a series

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
  prometheus::Family<prometheus::Counter>& predicted_step_;
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_METRICS_H_
