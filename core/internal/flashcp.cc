// FlashCP, our planner (docs/planner.md): workload-budgeted placement with
// closed-form cut points, a Per-Doc fallback for documents too long to
// balance, and a small candidate search scored on imbalance, then
// communication, then cuts.
#include <algorithm>
#include <vector>

#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {
namespace {

bool Better(const PlanScore& a, const PlanScore& b, double target) {
  const bool fa = a.imbalance <= target, fb = b.imbalance <= target;
  if (fa != fb) return fa;
  if (!fa) return a.imbalance < b.imbalance;
  if (a.max_nonlast != b.max_nonlast) return a.max_nonlast < b.max_nonlast;
  return a.cut_docs < b.cut_docs;
}

}  // namespace

Plan PlanFlashCp(const Batch& batch, const PlanOptions& options) {
  const double target = options.target_imbalance;
  const std::vector<int32_t> order = DocsLongestFirst(batch);
  const std::vector<int64_t> targets = RankTargets(batch);
  std::vector<Shard> best_pieces;
  PlanScore best_score;
  bool have = false;
  // Density scale of the workload that token equalization moves: a median
  // document's workload per token.
  const double median_density =
      (static_cast<double>(batch.doc_lens[order[order.size() / 2]]) + 1.0) / 2.0;
  // Every Whole-Doc variant with the k longest documents zigzagged (Per-Doc);
  // keeps the best plan seen and returns true if one of these meets the target.
  const auto try_k = [&](size_t k) {
    const auto split = order.begin() + static_cast<std::ptrdiff_t>(k);
    const std::vector<Shard> zig = PerDocPieces(batch, std::vector<int32_t>(order.begin(), split));
    const std::vector<int32_t> rest(split, order.end());
    std::vector<int64_t> need = targets;
    for (const Shard& s : zig) need[s.rank] -= s.len;
    const std::vector<double> zig_workload = PieceWorkloads(batch.cp_size, zig);
    bool feasible = false;
    // rho = 0 is plain LPT; larger rho anticipates the workload that
    // equalization moves. Whole moves always: they never cost communication
    // and (measured, docs/planner.md) head-only equalization never won.
    for (double scale : {0.0, 0.5, 1.0, 2.0}) {
      std::vector<Shard> pieces = zig;
      std::vector<double> workload = zig_workload;
      WholeDocPieces(batch, rest, need, workload, pieces,
                     WholeDocOptions{scale * median_density, true});
      const PlanScore score = ScorePieces(batch, pieces);
      if (!have || Better(score, best_score, target)) {
        best_pieces = std::move(pieces);
        best_score = score;
        have = true;
      }
      feasible |= score.imbalance <= target;
    }
    return feasible;
  };
  // Fewer Per-Doc documents means less communication; imbalance mostly falls
  // as k grows. Gallop k = 0, 1, 2, 4, ... to the first feasible count, then
  // bisect between it and the last infeasible one: O(log n) steps, not n.
  if (!try_k(0)) {
    const size_t n_docs = order.size();
    size_t lo = 0, hi = 1;  // try_k(lo) was infeasible
    while (hi < n_docs && !try_k(hi)) {
      lo = hi;
      hi = std::min(n_docs, hi * 2);
    }
    if (hi == n_docs) try_k(n_docs);
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      if (try_k(mid)) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
  }
  return FinishPlan(batch, std::move(best_pieces));
}

}  // namespace flashcp::core::internal
