// Re-cutting a plan's cut documents by linear programming (CLP): the same
// pieces on the same ranks in the same order, with the cut points moved so
// that every rank holds its exact tokens and the heaviest rank is as light as
// the program finds. flashcp's fallback uses it when no repaired candidate is
// free of slivers within R (docs/planner.md, "Re-cut").
#ifndef FLASHCP_CORE_INTERNAL_RECUT_H_
#define FLASHCP_CORE_INTERNAL_RECUT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "core/cost_model.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Bounds the program: above this many cut points RecutPieces does nothing.
// A solve's time grows about quadratically with them (docs/planner.md,
// "Complexity"); this keeps the re-cut within flashcp's latency budget.
inline constexpr int64_t kMaxRecutCuts = 256;

// `pieces` are raw pieces that cover every document of `batch` exactly once
// (as FinishPlan takes them; they are merged first). Moves the cut points
// between consecutive pieces of each cut document so that
//  - rank r holds exactly RankRealTokens(total, N, r) tokens,
//  - every piece of a cut document keeps at least max(min_shard, 1) tokens,
//  - the maximum rank workload (SPEC Eq. 3) is minimized: a linear program
//    with each piece's workload W(a, e - a) = Q(e) - Q(a), Q(x) = x(x+1)/2,
//    linearized at the current cut points and solved again at each solution
//    while the exact maximum falls, at most `rounds` times (Q is convex: the
//    linearization's error is (x - x0)^2 / 2 per moved endpoint, and the
//    program's many optima pin only the heaviest rank, so a round need not
//    improve); the best cut points are rounded and the rounding's token
//    errors moved back by ShiftPiecesToRoom.
// With a cost model other than pairs, the objective is the model's rank cost
// instead: each piece's pairs weighted by a (a piece starting at 0) or b, and
// the per-sequence and per-token terms, which no cut point changes, as
// per-rank constants. The pairs model (the default) is SPEC Eq. 3 exactly.
// With `rank_speed` (one per rank, core::ValidateRankSpeeds; empty: all 1)
// rank r's cost, in the program and in the result, is rank_speed[r] times
// the model's.
// Which rank holds each piece and the pieces' order in each document stay.
// Returns the maximum rank workload (cost) of the result, exact, and replaces
// `pieces` (merged shards) only when it is below `accept_below`; otherwise
// (also when the program is infeasible, CLP fails or there are more than
// kMaxRecutCuts cut points) returns nullopt and leaves `pieces` as they were.
std::optional<double> RecutPieces(const Batch& batch, std::vector<Shard>& pieces,
                                  int64_t min_shard, int32_t rounds, double accept_below,
                                  const CostCoefficients& cost = {},
                                  absl::Span<const double> rank_speed = {});

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_RECUT_H_
