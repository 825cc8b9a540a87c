// Per-step time and bytes moved by the CPU execution engine, per strategy and
// communication scheme, on data-set batches (core/datasets.h SampleBatches):
// one batch per (context, N), ranks as threads (Gloo TCP on loopback).
//
//   engine_step_bench [--dataset pile] [--contexts 16384,32768,65536] [--cps 2,4]
//                     [--heads 1] [--head_dim 128] [--time_max_context 16384] [--seed 1]
//
// Bytes are per rank per layer, forward + backward, fp32: the maximum over
// ranks of what a rank actually sent (measured where a step ran; equal to
// core::AnalyzePlan's prediction, which the tests assert exactly) and, where
// no step ran (contexts above --time_max_context), the prediction. "saving"
// is 1 - bytes / full_kv bytes of the same plan. Seconds: the slowest rank's
// forward + backward wall time, between barriers.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/echo.h"
#include "core/flags.h"
#include "core/strategies.h"
#include "worker/cpstep.h"
#include "worker/gloo_communicator.h"

namespace {

using namespace flashcp;  // NOLINT: a tool's main file

// Each item of a comma-separated flag as an integer in [lo, hi]; an error
// naming the flag otherwise (and for an empty list).
absl::StatusOr<std::vector<int64_t>> Ints(absl::string_view flag,
                                          const std::vector<std::string>& items, int64_t lo,
                                          int64_t hi) {
  std::vector<int64_t> out;
  for (const std::string& t : items) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", flashcp::core::Echo(t),
                                                     " is not an integer in [", lo, ", ", hi,
                                                     "]"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty list"));
  return out;
}

}  // namespace

ABSL_FLAG(std::string, dataset, "pile", "document-length distribution: wlbllm, pile, redpajama");
ABSL_FLAG(std::vector<std::string>, contexts, (std::vector<std::string>{"16384", "32768", "65536"}),
          "tokens per batch (C), comma-separated");
ABSL_FLAG(std::vector<std::string>, cps, (std::vector<std::string>{"2", "4"}),
          "CP group sizes (N), comma-separated");
ABSL_FLAG(int32_t, heads, 1, "attention heads (H), 1 to 1024");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension (D), 1 to 1024");
ABSL_FLAG(int64_t, time_max_context, 16384,
          "time steps only at contexts up to this; above, bytes are predicted");
ABSL_FLAG(int64_t, seed, 1, "sampling seed, >= 0");

int main(int argc, char** argv) {
  flashcp::worker::IgnoreSigpipe();  // RunThreads connects Gloo (gloo_communicator.h)
  core::CommandLine line;
  if (std::optional<int> rc = core::ParseMain(
          argc, argv,
          "Usage: engine_step_bench [--flag=value ...]\n\nPer-step time and bytes of the CPU "
          "engine per strategy and scheme (docs/benchmarks.md).",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  absl::StatusOr<std::vector<int64_t>> contexts_or =
      Ints("contexts", absl::GetFlag(FLAGS_contexts), 1, core::kMaxTokens);
  absl::StatusOr<std::vector<int64_t>> cps_or =
      Ints("cps", absl::GetFlag(FLAGS_cps), 1, core::kMaxCpSize);
  const int64_t heads = absl::GetFlag(FLAGS_heads), head_dim = absl::GetFlag(FLAGS_head_dim);
  const int64_t time_max = absl::GetFlag(FLAGS_time_max_context);
  const int64_t seed = absl::GetFlag(FLAGS_seed);
  absl::Status bad;
  if (!contexts_or.ok()) bad = contexts_or.status();
  else if (!cps_or.ok()) bad = cps_or.status();
  else if (absl::Status s =
               core::ModelShapeFromFlags(heads, head_dim, core::ModelShape{}.dtype_bytes).status();
           !s.ok())
    bad = s;
  else if (seed < 0) bad = absl::InvalidArgumentError(absl::StrCat("--seed: must be >= 0, got ", seed));
  if (!bad.ok()) return core::UsageError("engine_step_bench", bad, std::cerr);
  const std::vector<int64_t>& contexts = *contexts_or;
  const std::vector<int64_t>& cps = *cps_or;
  absl::StatusOr<core::Dataset> dataset = core::DatasetFromFlag(absl::GetFlag(FLAGS_dataset));
  if (!dataset.ok()) return core::UsageError("engine_step_bench", dataset.status(), std::cerr);
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
      for (core::Strategy strategy : core::AllStrategies()) {
        if (!core::InAllList(strategy)) continue;  // the ILP: minutes per batch at these sizes
        absl::StatusOr<core::Plan> plan =
            core::MakePlan(strategy, core::Batch{lens, static_cast<int32_t>(n)});
        if (!plan.ok()) {
          std::fprintf(stderr, "engine_step_bench: %s N=%lld: %s\n",
                       std::string(core::StrategyName(strategy)).c_str(),
                       static_cast<long long>(n), std::string(plan.status().message()).c_str());
          return 1;
        }
        absl::StatusOr<core::PlanMetrics> m = core::AnalyzePlan(
            *plan, core::ModelShape{static_cast<int32_t>(heads), static_cast<int32_t>(head_dim), 4});
        if (!m.ok()) continue;
        const int64_t full = m->bytes[static_cast<int>(core::CommScheme::kFullKv)].bottleneck;
        for (core::CommScheme scheme : core::kKvCommSchemes) {
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
