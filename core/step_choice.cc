#include "core/step_choice.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/cost_model.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

struct Candidate {
  const char* name;
  Strategy strategy;
  PlanOptions options;
};

double ComputeImbalance(const StepTimePrediction& p) {
  std::vector<double> c;
  c.reserve(p.ranks.size());
  for (const RankStepTime& r : p.ranks) c.push_back(r.forward_compute + r.backward_compute);
  return MaxOverMean(c);
}

}  // namespace

absl::StatusOr<StepChoice> PlanFlashCpByStepTime(const Batch& batch, const PlanOptions& options,
                                                 const ModelShape& shape,
                                                 const StepTimeOptions& step) {
  const double r = options.target_imbalance;
  std::vector<Candidate> candidates;
  candidates.push_back({"flashcp", Strategy::kFlashCp, options});
  if (IsPairsModel(options.cost)) {
    Candidate c{"flashcp_cost", Strategy::kFlashCp, options};
    c.options.cost = step.cluster.compute;
    c.options.rank_speed.clear();
    candidates.push_back(std::move(c));
  }
  {
    Candidate c{"flashcp_tight", Strategy::kFlashCp, options};
    c.options.target_imbalance = 1 + (r - 1) / 2;
    candidates.push_back(std::move(c));
  }
  {
    Candidate c{"flashcp_coarse", Strategy::kFlashCp, options};
    c.options.min_shard_tokens = 1024;
    candidates.push_back(std::move(c));
  }
  if (options.ranks_per_node != 0) {
    Candidate c{"flashcp_flat", Strategy::kFlashCp, options};
    c.options.ranks_per_node = 0;
    candidates.push_back(std::move(c));
  }
  {
    Candidate c{"flashcp_fine", Strategy::kFlashCp, options};
    c.options.min_shard_tokens = 0;
    candidates.push_back(std::move(c));
  }
  candidates.push_back({"flashcp_paper", Strategy::kFlashCpPaper, options});
  candidates.push_back({"whole_doc", Strategy::kWholeDoc, options});
  candidates.push_back({"per_doc", Strategy::kPerDoc, options});

  StepChoice best;
  double best_seconds = 0, guard_pairs = 0, guard_compute = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    FLASHCP_RETURN_IF_ERROR(options.stop.Check());
    const Candidate& c = candidates[i];
    FLASHCP_ASSIGN_OR_RETURN(Plan plan, MakePlan(c.strategy, batch, c.options));
    FLASHCP_ASSIGN_OR_RETURN(StepTimeReport report,
                             ReportStepTime(Strategy::kFlashCp, plan, shape, step.layers,
                                            step.cluster, step.cluster_name));
    double work_sum = 0, work_max = 0;
    {
      std::vector<double> work(plan.cp_size, 0.0);
      for (const Shard& s : plan.shards) work[s.rank] += ShardWorkload(s.start, s.len);
      for (double w : work) {
        work_sum += w;
        work_max = std::max(work_max, w);
      }
    }
    const double pairs_imbalance =
        work_sum > 0 ? work_max * plan.cp_size / work_sum : 1.0;
    const double compute_imbalance = ComputeImbalance(report.native());
    ++best.candidates;
    if (i == 0) {
      guard_pairs = std::max(r, pairs_imbalance);
      guard_compute = std::max(r, compute_imbalance);
    } else if (pairs_imbalance > guard_pairs && compute_imbalance > guard_compute) {
      continue;
    }
    ++best.eligible;
    const double seconds = report.native().step_seconds;
    if (i == 0 || seconds < best_seconds) {
      best_seconds = seconds;
      best.plan = std::move(plan);
      best.report = std::move(report);
      best.variant = c.name;
    }
  }
  return best;
}

}  // namespace flashcp::core
