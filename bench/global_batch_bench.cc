// PlanGlobalBatch against first fit in arrival order (issue 27): for each
// data set and DP (4, 8), CP = 8, context C = 128K tokens a replica, the
// replicas' attention imbalance (max / mean of Eq. 3 summed over each
// replica's whole documents) of both, and each replica's CP plan's own
// imbalance. A global batch: documents drawn in arrival order (SampleBatch
// of 2 x DP x C tokens, a document longer than C cut into C-token pieces),
// packed by first fit into DP replicas of C until one fits nowhere; the
// documents placed are the global batch both pack. Plain table tool,
// markdown out.
//
//   build/bin/global_batch_bench [--batches 16] [--seed 1]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "core/analysis.h"
#include "core/cli.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/global_batch.h"
#include "core/strategies.h"

ABSL_FLAG(int32_t, batches, 16, "global batches per data set and DP");
ABSL_FLAG(uint64_t, seed, 1, "sampling seed");

namespace flashcp::core {
namespace {

constexpr int32_t kCp = 8;
constexpr int64_t kContext = int64_t{8} * 16384;
constexpr int32_t kDps[] = {4, 8};

// The global batch of a document stream: first fit until a piece fits nowhere.
std::vector<int64_t> GlobalBatch(const std::vector<int64_t>& stream, int32_t dp) {
  const Pieces p = CutToContext(stream, kContext);
  std::vector<int64_t> tokens(dp, 0), out;
  for (int64_t len : p.lens) {
    int32_t r = 0;
    while (r < dp && tokens[r] + len > kContext) ++r;
    if (r == dp) break;
    tokens[r] += len;
    out.push_back(len);
  }
  return out;
}

int Run() {
  const int32_t batches = absl::GetFlag(FLAGS_batches);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  std::printf("Replicas' attention imbalance (max / mean), first fit in arrival order vs "
              "PlanGlobalBatch; CP = %d, C = %lld tokens a replica, %d global batches a cell, "
              "seed %llu; flashcp plans each replica (R = 1.02).\n\n",
              kCp, static_cast<long long>(kContext), batches,
              static_cast<unsigned long long>(seed));
  std::printf("| data set | DP | docs (mean) | fill (mean) | first fit imb mean / max | "
              "PlanGlobalBatch imb mean / max | batches first fit > 1.3 | of those <= 1.05 | "
              "whole-document bound mean / max | batches at the bound (1%%) | "
              "replica CP imb max (mean) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (Dataset d : kAllDatasets) {
    for (int32_t dp : kDps) {
      double ff_sum = 0, ff_max = 0, g_sum = 0, g_max = 0, docs = 0, fill = 0, cp_imb = 0;
      int above = 0, fixed = 0, at_bound = 0;
      double bound_sum = 0, bound_max = 0;
      for (int32_t b = 0; b < batches; ++b) {
        absl::StatusOr<std::vector<int64_t>> stream = SampleBatch(d, 2 * dp * kContext, seed, b);
        if (!stream.ok()) {
          std::fprintf(stderr, "global_batch_bench: %s\n",
                       std::string(stream.status().message()).c_str());
          return 1;
        }
        const std::vector<int64_t> lens = GlobalBatch(*stream, dp);
        GlobalBatchOptions o;
        o.dp_size = dp;
        o.cp_size = kCp;
        o.context = kContext;
        absl::StatusOr<GlobalBatchPlan> g = PlanGlobalBatch(lens, o);
        if (!g.ok()) {
          std::fprintf(stderr, "global_batch_bench: %s\n", std::string(g.status().message()).c_str());
          return 1;
        }
        ff_sum += g->first_fit_imbalance;
        ff_max = std::max(ff_max, g->first_fit_imbalance);
        g_sum += g->imbalance;
        g_max = std::max(g_max, g->imbalance);
        docs += static_cast<double>(lens.size());
        fill += static_cast<double>(TotalTokens(lens)) / static_cast<double>(dp * kContext);
        if (g->first_fit_imbalance > 1.3) {
          ++above;
          if (g->imbalance <= 1.05) ++fixed;
        }
        // No packing of whole pieces beats the heaviest piece alone:
        // max(heaviest piece, mean) / mean.
        double total_work = 0, heaviest = 0;
        for (int64_t len : g->pieces.lens) {
          total_work += ShardWorkload(0, len);
          heaviest = std::max(heaviest, ShardWorkload(0, len));
        }
        const double mean = total_work / dp;
        const double bound = std::max(heaviest, mean) / mean;
        bound_sum += bound;
        bound_max = std::max(bound_max, bound);
        if (g->imbalance <= bound * 1.01) ++at_bound;
        double worst = 1.0;
        for (const ReplicaBatch& r : g->replicas) {
          absl::StatusOr<PlanMetrics> m = AnalyzePlan(r.plan, ModelShape{}, 0);
          if (!m.ok()) return 1;
          worst = std::max(worst, m->imbalance);
        }
        cp_imb += worst;
      }
      const double n = batches;
      std::printf("| %s | %d | %.0f | %.4f | %.3f / %.3f | %.3f / %.3f | %d of %d | %d of %d | "
                  "%.3f / %.3f | %d of %d | %.3f |\n",
                  std::string(DatasetName(d)).c_str(), dp, docs / n, fill / n, ff_sum / n, ff_max,
                  g_sum / n, g_max, above, batches, fixed, above, bound_sum / n, bound_max,
                  at_bound, batches, cp_imb / n);
      std::fflush(stdout);
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
          "Usage: global_batch_bench [--flag=value ...]\n\nPlanGlobalBatch against first fit "
          "(docs/benchmarks.md, \"Global batches\").",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  return flashcp::core::Run();
}
