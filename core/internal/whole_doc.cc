// The paper's planners: Whole-Doc sharding (SPEC "Strategies the paper
// compares") and FlashCP's heuristic, Algorithm 1 as the paper states it.
#include <algorithm>
#include <vector>

#include "core/internal/flashcp_pieces.h"
#include "core/internal/per_doc.h"
#include "core/internal/strategies_internal.h"
#include "core/internal/whole_doc_place.h"

namespace flashcp::core::internal {

Plan PlanWholeDoc(const Batch& batch) {
  std::vector<double> workload(batch.cp_size, 0.0);
  std::vector<Shard> pieces;
  WholeDocPieces(batch, DocsLongestFirst(batch), RankTargets(batch), workload, pieces);
  return FinishPlan(batch, std::move(pieces));
}

// Algorithm 1. D sorted longest first; while the combined plan's imbalance
// exceeds R, the longest document still in D moves to the Per-Doc set, and
// Whole-Doc sharding is redone on the rest (lines 5-16). Interpretation, where
// the paper is silent:
//  - Cur R (line 18) is the imbalance of the plan that runs: the Per-Doc
//    pieces plus tmp P. Whole-Doc placement therefore starts from the Per-Doc
//    pieces' per-rank workload, and fills each rank to its canonical token
//    count minus what the Per-Doc pieces already gave it (never negative: see
//    PerDocPieces' token counts against RankRealTokens).
//  - When D runs empty the plan is all Per-Doc and the loop stops, whatever
//    its imbalance (the paper's loop would pop an empty D).
Plan PlanFlashCpPaper(const Batch& batch, double target_imbalance) {
  const int32_t n = batch.cp_size;
  const std::vector<int32_t> order = DocsLongestFirst(batch);
  const std::vector<int64_t> targets = RankTargets(batch);
  std::vector<int32_t> per_doc;
  WholeDocScratch scratch;  // reused by every round
  for (size_t k = 0;; ++k) {
    std::vector<Shard> pieces = PerDocPieces(batch, per_doc);
    std::vector<int64_t> need = targets;
    for (const Shard& s : pieces) need[s.rank] -= s.len;
    std::vector<double> workload = PieceWorkloads(n, pieces);
    const std::vector<int32_t> rest(order.begin() + static_cast<std::ptrdiff_t>(k), order.end());
    WholeDocPieces(batch, rest, need, workload, pieces, {}, scratch);
    double total = 0, max_w = 0;
    for (double w : workload) {
      total += w;
      max_w = std::max(max_w, w);
    }
    const double cur_r = max_w / (total / n);
    if (cur_r <= target_imbalance || rest.empty()) return FinishPlan(batch, std::move(pieces));
    per_doc.push_back(order[k]);
  }
}

}  // namespace flashcp::core::internal
