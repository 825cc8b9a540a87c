#include "worker/metrics.h"

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/rank_backend.h"

namespace flashcp::worker {
namespace {

// The WorkerLabels as Prometheus constant labels; empty values are left out.
prometheus::Labels ConstLabels(const WorkerLabels& l) {
  prometheus::Labels out = {{"device", l.device}};
  if (!l.gpu.empty()) out["gpu"] = l.gpu;
  if (!l.local_rank.empty()) out["local_rank"] = l.local_rank;
  return out;
}

std::vector<double> DurationBuckets() {
  std::vector<double> b;
  for (double x = 0.0005; x < 70; x *= 2) b.push_back(x);  // 0.5 ms .. 65 s
  return b;
}

// A family named `name` carrying the process's labels, in `registry`.
template <typename Builder>
auto& Family(Builder builder, const char* name, const char* help, const WorkerLabels& labels,
             prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Labels(ConstLabels(labels)).Register(registry);
}

prometheus::Labels RunLabels(absl::string_view strategy, absl::string_view scheme) {
  return {{"strategy", std::string(strategy)}, {"scheme", std::string(scheme)}};
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

PrometheusWorkerMetrics::PrometheusWorkerMetrics(prometheus::Registry& registry,
                                                 const std::string& version,
                                                 const WorkerLabels& labels)
    : step_(Family(prometheus::BuildHistogram(), "flashcp_worker_step_duration_seconds",
                   "Wall time of a training step (plan wait, attention forward and backward, "
                   "reporting), by strategy and scheme",
                   labels, registry)),
      forward_(Family(prometheus::BuildHistogram(),
                      "flashcp_worker_attention_forward_duration_seconds",
                      "Attention forward pass per step: device=cpu, wall time with its "
                      "collectives; device=cuda, device time of the attention kernels only",
                      labels, registry)),
      backward_(Family(prometheus::BuildHistogram(),
                       "flashcp_worker_attention_backward_duration_seconds",
                       "Attention backward pass per step: device=cpu, wall time with its "
                       "collectives; device=cuda, device time of the attention kernels only",
                       labels, registry)),
      comm_(Family(prometheus::BuildHistogram(), "flashcp_worker_comm_duration_seconds",
                   "Time inside KV and gradient collectives per step (waiting for peers "
                   "included)",
                   labels, registry)),
      plan_wait_(Family(prometheus::BuildHistogram(), "flashcp_worker_plan_wait_duration_seconds",
                        "Time a step waited for its plan", labels, registry)),
      bytes_sent_(Family(prometheus::BuildCounter(), "flashcp_worker_bytes_sent_total",
                         "KV and gradient payload bytes this rank sent", labels, registry)),
      bytes_received_(Family(prometheus::BuildCounter(), "flashcp_worker_bytes_received_total",
                             "KV and gradient payload bytes this rank received", labels,
                             registry)),
      full_kv_(Family(prometheus::BuildCounter(), "flashcp_worker_full_kv_bytes_total",
                      "Bytes this rank would have sent under a full-KV all-gather for the "
                      "same steps",
                      labels, registry)),
      steps_(Family(prometheus::BuildCounter(), "flashcp_worker_steps_total",
                    "Training steps completed", labels, registry)),
      attention_(Family(prometheus::BuildCounter(), "flashcp_worker_attention_seconds_total",
                        "Attention compute seconds of this rank, what its group's measured "
                        "imbalance compares: device=cpu, forward + backward minus time in "
                        "collectives; device=cuda, device time of the attention kernels",
                        labels, registry)),
      predicted_sent_(Family(prometheus::BuildCounter(),
                             "flashcp_worker_predicted_bytes_sent_total",
                             "Bytes the plans predicted this rank sends under the scheme run, "
                             "for the same steps as flashcp_worker_bytes_sent_total",
                             labels, registry)),
      predicted_workload_(Family(prometheus::BuildCounter(),
                                 "flashcp_worker_predicted_workload_pairs_total",
                                 "Attention (query, key) pairs the plans gave this rank "
                                 "(SPEC Eq. 3), for the same steps as "
                                 "flashcp_worker_attention_seconds_total",
                                 labels, registry)),
      predicted_cost_(Family(prometheus::BuildCounter(), "flashcp_worker_predicted_cost_total",
                             "Attention cost the plans predicted for this rank under their "
                             "cost profile (seconds for a measured profile, pairs for "
                             "`pairs`), for the same steps as "
                             "flashcp_worker_attention_seconds_total",
                             labels, registry)),
      time_ratio_(Family(prometheus::BuildGauge(), "flashcp_worker_attention_time_ratio",
                         "This rank's attention compute time over its group's mean, last step",
                         labels, registry)),
      predicted_imbalance_(Family(prometheus::BuildGauge(),
                                  "flashcp_worker_predicted_imbalance_ratio",
                                  "The planner's imbalance ratio (max/mean workload) of the "
                                  "plan of the last step",
                                  labels, registry)),
      world_size_(Family(prometheus::BuildGauge(), "flashcp_worker_world_size",
                         "Ranks in this rank's CP group (--world_size)", labels, registry)
                      .Add({})),
      predicted_step_(Family(prometheus::BuildCounter(),
                             "flashcp_worker_predicted_step_seconds_total",
                             "Attention step seconds the plans predicted on the --cluster "
                             "preset (PlanMetrics.predicted_step_seconds, core/step_time.h), "
                             "for the same steps as flashcp_worker_step_duration_seconds; "
                             "0 a step without --cluster, or whose plan's exchange has no "
                             "modelled time (basp's all_to_all where a group's size does not "
                             "divide the heads)",
                             labels, registry)) {
  Family(prometheus::BuildGauge(), "flashcp_worker_build_info", "flashcp-worker build; always 1",
         labels, registry)
      .Add({{"version", version}})
      .Set(1);
}

void PrometheusWorkerMetrics::SetWorldSize(int32_t ranks) { world_size_.Set(ranks); }

void PrometheusWorkerMetrics::OnRunStart(absl::string_view strategy, absl::string_view scheme) {
  const prometheus::Labels l = RunLabels(strategy, scheme);
  const auto buckets = DurationBuckets();
  for (auto* h : {&step_, &forward_, &backward_, &comm_, &plan_wait_}) h->Add(l, buckets);
  for (auto* c : {&bytes_sent_, &bytes_received_, &full_kv_, &steps_, &attention_,
                  &predicted_sent_, &predicted_workload_, &predicted_cost_, &predicted_step_}) {
    c->Add(l);
  }
}

void PrometheusWorkerMetrics::OnStep(absl::string_view strategy, absl::string_view scheme,
                                     const StepRecord& r) {
  const prometheus::Labels l = RunLabels(strategy, scheme);
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
  predicted_step_.Add(l).Increment(r.predicted_step_seconds);
  time_ratio_.Add({{"strategy", std::string(strategy)}}).Set(r.attention_time_ratio);
  predicted_imbalance_.Add({{"strategy", std::string(strategy)}}).Set(r.predicted_imbalance);
}

}  // namespace flashcp::worker
