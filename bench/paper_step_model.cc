// The step-time model against the paper (issue 29, "Checked against the
// paper"): the paper's setup (section 4.1-4.2 and Figure 5: 8 x H100 SXM on
// NVLink, 128K context, WLB-LLM, Pile and RedPajama, H = 16 and 32 heads of
// D = 128, CP sizes 4 and 8, training and inference) planned with
// flashcp_paper and the baselines, each run as its system runs it (llama3,
// per_doc: all-gather of full KV; ring, zigzag: ring attention as
// ring-flash-attention's varlen functions, which the paper uses: ring cuts
// every document into N contiguous chunks, zigzag into 2N; flashcp_paper:
// the compacted all-gather, Eq. 5), and the model's predicted speedups and
// communication-time reductions printed beside the paper's. Constants are
// the h100-sxm preset's (core/step_time.h), never fitted to the paper. Then
// the scale table: mean predicted step per strategy at N = 8 (one node) and
// 16, 32, 64 (8 per node), 128K and 1M. Markdown on stdout.
//
//   build/bin/paper_step_model [--batches K] [--seed S] [--scale_batches K]
//                              [--scale_cells C:N,...] [--cluster ...]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/ring_varlen.h"
#include "core/analysis.h"
#include "core/cli.h"
#include "core/cluster_flags.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/status_macros.h"
#include "core/step_choice.h"
#include "core/step_time.h"
#include "core/strategies.h"

ABSL_DECLARE_FLAG(std::string, cluster);  // core/cluster_flags.cc

ABSL_FLAG(int64_t, batches, 32, "batches per paper configuration, 1 to 10000");
ABSL_FLAG(uint64_t, seed, 1, "sampling seed");
ABSL_FLAG(int64_t, scale_batches, 8, "batches per scale cell, 0 (skip) to 10000");
ABSL_FLAG(std::string, scale_cells,
          "131072:8,131072:16,131072:32,131072:64,1048576:8,1048576:16,1048576:32,1048576:64",
          "(context, N) cells of the scale table, CONTEXT:N,...");
ABSL_FLAG(std::string, scale_datasets, "wlbllm,pile,redpajama", "data sets of the scale table");
ABSL_FLAG(int32_t, ranks_per_node, 8, "ranks per node (8 GPUs a node)");

namespace flashcp::core {
namespace {

constexpr char kUsage[] =
    "Usage: paper_step_model [--flag=value ...]\n\n"
    "The step-time model's predicted speedups beside the paper's (docs/benchmarks.md).";

constexpr int64_t kPaperContext = 131072;

// The paper's figures (SPEC.md, "The paper's figures").
constexpr std::pair<Dataset, double> kPaperCommReduction[] = {{Dataset::kWlbLlm, 0.236},
                                                              {Dataset::kPile, 0.345}};

// Sums over a configuration's batches, per strategy.
struct Sums {
  double step = 0;       // predicted step (training: forward + backward), seconds
  double compute = 0;    // slowest rank's compute
  double exposed = 0;    // exposed exchange
  double exchange = 0;   // exchange, both phases, not overlapped
  double step_stacked = 0;  // the same plan with no overlap (the paper's Figure 6 stacks)
  double forward = 0;       // inference: the forward phase alone, overlapped
  double forward_stacked = 0;
  int64_t n = 0;
};

// A system the paper runs: the strategy whose exchange it uses, and whether
// its sharding is ring-flash-attention's varlen ring (every document in N
// contiguous chunks, chunk k on rank k) rather than the strategy's own.
struct System {
  std::string name;
  Strategy strategy;
  bool ring_varlen = false;
};

absl::Status Accumulate(const System& sys, const Batch& batch, const ModelShape& shape,
                        const ClusterSpec& cluster, Sums& sums) {
  Plan plan;
  if (sys.ring_varlen) {
    plan = bench::PlanRingVarlen(batch);
  } else {
    FLASHCP_ASSIGN_OR_RETURN(plan, MakePlan(sys.strategy, batch));
  }
  FLASHCP_ASSIGN_OR_RETURN(const StepTimeReport r,
                           ReportStepTime(sys.strategy, plan, shape, 1, cluster));
  ClusterSpec stacked = cluster;
  stacked.overlap_whole_shards = false;
  FLASHCP_ASSIGN_OR_RETURN(const StepTimePrediction st,
                           PredictStepTime(plan, shape, 1, stacked, r.exchange));
  const StepTimePrediction& p = r.native();
  sums.step += p.step_seconds;
  sums.compute += p.compute_seconds;
  sums.exposed += p.exposed_exchange_seconds;
  sums.exchange += p.exchange_seconds;
  sums.step_stacked += st.step_seconds;
  sums.forward += p.forward_seconds;
  sums.forward_stacked += st.forward_seconds;
  ++sums.n;
  return absl::OkStatus();
}

std::vector<Batch> Draw(Dataset d, int64_t context, int64_t count, uint64_t seed, int32_t n) {
  std::vector<Batch> out;
  absl::StatusOr<std::vector<std::vector<int64_t>>> docs = SampleBatches(d, context, count, seed);
  if (!docs.ok()) return out;
  for (std::vector<int64_t>& b : *docs) out.push_back(Batch{std::move(b), n});
  return out;
}

double Mean(const Sums& s, double Sums::*field) {
  return s.n == 0 ? 0 : s.*field / static_cast<double>(s.n);
}

struct Config {
  Dataset d;
  int32_t heads;
  int32_t n;
  std::map<std::string, Sums> sums;  // by System::name
};

// Mean over `configs` (those of data set `only`, if given) of a baseline's
// mean `field` over flashcp_paper's: the paper's per-configuration speedup,
// averaged as the paper averages.
double MeanSpeedup(const std::vector<Config>& configs, const std::string& baseline,
                   double Sums::*field, std::optional<Dataset> only = std::nullopt) {
  double sum = 0;
  int count = 0;
  for (const Config& c : configs) {
    if (only && c.d != *only) continue;
    sum += Mean(c.sums.at(baseline), field) / Mean(c.sums.at("flashcp_paper"), field);
    ++count;
  }
  return count == 0 ? 0 : sum / count;
}

int Paper(int64_t batches, uint64_t seed, const StepTimeOptions& step) {
  const std::vector<System> systems = {
      {"flashcp_paper", Strategy::kFlashCpPaper},
      {"llama3", Strategy::kLlama3},
      {"per_doc", Strategy::kPerDoc},
      {"ring", Strategy::kRing, true},
      {"zigzag", Strategy::kZigzag},
      {"ring_packed", Strategy::kRing},
      {"flashcp", Strategy::kFlashCp}};
  const std::vector<Dataset> datasets = {Dataset::kWlbLlm, Dataset::kPile, Dataset::kRedPajama};
  std::vector<Config> configs;
  for (Dataset d : datasets) {
    for (int32_t heads : {16, 32}) {
      for (int32_t n : {4, 8}) {
        Config c{d, heads, n, {}};
        const ModelShape shape{.heads = heads, .head_dim = 128, .dtype_bytes = 2};
        for (const Batch& b : Draw(d, kPaperContext, batches, seed, n)) {
          for (const System& sys : systems) {
            if (absl::Status st = Accumulate(sys, b, shape, step.cluster, c.sums[sys.name]);
                !st.ok()) {
              std::fprintf(stderr, "paper_step_model: %s: %s\n", sys.name.c_str(),
                           std::string(st.message()).c_str());
              return 1;
            }
          }
        }
        configs.push_back(std::move(c));
        std::fprintf(stderr, "paper_step_model: %s H=%d N=%d done\n",
                     std::string(DatasetName(d)).c_str(), heads, n);
      }
    }
  }
  const ClusterSpec& cl = step.cluster;
  std::printf("## The step-time model against the paper\n\n"
              "Paper setup (section 4, Figure 5): 128K context, WLB-LLM, Pile and RedPajama, "
              "H = 16 and 32 (Hq = Hkv), D = 128, bf16, N = 4 and 8 on one node, training "
              "(forward + backward) and inference (forward); %lld batches per configuration "
              "(seed %llu); cluster %s: NVLink %g GB/s and %g us, compute the h200-cudnn "
              "profile x %g, forward share %g, HBM %g GB/s. Each system runs its own exchange "
              "(llama3, per_doc: full-KV all-gather; ring: every document in N chunks, zigzag: "
              "in 2N, both ring attention as ring-flash-attention's varlen functions; "
              "flashcp_paper: the compacted all-gather). Speedup: a baseline's mean predicted "
              "time over flashcp_paper's, per configuration, averaged over configurations as "
              "the paper averages. \"stacked\": exchange, then compute (the paper's systems: "
              "Figure 6 times AllGather and ReduceScatter apart from the attention kernels), "
              "\"overlap\": the CUDA engine's (whole shards during the exchange); ring "
              "overlaps per hop in both. ring_packed: SPEC's ring (the packed sequence in N "
              "chunks), for reference.\n\n",
              static_cast<long long>(batches), static_cast<unsigned long long>(seed),
              step.cluster_name.empty() ? "custom" : step.cluster_name.c_str(),
              cl.nvlink_bytes_per_second / 1e9, cl.nvlink_latency_seconds * 1e6,
              cl.compute_scale, cl.forward_fraction, cl.hbm_bytes_per_second / 1e9);
  std::printf("| flashcp_paper over | paper (Figure 5 mean) | model: training + inference, "
              "stacked | model / paper | within 15%% | training, stacked | inference, stacked | "
              "training, overlap |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const std::vector<std::pair<std::string, double>> paper_rows = {
      {"llama3", 1.38}, {"per_doc", 1.63}, {"ring", 1.97}, {"zigzag", 2.14}, {"ring_packed", 1.97}};
  for (const auto& [name, paper] : paper_rows) {
    const double train = MeanSpeedup(configs, name, &Sums::step_stacked);
    const double infer = MeanSpeedup(configs, name, &Sums::forward_stacked);
    const double both = (train + infer) / 2;
    std::printf("| %s | %.2fx | %.2fx | %.2f | %s | %.2fx | %.2fx | %.2fx |\n", name.c_str(),
                paper, both, both / paper, std::abs(both / paper - 1) <= 0.15 ? "yes" : "no",
                train, infer, MeanSpeedup(configs, name, &Sums::step));
  }
  std::printf("\nPer data set, training and inference, stacked (the paper: Per-Doc and "
              "zigzag do well on WLB-LLM, worse on Pile and RedPajama):\n\n"
              "| data set | llama3 | per_doc | ring | zigzag |\n| --- | --- | --- | --- | --- |\n");
  for (Dataset d : datasets) {
    std::printf("| %s |", std::string(DatasetName(d)).c_str());
    for (const char* name : {"llama3", "per_doc", "ring", "zigzag"}) {
      std::printf(" %.2fx |", (MeanSpeedup(configs, name, &Sums::step_stacked, d) +
                               MeanSpeedup(configs, name, &Sums::forward_stacked, d)) /
                                  2);
    }
    std::printf("\n");
  }
  std::printf("\n| communication time, N = 8 | paper | model: 1 - flashcp_paper's / llama3's | "
              "per_doc's | model / paper |\n| --- | --- | --- | --- | --- |\n");
  for (const auto& [d, paper] : kPaperCommReduction) {
    double f = 0, l = 0, p = 0;
    for (const Config& c : configs) {
      if (c.d != d || c.n != 8) continue;
      f += c.sums.at("flashcp_paper").exchange;
      l += c.sums.at("llama3").exchange;
      p += c.sums.at("per_doc").exchange;
    }
    std::printf("| %s | %.1f%% | %.1f%% | %.1f%% | %.2f |\n", std::string(DatasetName(d)).c_str(),
                100 * paper, 100 * (1 - f / l), 100 * (1 - f / p), (1 - f / l) / paper);
  }
  std::printf("\nPer configuration, mean over batches, ms (one layer, training): slowest "
              "rank's compute / exposed exchange / step, overlap.\n\n| data set | H | N |");
  for (const System& sys : systems) std::printf(" %s |", sys.name.c_str());
  std::printf("\n| --- | --- | --- |");
  for (size_t i = 0; i < systems.size(); ++i) std::printf(" --- |");
  std::printf("\n");
  for (const Config& c : configs) {
    std::printf("| %s | %d | %d |", std::string(DatasetName(c.d)).c_str(), c.heads, c.n);
    for (const System& sys : systems) {
      const Sums& x = c.sums.at(sys.name);
      std::printf(" %.2f / %.2f / %.2f |", 1e3 * Mean(x, &Sums::compute),
                  1e3 * Mean(x, &Sums::exposed), 1e3 * Mean(x, &Sums::step));
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  return 0;
}

int Scale(int64_t batches, uint64_t seed, const std::vector<std::pair<int64_t, int32_t>>& cells,
          const std::vector<Dataset>& datasets, const StepTimeOptions& step) {
  const std::vector<Strategy> strategies = {Strategy::kLlama3,       Strategy::kPerDoc,
                                            Strategy::kRing,         Strategy::kZigzag,
                                            Strategy::kMagi,         Strategy::kFlashCpPaper,
                                            Strategy::kFlashCp};
  const ModelShape shape;  // H = 32, D = 128, bf16
  std::printf("\n## Predicted attention step time at scale\n\n"
              "%lld batches per cell (seed %llu), H = 32, D = 128, bf16, one layer; cluster %s, "
              "%d ranks per node (N = 8: one node); each strategy with its own exchange "
              "(flashcp: the faster of allgather and targeted; magi: targeted). Mean predicted "
              "step, ms; flashcp / best other: flashcp's over the best other strategy's (below "
              "1: flashcp fastest); flashcp by step time: PlanFlashCpByStepTime "
              "(core/step_choice.h), and it over the best other's.\n\n| data set | C | N |",
              static_cast<long long>(batches), static_cast<unsigned long long>(seed),
              step.cluster_name.empty() ? "custom" : step.cluster_name.c_str(),
              step.cluster.ranks_per_node);
  for (Strategy s : strategies) std::printf(" %s |", std::string(StrategyName(s)).c_str());
  std::printf(" flashcp / best other | flashcp by step time | it / best other |\n"
              "| --- | --- | --- |");
  for (size_t i = 0; i <= strategies.size() + 2; ++i) std::printf(" --- |");
  std::printf("\n");
  for (const auto& [context, n] : cells) {
    for (Dataset d : datasets) {
      std::map<Strategy, Sums> sums;
      Sums chosen;
      for (const Batch& b : Draw(d, context, batches, seed, n)) {
        PlanOptions base;
        base.ranks_per_node = step.cluster.ranks_per_node;
        absl::StatusOr<StepChoice> choice = PlanFlashCpByStepTime(b, base, shape, step);
        if (!choice.ok()) {
          std::fprintf(stderr, "paper_step_model: flashcp by step time: %s\n",
                       std::string(choice.status().message()).c_str());
          return 1;
        }
        chosen.step += choice->report.native().step_seconds;
        ++chosen.n;
        for (Strategy s : strategies) {
          PlanOptions options;
          options.ranks_per_node = step.cluster.ranks_per_node;
          absl::StatusOr<Plan> plan = MakePlan(s, b, options);
          absl::StatusOr<StepTimeReport> r =
              plan.ok() ? ReportStepTime(s, *plan, shape, 1, step.cluster)
                        : absl::StatusOr<StepTimeReport>(plan.status());
          if (!r.ok()) {
            std::fprintf(stderr, "paper_step_model: %s: %s\n", std::string(StrategyName(s)).c_str(),
                         std::string(r.status().message()).c_str());
            return 1;
          }
          sums[s].step += r->native().step_seconds;
          ++sums[s].n;
        }
      }
      std::printf("| %s | %lld | %d |", std::string(DatasetName(d)).c_str(),
                  static_cast<long long>(context), n);
      double best_other = 0;
      for (Strategy s : strategies) {
        const double ms = 1e3 * Mean(sums[s], &Sums::step);
        if (s != Strategy::kFlashCp && (best_other == 0 || ms < best_other)) best_other = ms;
        std::printf(" %.2f |", ms);
      }
      const double chosen_ms = 1e3 * Mean(chosen, &Sums::step);
      std::printf(" %.3f | %.2f | %.3f |\n",
                  1e3 * Mean(sums[Strategy::kFlashCp], &Sums::step) / best_other, chosen_ms,
                  chosen_ms / best_other);
      std::fflush(stdout);
      std::fprintf(stderr, "paper_step_model: scale %s C=%lld N=%d done\n",
                   std::string(DatasetName(d)).c_str(), static_cast<long long>(context), n);
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  CommandLine line;
  if (std::optional<int> rc = ParseMain(argc, argv, kUsage, line, std::cout, std::cerr)) {
    return *rc;
  }
  absl::StatusOr<int64_t> batches = IntFlagIn("batches", absl::GetFlag(FLAGS_batches), 1, 10000);
  if (!batches.ok()) return UsageError("paper_step_model", batches.status(), std::cerr);
  absl::StatusOr<int64_t> scale_batches =
      IntFlagIn("scale_batches", absl::GetFlag(FLAGS_scale_batches), 0, 10000);
  if (!scale_batches.ok()) return UsageError("paper_step_model", scale_batches.status(), std::cerr);
  absl::StatusOr<int64_t> rpn =
      IntFlagIn("ranks_per_node", absl::GetFlag(FLAGS_ranks_per_node), 1, kMaxCpSize);
  if (!rpn.ok()) return UsageError("paper_step_model", rpn.status(), std::cerr);
  // The paper's cluster unless the flags say otherwise.
  if (line.given.count("cluster") == 0) absl::SetFlag(&FLAGS_cluster, "h100-sxm");
  absl::StatusOr<StepTimeOptions> step =
      StepTimeFromFlagsOrDefault(line, static_cast<int32_t>(*rpn));
  if (!step.ok()) return UsageError("paper_step_model", step.status(), std::cerr);
  std::vector<std::pair<int64_t, int32_t>> cells;
  for (absl::string_view cell : absl::StrSplit(absl::GetFlag(FLAGS_scale_cells), ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(cell, ':');
    int64_t context = 0;
    int32_t n = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &context) ||
        !absl::SimpleAtoi(parts[1], &n) || context < 1 || context > (int64_t{1} << 24) || n < 1 ||
        n > kMaxStepTimeCpSize || n > context) {
      return UsageError("paper_step_model",
                        FlagValueError("scale_cells", "CONTEXT:N pairs (1 <= N <= 1024)", cell),
                        std::cerr);
    }
    cells.emplace_back(context, n);
  }
  std::vector<Dataset> datasets;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_scale_datasets), ',')) {
    absl::StatusOr<Dataset> d = ParseDataset(name);
    if (!d.ok()) {
      return UsageError("paper_step_model",
                        FlagValueError("scale_datasets", "wlbllm, pile or redpajama", name),
                        std::cerr);
    }
    datasets.push_back(*d);
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  // The paper's runs are on one node of 8.
  StepTimeOptions paper = *step;
  paper.cluster.ranks_per_node = 8;
  if (int rc = Paper(*batches, seed, paper); rc != 0) return rc;
  if (*scale_batches > 0) return Scale(*scale_batches, seed, cells, datasets, *step);
  return 0;
}

}  // namespace
}  // namespace flashcp::core

int main(int argc, char** argv) { return flashcp::core::Main(argc, argv); }
