// The busiest link per scheme (issue 27): for each data set and N, one
// phase's bytes on the busiest rank's intra-node link (NVLink) and its
// inter-node link (NIC), 8 ranks a node, averaged over the batches:
//   llama3   Llama3 CP's plan, full-KV all-gather over N;
//   per_doc  Per-Doc CP's plan, full-KV all-gather over N;
//   magi     MagiAttention's dispatch, targeted exchange;
//   ulysses  the all-to-all over one group of N (Ulysses; any plan's tokens);
//   basp     BASP's plan, all-to-all within its groups, where the batch
//            allows it (B equal documents, B | N; data-set batches rarely do);
//   flashcp  flashcp's choice (core/group_schemes.h): its plan (or basp's),
//            each rank group with the scheme of least weighted busiest link.
// Context C = 16384 N (16K tokens a rank). Plain table tool, markdown out.
//
//   build/bin/scheme_bytes [--batches 4] [--seed 1] [--query_heads 64] [--heads 8]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/cli.h"
#include "core/flags.h"
#include "core/group_schemes.h"
#include "core/rank_groups.h"
#include "core/strategies.h"

ABSL_FLAG(int32_t, batches, 4, "batches per data set and N");
ABSL_FLAG(uint64_t, seed, 1, "batch sampling seed");
ABSL_FLAG(int32_t, query_heads, 64, "Hq");
ABSL_FLAG(int32_t, heads, 8, "Hkv");
ABSL_FLAG(int32_t, head_dim, 128, "D");
ABSL_FLAG(double, inter_node_weight, 8.0, "NVLink : NIC bandwidth ratio for flashcp's choice");

namespace flashcp::core {
namespace {

constexpr int32_t kRanksPerNode = 8;
constexpr int32_t kCps[] = {8, 16, 32, 64};

struct Link {
  double intra = 0, inter = 0;  // MiB, summed over batches then averaged
  int count = 0;
  void Add(const PhaseTraffic& p) {
    intra += static_cast<double>(p.max_intra_node_bytes) / (1 << 20);
    inter += static_cast<double>(p.max_inter_node_bytes) / (1 << 20);
    ++count;
  }
  std::string Cell() const {
    if (count == 0) return "n/a";
    return absl::StrFormat("%.1f / %.1f", intra / count, inter / count);
  }
};

int Run() {
  const int32_t batches = absl::GetFlag(FLAGS_batches);
  const ModelShape shape{absl::GetFlag(FLAGS_heads), absl::GetFlag(FLAGS_head_dim), 2,
                         absl::GetFlag(FLAGS_query_heads)};
  if (absl::Status s = ValidateModelShape(shape); !s.ok()) {
    std::fprintf(stderr, "scheme_bytes: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const double weight = absl::GetFlag(FLAGS_inter_node_weight);
  std::printf("Busiest link, one phase, MiB intra-node / inter-node (mean over %d batches, seed "
              "%llu); Hq = %d, Hkv = %d, D = %d, bf16; 8 ranks a node; C = 16K x N; flashcp "
              "weighs a NIC byte %g NVLink bytes.\n\n",
              batches, static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)),
              shape.query_heads, shape.heads, shape.head_dim, weight);
  // The data sets, then BASP's own setting: B = N/8 equal documents of 8 C/N
  // tokens (one batch), so basp's groups are the nodes.
  std::vector<std::optional<Dataset>> sets(std::begin(kAllDatasets), std::end(kAllDatasets));
  sets.push_back(std::nullopt);
  for (const std::optional<Dataset>& d : sets) {
    std::printf("### %s\n\n", d ? std::string(DatasetName(*d)).c_str()
                                 : "equal documents (B = N/8 of 8 x 16K tokens; 1 batch)");
    std::printf("| N | llama3 (all-gather) | per_doc (all-gather) | magi (targeted) | ulysses over N | "
                "basp | flashcp's choice | flashcp groups: targeted / allgather / all_to_all / two_level | "
                "flashcp inter below magi's and ulysses' | flashcp inter vs ulysses': below / "
                "equal / above | flashcp's largest group | batches with one group of all N (of the equal) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int32_t n : kCps) {
      const int64_t context = int64_t{16384} * n;
      absl::StatusOr<std::vector<std::vector<int64_t>>> sampled =
          d ? SampleBatches(*d, context, batches, absl::GetFlag(FLAGS_seed))
            : absl::StatusOr<std::vector<std::vector<int64_t>>>(std::vector<std::vector<int64_t>>{
                  std::vector<int64_t>(n / kRanksPerNode, int64_t{8} * 16384)});
      if (!sampled.ok()) {
        std::fprintf(stderr, "scheme_bytes: %s\n", std::string(sampled.status().message()).c_str());
        return 1;
      }
      Link llama3, per_doc, magi, ulysses, basp, chosen;
      std::map<CommScheme, int64_t> schemes;
      int64_t two_level = 0;
      int below = 0;
      // flashcp's inter-node busiest link against Ulysses-over-N's, per
      // batch: below, equal, above; and its largest rank group's size.
      int vs_u[3] = {0, 0, 0};
      size_t largest = 0;
      int whole_group = 0, tie_whole = 0;  // batches with one group of all N; of the ties
      for (const std::vector<int64_t>& docs : *sampled) {
        const Batch batch{docs, n};
        PlanOptions options;
        options.ranks_per_node = kRanksPerNode;
        const auto metrics = [&](Strategy s) -> absl::StatusOr<std::pair<Plan, PlanMetrics>> {
          absl::StatusOr<Plan> plan = MakePlan(s, batch, options);
          if (!plan.ok()) return plan.status();
          absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, shape, kRanksPerNode);
          if (!m.ok()) return m.status();
          return std::make_pair(*std::move(plan), *std::move(m));
        };
        absl::StatusOr<std::pair<Plan, PlanMetrics>> l = metrics(Strategy::kLlama3);
        absl::StatusOr<std::pair<Plan, PlanMetrics>> p = metrics(Strategy::kPerDoc);
        absl::StatusOr<std::pair<Plan, PlanMetrics>> g = metrics(Strategy::kMagi);
        if (!l.ok() || !p.ok() || !g.ok()) {
          std::fprintf(stderr, "scheme_bytes: a baseline failed\n");
          return 1;
        }
        llama3.Add(l->second.bytes[static_cast<int>(CommScheme::kFullKv)].phase);
        per_doc.Add(p->second.bytes[static_cast<int>(CommScheme::kFullKv)].phase);
        const PhaseTraffic& magi_phase = g->second.bytes[static_cast<int>(CommScheme::kTargeted)].phase;
        magi.Add(magi_phase);
        std::vector<int32_t> all(n);
        for (int32_t r = 0; r < n; ++r) all[r] = r;
        absl::StatusOr<SchemeBytes> u = GroupedSchemeBytes(
            p->first, p->second, {RankGroup{all, CommScheme::kAllToAll}}, shape, kRanksPerNode);
        if (u.ok()) ulysses.Add(u->phase);
        absl::StatusOr<std::pair<Plan, PlanMetrics>> b = metrics(Strategy::kBasp);
        if (b.ok() && b->second.all_to_all_inapplicable.empty()) {
          basp.Add(b->second.bytes[static_cast<int>(CommScheme::kAllToAll)].phase);
        }
        absl::StatusOr<GroupSchemePlan> f =
            PlanWithGroupSchemes(Strategy::kFlashCp, batch, options, shape, weight);
        if (!f.ok()) {
          std::fprintf(stderr, "scheme_bytes: flashcp: %s\n", std::string(f.status().message()).c_str());
          return 1;
        }
        chosen.Add(f->choice.bytes.phase);
        for (const ChosenGroup& cg : f->choice.groups) {
          if (cg.group.ranks.size() > 1) ++(cg.group.two_level ? two_level : schemes[cg.group.scheme]);
          largest = std::max(largest, cg.group.ranks.size());
        }
        const int64_t fi = f->choice.bytes.phase.max_inter_node_bytes;
        bool all_n = false;
        for (const ChosenGroup& cg : f->choice.groups)
          all_n = all_n || static_cast<int32_t>(cg.group.ranks.size()) == n;
        whole_group += all_n;
        if (u.ok()) {
          const int64_t ui = u->phase.max_inter_node_bytes;
          ++vs_u[fi < ui ? 0 : fi == ui ? 1 : 2];
          tie_whole += fi == ui && all_n;
        }
        if (fi < magi_phase.max_inter_node_bytes && (!u.ok() || fi < u->phase.max_inter_node_bytes)) {
          ++below;
        }
      }
      std::printf("| %d | %s | %s | %s | %s | %s | %s | %lld / %lld / %lld / %lld | %d of %d | %d / %d / %d "
                  "| %zu | %d (%d) |\n", n,
                  llama3.Cell().c_str(), per_doc.Cell().c_str(), magi.Cell().c_str(),
                  ulysses.Cell().c_str(), basp.Cell().c_str(), chosen.Cell().c_str(),
                  static_cast<long long>(schemes[CommScheme::kTargeted]),
                  static_cast<long long>(schemes[CommScheme::kAllGather]),
                  static_cast<long long>(schemes[CommScheme::kAllToAll]),
                  static_cast<long long>(two_level), below,
                  static_cast<int>(sampled->size()), vs_u[0], vs_u[1], vs_u[2], largest,
                  whole_group, tie_whole);
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace flashcp::core

int main(int argc, char** argv) {
  flashcp::core::CommandLine line;
  if (std::optional<int> rc = flashcp::core::ParseMain(
          argc, argv,
          "Usage: scheme_bytes [--flag=value ...]\n\nThe busiest link's bytes per scheme, per "
          "data set and N (docs/benchmarks.md, \"Schemes and groups\").",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  return flashcp::core::Run();
}
