// Raw pieces and their workload: SPEC Eq. 3 on token ranges and per rank,
// the planners' document order, and the rank re-sort the stages share.
// The lowest layer of core/internal (scripts/check_includes.py). Pure
// functions over plain data.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_PIECES_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_PIECES_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/analysis.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Workload (SPEC Eq. 3, (query, key) pairs) of tokens [start, start + len):
// core::ShardWorkload, the one implementation. Additive over token ranges:
// W(a, x) + W(a + x, y) = W(a, x + y).
inline double RangeWorkload(int64_t start, int64_t len) { return ShardWorkload(start, len); }

// Whether every sum of workloads of disjoint ranges within `tokens` tokens
// (each term an integer) is an exact double, in any order: W(0, tokens) <
// 2^53, which bounds every such sum (W is superadditive).
inline bool WorkloadsExact(int64_t tokens) { return RangeWorkload(0, tokens) < 0x1p53; }

// `ranks`, sorted by the strict total order `before` until the ranks r with
// changed[r] != 0 changed their keys, sorted again: the others keep their
// order, the changed ones are sorted and merged back, which gives the order
// a full sort gives, for less where few changed. `kept`, `moved`: buffers.
template <typename Flags, typename Before>
void ResortChangedRanks(std::vector<int32_t>& ranks, const Flags& changed, Before before,
                        std::vector<int32_t>& kept, std::vector<int32_t>& moved) {
  kept.clear();
  moved.clear();
  for (int32_t r : ranks) (changed[r] != 0 ? moved : kept).push_back(r);
  std::sort(moved.begin(), moved.end(), before);
  std::merge(kept.begin(), kept.end(), moved.begin(), moved.end(), ranks.begin(), before);
}

// Documents sorted longest first (ties by index): the planners' common order.
std::vector<int32_t> DocsLongestFirst(const Batch& batch);
// Per-rank workload of raw pieces (any order; merging does not change it).
std::vector<double> PieceWorkloads(int32_t cp_size, const std::vector<Shard>& pieces);
// Adds the pieces' workloads to `workload` (per rank), in their order: on a
// list's prefix, then on the rest, the sums are exactly PieceWorkloads'.
void AddPieceWorkloads(std::span<const Shard> pieces, std::vector<double>& workload);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_PIECES_H_
