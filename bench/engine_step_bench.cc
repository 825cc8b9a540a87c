// Per-step time and bytes moved by the CPU execution engine, per strategy and
// communication scheme, on data-set batches (core/datasets.h SampleBatches):
// one batch per (context, N), ranks as threads (Gloo TCP on loopback).
//
//   engine_step_bench [--dataset pile] [--contexts 16384,32768,65536] [--cps 2,4]
//                     [--heads 1] [--head-dim 128] [--time-max-context 16384] [--seed 1]
//
// Bytes are per rank per layer, forward + backward, fp32: the maximum over
// ranks of what a rank actually sent (measured where a step ran; equal to
// core::AnalyzePlan's prediction, which the tests assert exactly) and, where
// no step ran (contexts above --time-max-context), the prediction. "saving"
// is 1 - bytes / full_kv bytes of the same plan. Seconds: the slowest rank's
// forward + backward wall time, between barriers.
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/strategies.h"
#include "worker/cpstep.h"
#include "worker/gloo_communicator.h"

namespace {

using namespace flashcp;  // NOLINT: a tool's main file

std::vector<int64_t> Ints(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view t : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(t, &v)) out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  flashcp::worker::IgnoreSigpipe();  // RunThreads connects Gloo (gloo_communicator.h)
  std::string dataset_name = "pile";
  std::vector<int64_t> contexts = {16384, 32768, 65536}, cps = {2, 4};
  int64_t heads = 1, head_dim = 128, time_max = 16384, seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dataset") dataset_name = value;
    else if (flag == "--contexts") contexts = Ints(value);
    else if (flag == "--cps") cps = Ints(value);
    else if (flag == "--heads") (void)absl::SimpleAtoi(value, &heads);
    else if (flag == "--head-dim") (void)absl::SimpleAtoi(value, &head_dim);
    else if (flag == "--time-max-context") (void)absl::SimpleAtoi(value, &time_max);
    else if (flag == "--seed") (void)absl::SimpleAtoi(value, &seed);
    else {
      std::fprintf(stderr, "engine_step_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  absl::StatusOr<core::Dataset> dataset = core::ParseDataset(dataset_name);
  if (!dataset.ok()) {
    std::fprintf(stderr, "engine_step_bench: %s\n", std::string(dataset.status().message()).c_str());
    return 2;
  }
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("| context | N | strategy | imbalance | scheme | max bytes sent/rank | saving vs full_kv | step s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int64_t context : contexts) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
        core::SampleBatches(*dataset, context, 1, static_cast<uint64_t>(seed));
    if (!batches.ok()) {
      std::fprintf(stderr, "engine_step_bench: %s\n", std::string(batches.status().message()).c_str());
      return 1;
    }
    const std::vector<int64_t>& lens = (*batches)[0];
    for (int64_t n : cps) {
      for (core::Strategy strategy : core::kAllStrategies) {
        if (strategy == core::Strategy::kIlp) continue;  // minutes per batch at these sizes
        absl::StatusOr<core::Plan> plan =
            core::MakePlan(strategy, core::Batch{lens, static_cast<int32_t>(n)});
        if (!plan.ok()) continue;  // Unimplemented strategies are skipped
        absl::StatusOr<core::PlanMetrics> m = core::AnalyzePlan(
            *plan, core::ModelShape{static_cast<int32_t>(heads), static_cast<int32_t>(head_dim), 4});
        if (!m.ok()) continue;
        const int64_t full = m->bytes[static_cast<int>(core::CommScheme::kFullKv)].bottleneck;
        for (core::CommScheme scheme : core::kAllCommSchemes) {
          const core::SchemeBytes& pred = m->bytes[static_cast<int>(scheme)];
          int64_t max_sent = 0;
          for (int64_t b : pred.sent) max_sent = std::max(max_sent, b);
          std::string seconds = "-";
          if (context <= time_max) {
            worker::StepConfig config;
            config.shape = worker::AttentionShape{static_cast<int32_t>(heads),
                                                  static_cast<int32_t>(head_dim),
                                                  1.0f / std::sqrt(static_cast<float>(head_dim))};
            config.scheme = scheme;
            config.threads_per_rank = std::max<int>(1, hw / static_cast<int>(n));
            const worker::StepInputs inputs = worker::MakeInputs(context, config.shape, 1);
            absl::StatusOr<std::vector<worker::RankResult>> res =
                worker::RunThreads(*plan, config, inputs);
            if (!res.ok()) {
              std::fprintf(stderr, "step failed: %s\n", res.status().ToString().c_str());
              return 1;
            }
            double s = 0;
            int64_t measured = 0;
            for (const worker::RankResult& r : *res) {
              s = std::max(s, r.seconds);
              measured = std::max(measured, r.stats.bytes_sent);
            }
            if (measured != max_sent) {
              std::fprintf(stderr, "measured bytes %lld != predicted %lld\n",
                           static_cast<long long>(measured), static_cast<long long>(max_sent));
              return 1;
            }
            seconds = std::to_string(s).substr(0, 6);
          }
          std::printf("| %lld | %lld | %s | %.3f | %s | %lld | %.1f%% | %s |\n",
                      static_cast<long long>(context), static_cast<long long>(n),
                      std::string(core::StrategyName(strategy)).c_str(), m->imbalance,
                      std::string(core::CommSchemeName(scheme)).c_str(),
                      static_cast<long long>(max_sent),
                      full == 0 ? 0.0 : 100.0 * (1.0 - static_cast<double>(max_sent) / full),
                      seconds.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
