#include "core/internal/flashcp_score.h"

#include <algorithm>
#include <limits>

#include "core/analysis.h"
#include "core/internal/flashcp_pieces.h"

namespace flashcp::core::internal {

PlanScore ScorePieces(const Batch& batch, const std::vector<Shard>& pieces) {
  const int32_t n = batch.cp_size;
  PartialScore part{std::vector<int64_t>(n, 0), 0, 0};
  AddPieces(batch, pieces, part);
  PlanScore score;
  score.imbalance = WorkloadImbalance(PieceWorkloads(n, pieces));
  score.max_nonlast = *std::max_element(part.nonlast.begin(), part.nonlast.end());
  score.cut_docs = part.cut_docs;
  score.min_cut_len = part.min_cut_len;
  return score;
}

double WorkloadImbalance(const std::vector<double>& workload) {
  double total = 0, max_w = 0;
  for (double x : workload) {
    total += x;
    max_w = std::max(max_w, x);
  }
  return total > 0 ? max_w / (total / static_cast<double>(workload.size())) : 1.0;
}

bool ImbalanceCertainlyOver(const Batch& batch, const std::vector<double>& workload,
                            double limit) {
  // ScorePlan's imbalance is WorkloadImbalance of its per-rank sums of
  // ShardWorkload over the plan's shards. Each term is an integer, and while
  // the batch's whole workload W(0, total tokens) is below 2^53 every sum of
  // terms of disjoint token ranges is an exact double (WorkloadsExact): in
  // any order, however the ranges were split or merged (W(a, s) + W(a + s,
  // t) = W(a, s + t)). `workload`, sums and differences
  // of such terms whose every intermediate is the workload of the ranges
  // then on one rank (WholeDocPieces' tracking), then equals ScorePlan's
  // sums bit for bit, and so does the imbalance. The margin only leaves a
  // near tie to the plan's own check, should a caller's sums ever stop
  // being exact.
  constexpr double kMargin = 1e-9;
  if (!WorkloadsExact(TotalTokens(batch.doc_lens))) return false;
  return WorkloadImbalance(workload) > limit * (1 + kMargin);
}

PlanScore ScorePlan(const Plan& plan) {
  return ScorePieces(Batch{plan.doc_lens, plan.cp_size}, plan.shards);
}

int64_t SaturatingCost(int64_t base, int64_t n, int64_t cost) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (n > 0 && cost > (kMax - base) / n) return kMax;
  return base + n * cost;
}

bool Better(const PlanScore& a, const PlanScore& b, double target, int64_t sliver_cost) {
  const bool fa = a.imbalance <= target, fb = b.imbalance <= target;
  if (fa != fb) return fa;
  if (!fa) return a.imbalance < b.imbalance;
  const int64_t ca = SaturatingCost(a.max_nonlast, a.slivers, sliver_cost);
  const int64_t cb = SaturatingCost(b.max_nonlast, b.slivers, sliver_cost);
  if (ca != cb) return ca < cb;
  return a.cut_docs < b.cut_docs;
}

bool SameScore(const PlanScore& a, const PlanScore& b) {
  return a.imbalance == b.imbalance && a.max_nonlast == b.max_nonlast &&
         a.cut_docs == b.cut_docs && a.slivers == b.slivers;
}

void AddPieces(const Batch& batch, const std::vector<Shard>& pieces, PartialScore& p) {
  for (const Shard& s : pieces) {
    if (s.len == 0) continue;
    const int64_t len = batch.doc_lens[s.doc];
    if (s.start + s.len < len) p.nonlast[s.rank] += s.len;
    if (s.len < len) {
      if (s.start == 0) ++p.cut_docs;
      if (p.min_cut_len == 0 || s.len < p.min_cut_len) p.min_cut_len = s.len;
    }
  }
}

int64_t CountSlivers(const Plan& plan, int64_t m) {
  std::vector<int32_t> count(plan.doc_lens.size(), 0);
  for (const Shard& s : plan.shards) ++count[s.doc];
  int64_t slivers = 0;
  for (const Shard& s : plan.shards) {
    if (count[s.doc] > 1 && s.len < m) ++slivers;
  }
  return slivers;
}

int64_t AllgatherTokens(const PlanScore& score, int32_t n) { return score.max_nonlast * (n - 1); }

Exchange Measure(const Plan& plan, const PlanScore& score) {
  return Exchange{AllgatherTokens(score, plan.cp_size), TargetedPhaseBottleneck(plan)};
}

}  // namespace flashcp::core::internal
