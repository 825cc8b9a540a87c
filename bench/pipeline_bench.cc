// The pipeline mode's table (issue 26; docs/benchmarks.md, "Pipeline plans"):
// per data set, document cap (tokens a document is cut to), batch size
// (documents) and d_p, the simulated iteration time and worst-stage peak
// memory of DPP and of every baseline (core/pipeline.h), means over batches,
// with plan time per batch; then how often DPP's time is at most every
// feasible baseline's, and its largest excess over the best. DPP's
// checkpointing is the CBC ILP. Markdown on stdout.
//
//   build/bin/pipeline_bench [--batches K] [--seed S] [--datasets D,D...] [--caps C,C...]
//                            [--sizes N,N...] [--pps P,P...] [--ckpt_time_limit SECONDS]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/cli.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/ilp/pipeline_ckpt.h"
#include "core/pipeline.h"
#include "core/status_macros.h"

ABSL_FLAG(int64_t, batches, 2, "batches per cell, 1 to 1000");
ABSL_FLAG(uint64_t, seed, 1, "sampling seed");
ABSL_FLAG(std::string, datasets, "wlbllm,pile,redpajama", "data sets");
ABSL_FLAG(std::string, caps, "32768,131072", "per-document caps (context), tokens");
ABSL_FLAG(std::string, sizes, "64,512", "documents per batch");
ABSL_FLAG(std::string, pps, "4,8", "pipeline degrees d_p");
ABSL_FLAG(double, ckpt_time_limit, 2.0, "CBC time limit of DPP's checkpoint ILP, seconds");

namespace flashcp::core {
namespace {

absl::StatusOr<std::vector<int64_t>> Ints(absl::string_view flag, const std::string& v) {
  std::vector<int64_t> out;
  for (absl::string_view s : absl::StrSplit(v, ',')) {
    int64_t x = 0;
    if (!absl::SimpleAtoi(s, &x) || x < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad value ", s));
    }
    out.push_back(x);
  }
  return out;
}

// `n` documents of `dataset`, each cut to `cap` tokens: the documents of
// successive 4M-token samples (their truncated last one dropped).
absl::StatusOr<std::vector<int64_t>> DrawDocs(Dataset dataset, int64_t n, int64_t cap,
                                              uint64_t seed, int64_t batch) {
  std::vector<int64_t> docs;
  for (int64_t i = 0; static_cast<int64_t>(docs.size()) < n; ++i) {
    FLASHCP_ASSIGN_OR_RETURN(std::vector<int64_t> b,
                             SampleBatch(dataset, int64_t{1} << 22, seed, batch * 1000 + i));
    b.pop_back();
    for (int64_t len : b) {
      if (static_cast<int64_t>(docs.size()) < n) docs.push_back(std::min(len, cap));
    }
  }
  return docs;
}

struct Cell {
  int64_t runs = 0, fits = 0;
  double time = 0, peak = 0, plan_ms = 0;
};

int Main(int argc, char** argv) {
  CommandLine line;
  if (auto rc = ParseMain(argc, argv, "Usage: pipeline_bench [--flag=value ...]", line, std::cout,
                          std::cerr)) {
    return *rc;
  }
  const int64_t batches = absl::GetFlag(FLAGS_batches);
  if (batches < 1 || batches > 1000) {
    return UsageError("pipeline_bench", absl::InvalidArgumentError("--batches: 1 to 1000"),
                      std::cerr);
  }
  std::vector<Dataset> datasets;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_datasets), ',')) {
    auto d = DatasetFromFlag(s);
    if (!d.ok()) return UsageError("pipeline_bench", d.status(), std::cerr);
    datasets.push_back(*d);
  }
  auto caps = Ints("caps", absl::GetFlag(FLAGS_caps));
  auto sizes = Ints("sizes", absl::GetFlag(FLAGS_sizes));
  auto pps = Ints("pps", absl::GetFlag(FLAGS_pps));
  for (const auto* v : {&caps, &sizes, &pps}) {
    if (!v->ok()) return UsageError("pipeline_bench", v->status(), std::cerr);
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const PipelineRequest defaults;
  std::printf("Model LLaMA-2-7B shape (L = %d, D = %d, D_kv = %d, F = %d, V = %d), d_s = 1, "
              "budget %.0f GiB per GPU, profile \"%s\" (an analytic estimate, not a fit); "
              "%lld batches per cell, seed %llu. Time: simulated iteration seconds; peak: worst "
              "stage's simulated peak memory, GiB; OOM: no plan of the strategy fits; ms: plan "
              "time per batch on this machine.\n",
              defaults.model.layers, defaults.model.hidden, defaults.model.kv_hidden,
              defaults.model.ffn_hidden, defaults.model.vocab,
              defaults.memory_budget_bytes / (1 << 30), std::string(kDefaultPipelineProfile).c_str(),
              static_cast<long long>(batches), static_cast<unsigned long long>(seed));
  int64_t compared = 0, dpp_best = 0, dpp_fail = 0;
  double worst_excess = 0;
  for (Dataset d : datasets) {
    std::printf("\n### %s\n\n(%s)\n\n| cap | docs | d_p |", std::string(DatasetName(d)).c_str(),
                std::string(DatasetAssumptions(d)).c_str());
    for (PipelineStrategy s : kAllPipelineStrategies) {
      std::printf(" %s s / GiB / ms |", std::string(PipelineStrategyName(s)).c_str());
    }
    std::printf("\n|---|---|---|");
    for (size_t i = 0; i < std::size(kAllPipelineStrategies); ++i) std::printf("---|");
    std::printf("\n");
    for (int64_t cap : *caps) {
      for (int64_t n : *sizes) {
        for (int64_t pp : *pps) {
          std::map<PipelineStrategy, Cell> cells;
          for (int64_t b = 0; b < batches; ++b) {
            auto docs = DrawDocs(d, n, cap, seed, b);
            if (!docs.ok()) {
              std::cerr << "pipeline_bench: " << docs.status() << "\n";
              return 1;
            }
            PipelineRequest req;
            req.doc_lens = *docs;
            req.pp_size = static_cast<int32_t>(pp);
            std::map<PipelineStrategy, double> times;
            std::map<PipelineStrategy, std::string> shapes;  // for the losses on stderr
            for (PipelineStrategy s : kAllPipelineStrategies) {
              PipelineOptions o;
              o.strategy = s;
              o.ckpt_solver = ilp::SolvePipelineCkpt;
              o.ckpt.time_limit_seconds = absl::GetFlag(FLAGS_ckpt_time_limit);
              const auto t0 = std::chrono::steady_clock::now();
              auto plan = PlanPipeline(req, o);
              const double ms = std::chrono::duration<double, std::milli>(
                                    std::chrono::steady_clock::now() - t0)
                                    .count();
              Cell& c = cells[s];
              ++c.runs;
              c.plan_ms += ms;
              if (!plan.ok()) {
                if (plan.status().code() != absl::StatusCode::kFailedPrecondition) {
                  std::cerr << "pipeline_bench: " << PipelineStrategyName(s) << ": "
                            << plan.status() << "\n";
                  return 1;
                }
                continue;
              }
              ++c.fits;
              c.time += plan->prediction.iteration_s;
              c.peak += *std::max_element(plan->prediction.stage_peak_bytes.begin(),
                                          plan->prediction.stage_peak_bytes.end());
              times[s] = plan->prediction.iteration_s;
              shapes[s] = absl::StrFormat(
                  "K %d, %d chunks, %d pipelines, bubble %.2f%%, recompute %.4f s, ckpt %s",
                  plan->slice_count, plan->chunks.size(), plan->pipelines.size(),
                  100 * plan->prediction.bubble_share, plan->prediction.recompute_s,
                  plan->ckpt_solver);
            }
            if (!times.count(PipelineStrategy::kDpp)) {
              ++dpp_fail;
              continue;
            }
            double best = std::numeric_limits<double>::infinity();
            PipelineStrategy best_s = PipelineStrategy::kDpp;
            for (const auto& [s, t] : times) {
              if (s != PipelineStrategy::kDpp && t < best) {
                best = t;
                best_s = s;
              }
            }
            ++compared;
            const double dpp = times[PipelineStrategy::kDpp];
            if (dpp <= best) {
              ++dpp_best;
            } else {
              // Each batch DPP loses, on stderr, so the table stays clean.
              std::fprintf(stderr, "dpp loses: %s cap %lld docs %lld d_p %lld batch %lld: dpp %.6f s, %s %.6f s (+%.3f%%)\n",
                           std::string(DatasetName(d)).c_str(), static_cast<long long>(cap),
                           static_cast<long long>(n), static_cast<long long>(pp),
                           static_cast<long long>(b), dpp,
                           std::string(PipelineStrategyName(best_s)).c_str(), best,
                           100 * (dpp / best - 1));
              std::fprintf(stderr, "  dpp: %s\n  %s: %s\n", shapes[PipelineStrategy::kDpp].c_str(),
                           std::string(PipelineStrategyName(best_s)).c_str(), shapes[best_s].c_str());
              std::fprintf(stderr, "  doc_lens: %s\n", absl::StrJoin(*docs, ",").c_str());
            }
            worst_excess = std::max(worst_excess, dpp / std::min(best, dpp) - 1);
          }
          std::printf("| %lldK | %lld | %lld |", static_cast<long long>(cap / 1024),
                      static_cast<long long>(n), static_cast<long long>(pp));
          for (PipelineStrategy s : kAllPipelineStrategies) {
            const Cell& c = cells[s];
            if (c.fits < c.runs) {
              std::printf(" OOM %lld/%lld / %.0f |", static_cast<long long>(c.runs - c.fits),
                          static_cast<long long>(c.runs), c.plan_ms / c.runs);
            } else {
              std::printf(" %.3f / %.1f / %.0f |", c.time / c.fits, c.peak / c.fits / (1 << 30),
                          c.plan_ms / c.runs);
            }
          }
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("\nDPP's simulated time at most every feasible baseline's: %lld of %lld batches "
              "(%.1f%%); largest excess over the best baseline: %.2f%%; batches where DPP found "
              "no plan: %lld.\n",
              static_cast<long long>(dpp_best), static_cast<long long>(compared),
              compared ? 100.0 * dpp_best / compared : 0.0, 100 * worst_excess,
              static_cast<long long>(dpp_fail));
  return 0;
}

}  // namespace
}  // namespace flashcp::core

int main(int argc, char** argv) { return flashcp::core::Main(argc, argv); }
