// The block-diffusion quality table (issue 25, "Bench and docs";
// docs/bdlm.md): per data set, context, N and block size b, for llama3,
// csbp and flashcp under the block-diffusion mask, the mean and max
// imbalance (the mask's workload) and one phase's bytes per rank per layer,
// the busiest rank's received clean and noisy K/V, under each strategy's own
// scheme: llama3 the full-KV all-gather (position-sharded CP), csbp the
// compacted all-gather (its clean all-gather; a compacted buffer never
// exceeds the rank's whole one), flashcp its cheaper scheme (cheaper_scheme:
// the compacted all-gather or the targeted exchange). Then flashcp's
// bottleneck over csbp's, and in how many batches flashcp moves less than
// csbp. Markdown on stdout.
//
//   build/bin/bdlm_quality [--batches K] [--seed S] [--datasets D,D...]
//                          [--contexts C,C...] [--cps N,N...] [--block_sizes B,B...]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/mask.h"
#include "core/strategies.h"

ABSL_FLAG(int64_t, batches, 4, "batches per data set and cell, 1 to 10000");
ABSL_FLAG(uint64_t, seed, 1, "sampling seed");
ABSL_FLAG(std::string, datasets, "wlbllm,pile,redpajama", "data sets");
ABSL_FLAG(std::string, contexts, "131072,262144", "tokens per batch (C), comma-separated");
ABSL_FLAG(std::string, cps, "4,8,16", "CP sizes N, comma-separated");
ABSL_FLAG(std::string, block_sizes, "4,16,64", "block sizes b, comma-separated");

namespace flashcp::core {
namespace {

absl::StatusOr<std::vector<int64_t>> Ints(absl::string_view flag, absl::string_view value,
                                          int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s: %s is not an integer in [%d, %d]",
                                                        flag, std::string(part), lo, hi));
    }
    out.push_back(v);
  }
  return out;
}

struct Stats {
  double imbalance_sum = 0, imbalance_max = 0;
  double clean_sum = 0, noisy_sum = 0, bottleneck_sum = 0;  // bytes, one phase
  double seconds = 0;
};

// One phase's bytes of `plan` under `scheme`.
void Add(const PlanMetrics& m, CommScheme scheme, double seconds, Stats& s) {
  const PhaseTraffic& p = m.bytes[static_cast<int>(scheme)].phase;
  s.imbalance_sum += m.imbalance;
  s.imbalance_max = std::max(s.imbalance_max, m.imbalance);
  s.clean_sum += static_cast<double>(p.max_clean_received_bytes);
  s.noisy_sum += static_cast<double>(p.max_noisy_received_bytes);
  s.bottleneck_sum += static_cast<double>(p.bottleneck_bytes);
  s.seconds += seconds;
}

int Main() {
  const int64_t batches = absl::GetFlag(FLAGS_batches);
  if (batches < 1 || batches > 10000) {
    std::cerr << "--batches: must be in [1, 10000]\n";
    return 2;
  }
  std::vector<Dataset> datasets;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_datasets), ',')) {
    absl::StatusOr<Dataset> d = DatasetFromFlag(name);
    if (!d.ok()) {
      std::cerr << d.status().message() << "\n";
      return 2;
    }
    datasets.push_back(*d);
  }
  absl::StatusOr<std::vector<int64_t>> contexts =
      Ints("contexts", absl::GetFlag(FLAGS_contexts), 16, int64_t{1} << 24);
  absl::StatusOr<std::vector<int64_t>> cps = Ints("cps", absl::GetFlag(FLAGS_cps), 1, 1024);
  absl::StatusOr<std::vector<int64_t>> bs =
      Ints("block_sizes", absl::GetFlag(FLAGS_block_sizes), 1, int64_t{1} << 20);
  for (const auto* s : {&contexts, &cps, &bs}) {
    if (!s->ok()) {
      std::cerr << s->status().message() << "\n";
      return 2;
    }
  }
  const ModelShape shape;  // H = 32, D = 128, bf16
  std::printf(
      "Block diffusion: %lld batches per cell (seed %llu), H = %d, D = %d, %d-byte elements. "
      "Imbalance on the mask's workload (mean / max over batches); per phase and layer, the "
      "busiest rank's received clean and noisy K/V in MiB (means over batches) under each "
      "strategy's scheme (llama3 full_kv, csbp allgather, flashcp its cheaper one); "
      "f/c: flashcp's phase bottleneck over csbp's (mean); less: batches where flashcp's "
      "bottleneck is below csbp's.\n\n",
      static_cast<long long>(batches), static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)),
      shape.heads, shape.head_dim, shape.dtype_bytes);
  std::printf(
      "| data set | C | N | b | llama3 imb | llama3 clean | llama3 noisy | csbp imb | csbp clean | "
      "csbp noisy | flashcp imb | flashcp clean | flashcp noisy | f/c | less | flashcp ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  constexpr double kMiB = 1024.0 * 1024.0;
  for (Dataset d : datasets) {
    for (int64_t context : *contexts) {
      absl::StatusOr<std::vector<std::vector<int64_t>>> sampled =
          SampleBatches(d, context, batches, absl::GetFlag(FLAGS_seed));
      if (!sampled.ok()) {
        std::cerr << sampled.status().message() << "\n";
        return 1;
      }
      for (int64_t n : *cps) {
        for (int64_t b : *bs) {
          Stats llama, csbp, flash;
          double ratio_sum = 0;
          int64_t less = 0, csbp_planned = 0;
          for (const std::vector<int64_t>& docs : *sampled) {
            PlanOptions options;
            options.attention_mask = {MaskKind::kBlockDiffusion, b};
            const Batch batch{docs, static_cast<int32_t>(n)};
            int64_t csbp_bottleneck = -1;
            for (Strategy s : {Strategy::kLlama3, Strategy::kCsbp, Strategy::kFlashCp}) {
              const auto start = std::chrono::steady_clock::now();
              absl::StatusOr<Plan> plan = MakePlan(s, batch, options);
              const double seconds =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
              if (!plan.ok()) {
                std::cerr << StrategyName(s) << ": " << plan.status().message() << "\n";
                return 1;
              }
              absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, shape);
              if (!m.ok()) {
                std::cerr << m.status().message() << "\n";
                return 1;
              }
              if (s == Strategy::kLlama3) {
                Add(*m, CommScheme::kFullKv, seconds, llama);
              } else if (s == Strategy::kCsbp) {
                Add(*m, CommScheme::kAllGather, seconds, csbp);
                csbp_bottleneck =
                    m->bytes[static_cast<int>(CommScheme::kAllGather)].phase.bottleneck_bytes;
                ++csbp_planned;
              } else {
                Add(*m, m->cheaper_scheme, seconds, flash);
                const int64_t mine = m->bytes[static_cast<int>(m->cheaper_scheme)].phase.bottleneck_bytes;
                ratio_sum += static_cast<double>(mine) / static_cast<double>(csbp_bottleneck);
                if (mine < csbp_bottleneck) ++less;
              }
            }
          }
          const double k = static_cast<double>(batches);
          std::printf(
              "| %s | %lldK | %lld | %lld | %.3f / %.3f | %.1f | %.1f | %.3f / %.3f | %.1f | %.1f "
              "| %.3f / %.3f | %.1f | %.1f | %.3f | %lld/%lld | %.0f |\n",
              std::string(DatasetName(d)).c_str(), static_cast<long long>(context / 1024),
              static_cast<long long>(n), static_cast<long long>(b), llama.imbalance_sum / k,
              llama.imbalance_max, llama.clean_sum / k / kMiB, llama.noisy_sum / k / kMiB,
              csbp.imbalance_sum / k, csbp.imbalance_max, csbp.clean_sum / k / kMiB,
              csbp.noisy_sum / k / kMiB, flash.imbalance_sum / k, flash.imbalance_max,
              flash.clean_sum / k / kMiB, flash.noisy_sum / k / kMiB, ratio_sum / k,
              static_cast<long long>(less), static_cast<long long>(csbp_planned),
              1000.0 * flash.seconds / k);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace flashcp::core

int main(int argc, char** argv) {
  flashcp::core::CommandLine line;
  if (std::optional<int> rc = flashcp::core::ParseMain(
          argc, argv,
          "Usage: bdlm_quality [--flag=value ...]\n\nThe block-diffusion quality table "
          "(docs/bdlm.md): llama3, csbp and flashcp per data set, context, N and block size.",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  return flashcp::core::Main();
}
