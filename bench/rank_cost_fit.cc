// Fits the rank cost model (core/cost_model.h) to the CPU engine: for each
// data-set batch and strategy, times every rank's attention forward +
// backward (worker/attention_cpu, fp32, one kernel thread, in this process:
// no communication, so only compute is timed; thread CPU time), best of
// --reps, and fits
//   seconds = a*whole_pairs + b*prefixed_pairs + c*sequences + d*tokens
// with core::FitCostModel. Prints one line per model with its in-sample error
// and the fitted coefficients (docs/planner.md, "Cost model"). With --reps >= 2
// it also prints the noise of the flashcp plans' ranks timed repeatedly: the
// mean per-rep imbalance against the imbalance of the mean times.
//
//   rank_cost_fit [--dataset pile] [--context 4096] [--cp 4] [--batches 12]
//                 [--heads 2] [--head_dim 32] [--reps 3] [--seed 1]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/thread_cpu.h"
#include "core/cost_model.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/strategies.h"
#include "core/types.h"
#include "worker/attention_cpu.h"
#include "worker/thread_pool.h"

ABSL_FLAG(std::string, dataset, "pile", "wlbllm, pile or redpajama");
ABSL_FLAG(int64_t, context, 4096, "tokens per batch");
ABSL_FLAG(int64_t, cp, 4, "ranks in the CP group");
ABSL_FLAG(int64_t, batches, 12, "sampled batches");
ABSL_FLAG(int64_t, heads, 2, "attention heads");
ABSL_FLAG(int64_t, head_dim, 32, "head dimension");
ABSL_FLAG(int64_t, reps, 3, "timed runs per rank; the fastest counts");
ABSL_FLAG(uint64_t, seed, 1, "sampling seed");

namespace {

using namespace flashcp;  // NOLINT: a tool's main file


// Forward + backward thread CPU seconds of one rank's shards, once per rep: each shard
// attends to its document's keys [0, start + len). Empty on a kernel error.
std::vector<double> TimeRank(const core::Plan& plan, int32_t rank, int heads, int head_dim,
                             int reps, worker::ThreadPool& pool) {
  const int64_t hd = int64_t{heads} * head_dim;
  int64_t rows = 0, kv_total = 0;
  for (const core::Shard& s : plan.shards) {
    if (s.rank != rank) continue;
    rows += s.len;
    kv_total += s.start + s.len;
  }
  std::vector<float> q(rows * hd, 0.01f), o(rows * hd), lse(rows * heads), dout(rows * hd, 0.02f),
      dq(rows * hd), kv(kv_total * hd, 0.03f), dkv(2 * kv_total * hd);
  std::vector<worker::DocAttention> docs;
  int64_t row = 0, kv_off = 0;
  for (const core::Shard& s : plan.shards) {
    if (s.rank != rank) continue;
    worker::DocAttention d;
    d.k = kv.data() + kv_off * hd;
    d.v = kv.data() + kv_off * hd;
    d.kv_len = s.start + s.len;
    d.queries = {{row, s.start, s.len}};
    d.dk = dkv.data() + kv_off * hd;
    d.dv = dkv.data() + (kv_total + kv_off) * hd;
    docs.push_back(d);
    row += s.len;
    kv_off += s.start + s.len;
  }
  const worker::AttentionShape shape{heads, head_dim, 1.0f / std::sqrt(float(head_dim))};
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const double t0 = bench::ThreadCpuSeconds();
    if (!worker::AttentionForwardCpu(shape, docs, rows, q.data(), o.data(), lse.data(), pool)
             .ok() ||
        !worker::AttentionBackwardCpu(shape, docs, rows, q.data(), o.data(), lse.data(),
                                      dout.data(), dq.data(), pool)
             .ok()) {
      return {};
    }
    times.push_back(bench::ThreadCpuSeconds() - t0);
  }
  return times;
}

// The measurement noise of one plan's ranks timed `reps` times each (times[rank][rep]):
// rep k of every rank is one "step" of the same plan.
struct Noise {
  double step_imbalance = 0;  // mean over reps of max/mean over ranks
  double mean_imbalance = 0;  // max/mean over ranks of the ranks' mean times
  double cv = 0;              // mean over ranks of the reps' std / mean
};
Noise MeasureNoise(const std::vector<std::vector<double>>& times) {
  Noise n;
  const size_t reps = times.empty() ? 0 : times[0].size();
  if (reps < 2) return n;
  std::vector<double> mean(times.size(), 0.0);
  for (size_t k = 0; k < reps; ++k) {
    std::vector<double> step;
    for (size_t r = 0; r < times.size(); ++r) {
      step.push_back(times[r][k]);
      mean[r] += times[r][k] / static_cast<double>(reps);
    }
    n.step_imbalance += core::MaxOverMean(step) / static_cast<double>(reps);
  }
  n.mean_imbalance = core::MaxOverMean(mean);
  for (size_t r = 0; r < times.size(); ++r) {
    double var = 0;
    for (const double t : times[r]) var += (t - mean[r]) * (t - mean[r]);
    n.cv += std::sqrt(var / static_cast<double>(reps - 1)) / mean[r] /
            static_cast<double>(times.size());
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  core::CommandLine line;
  if (std::optional<int> rc = core::ParseMain(
          argc, argv,
          "Usage: rank_cost_fit [--flag=value ...]\n\nPer-rank CPU attention time against the "
          "cost model's features, fitted (docs/planner.md, \"Cost model\").",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  absl::StatusOr<core::Dataset> dataset = core::DatasetFromFlag(absl::GetFlag(FLAGS_dataset));
  if (!dataset.ok()) return core::UsageError("rank_cost_fit", dataset.status(), std::cerr);
  int64_t context = 0, cp = 0, batches = 0, heads = 0, head_dim = 0, reps = 0;
  const std::pair<const char*, int64_t*> positive[] = {{"context", &context},   {"cp", &cp},
                                                       {"batches", &batches},   {"heads", &heads},
                                                       {"head_dim", &head_dim}, {"reps", &reps}};
  const absl::Flag<int64_t>* const flags[] = {&FLAGS_context, &FLAGS_cp,       &FLAGS_batches,
                                              &FLAGS_heads,   &FLAGS_head_dim, &FLAGS_reps};
  for (size_t i = 0; i < std::size(positive); ++i) {
    absl::StatusOr<int64_t> v =
        core::IntFlagIn(positive[i].first, absl::GetFlag(*flags[i]), 1, core::kMaxTokens);
    if (!v.ok()) return core::UsageError("rank_cost_fit", v.status(), std::cerr);
    *positive[i].second = *v;
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  worker::ThreadPool pool(1);
  std::vector<core::CostSample> samples;
  Noise noise;  // sums over the flashcp plans
  int noise_plans = 0;
  const core::Strategy strategies[] = {core::Strategy::kLlama3, core::Strategy::kPerDoc,
                                       core::Strategy::kWholeDoc, core::Strategy::kFlashCp,
                                       core::Strategy::kMagi};
  for (int64_t b = 0; b < batches; ++b) {
    absl::StatusOr<std::vector<int64_t>> docs = core::SampleBatch(*dataset, context, seed, b);
    if (!docs.ok()) return 1;
    for (core::Strategy s : strategies) {
      absl::StatusOr<core::Plan> plan =
          core::MakePlan(s, core::Batch{*docs, static_cast<int32_t>(cp)});
      if (!plan.ok()) return 1;
      const std::vector<core::RankFeatures> f = core::PlanRankFeatures(*plan);
      std::vector<std::vector<double>> times;
      for (int32_t r = 0; r < plan->cp_size; ++r) {
        times.push_back(TimeRank(*plan, r, int(heads), int(head_dim), int(reps), pool));
        if (times.back().empty()) return 1;
        samples.push_back({f[r], *std::min_element(times.back().begin(), times.back().end())});
      }
      // The noise figures of the balanced plans only (where a per-step max of
      // noisy times is what the measured imbalance is made of).
      if (s == core::Strategy::kFlashCp && reps >= 2) {
        const Noise n = MeasureNoise(times);
        noise.step_imbalance += n.step_imbalance;
        noise.mean_imbalance += n.mean_imbalance;
        noise.cv += n.cv;
        ++noise_plans;
      }
    }
  }
  std::printf("%zu rank timings: %s, C = %lld, N = %lld, H = %lld, D = %lld, best of %lld\n",
              samples.size(), absl::GetFlag(FLAGS_dataset).c_str(), (long long)context,
              (long long)cp, (long long)heads, (long long)head_dim, (long long)reps);
  if (noise_plans > 0) {
    // Same plan, same ranks, timed `reps` times: the per-step max over
    // ranks of noisy times exceeds the imbalance of their means by the
    // noise alone (docs/workers.md, "Calibration").
    const double k = noise_plans;
    std::printf(
        "noise, flashcp plans (%d, %lld reps each): per-rep imbalance %.4f, imbalance of mean "
        "times %.4f, bias %+.4f; rank time CV %.2f%%\n",
        noise_plans, (long long)reps, noise.step_imbalance / k, noise.mean_imbalance / k,
        (noise.step_imbalance - noise.mean_imbalance) / k, 100 * noise.cv / k);
  }
  // The pairs-only model beside the full one: a*pairs, by least squares.
  double xy = 0, xx = 0, err = 0;
  for (const core::CostSample& s : samples) {
    const double p = s.features.whole_pairs + s.features.prefixed_pairs;
    xy += p * s.seconds;
    xx += p * p;
  }
  for (const core::CostSample& s : samples) {
    const double p = (s.features.whole_pairs + s.features.prefixed_pairs) * xy / xx;
    err += std::abs(p - s.seconds) / s.seconds;
  }
  std::printf("pairs only: a %.4g s/pair, mean |rel err| %.2f%%\n", xy / xx,
              100 * err / double(samples.size()));
  absl::StatusOr<core::CostFit> fit = core::FitCostModel(samples);
  if (!fit.ok()) {
    std::printf("full model: not fitted: %s\n", fit.status().ToString().c_str());
    return 1;
  }
  const core::CostCoefficients& c = fit->coefficients;
  std::printf(
      "full model: a %.4g b %.4g c %.4g d %.4g (s per pair, pair, sequence, token); "
      "mean |rel err| %.2f%% over %lld inliers of %lld; condition %.3g\n",
      c.whole_pair, c.prefixed_pair, c.sequence, c.token, 100 * fit->mean_abs_rel_error,
      (long long)fit->inliers, (long long)fit->samples, fit->condition);
  return 0;
}
