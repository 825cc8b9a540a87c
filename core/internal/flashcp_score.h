// flashcp's score stage: what candidate plans are compared by, cheap enough
// to run on every candidate of a search. Pure functions over plain data.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_SCORE_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_SCORE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace flashcp::core::internal {

// What the planners compare candidate plans by; cheap, for valid plans.
struct PlanScore {
  double imbalance = 1.0;     // max / mean workload
  int64_t max_nonlast = 0;    // max over ranks of non-last tokens (SPEC Eq. 5)
  int64_t cut_docs = 0;       // documents in more than one shard
  int64_t min_cut_len = 0;    // shortest shard of a cut document; 0 if none
  int64_t slivers = 0;        // cut pieces shorter than the minimum shard (flashcp)
};
PlanScore ScorePlan(const Plan& plan);
// ScorePlan's imbalance from per-rank workloads (SPEC Eq. 3 pairs): max /
// (sum / N), summed in rank order; 1 where all are 0.
double WorkloadImbalance(const std::vector<double>& workload);
// Whether ScorePlan(FinishPlan(batch, pieces)).imbalance is certainly above
// `limit`, told without the plan from `workload`: each rank's workload of
// `pieces` (SPEC Eq. 3 pairs), summed in any order and over any split or
// merge of the pieces. Exactly that while the batch's whole workload is
// below 2^53, but for a relative margin of 1e-9 left to the plan's own
// check; false (not known) above.
bool ImbalanceCertainlyOver(const Batch& batch, const std::vector<double>& workload,
                            double limit);
// The same on raw pieces (as FinishPlan takes them), without building a plan.
// Exact when no two touching pieces of a document share a rank, else it
// counts a merged shard as several (a tie-breaking score, never a metric).
PlanScore ScorePieces(const Batch& batch, const std::vector<Shard>& pieces);

// base + n * cost for non-negative terms, saturating at INT64_MAX: cost is
// 8m with m up to 2^40, and a full 2N-chunk zigzag can hold millions of
// slivers.
int64_t SaturatingCost(int64_t base, int64_t n, int64_t cost);

// The compacted planner's order on candidates: first the target, then
// communication with each remaining sliver charged `sliver_cost`
// non-last tokens (docs/planner.md, "Minimum shard"), then cuts; when
// nothing meets the target, least imbalance. True if `a` is strictly better.
bool Better(const PlanScore& a, const PlanScore& b, double target, int64_t sliver_cost);

// Equal in everything Better compares (min_cut_len aside): how the fallback
// tells a candidate it already holds, and the winner, apart.
bool SameScore(const PlanScore& a, const PlanScore& b);

// Per-rank non-last tokens, cut documents and shortest cut piece of raw
// pieces, summed over calls of AddPieces: a candidate's score built from
// parts (a Per-Doc part shared by many candidates, then each candidate's
// own). Exact where no document's pieces are split between two calls and no
// two touching pieces of a document share a rank.
struct PartialScore {
  std::vector<int64_t> nonlast;
  int64_t cut_docs = 0;
  int64_t min_cut_len = 0;
};
void AddPieces(const Batch& batch, const std::vector<Shard>& pieces, PartialScore& p);

// Shards shorter than m of documents cut into several (slivers) in a plan.
int64_t CountSlivers(const Plan& plan, int64_t m);

// One phase's bytes in tokens under the cheaper of the two sharding-aware
// exchanges (full KV never moves less than the compacted all-gather).
struct Exchange {
  int64_t allgather = 0;  // max non-last tokens x (N - 1)
  int64_t targeted = 0;   // max over ranks of max(send, receive)
  int64_t cheaper() const { return std::min(allgather, targeted); }
};
// The compacted all-gather's phase tokens from a plan's score alone
// (Exchange::allgather), for N ranks.
int64_t AllgatherTokens(const PlanScore& score, int32_t n);
// `score` is ScorePlan(plan).
Exchange Measure(const Plan& plan, const PlanScore& score);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_SCORE_H_
