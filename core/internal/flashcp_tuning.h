// flashcp's tuning: every constant a stage of the planner is tuned by
// (docs/planner.md, "Tuning", lists them; scripts/tuning_table.py writes
// that table from this file, and the tuning_table test checks it), and the
// one table of which stages run at which N (kRankBands): the only place the
// planner compares N with a literal.
//
// Changing a value here changes plans: core_plan_fingerprint_test and
// scripts/plan_cmp.sh say which.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_TUNING_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_TUNING_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>

namespace flashcp::core::internal {

// ---- Compacted search (flashcp_search.h) and its fallback -----------------
// tuning: Whole-Doc rho per variant, in median densities (pairs per token).
inline constexpr std::array<double, 4> kScales = {0.0, 0.5, 1.0, 2.0};
// tuning: the fallback's extra rho scales, between kScales'.
inline constexpr std::array<double, 4> kMoreScales = {0.25, 0.75, 1.5, 3.0};
// tuning: fallback candidates repaired (flashcp_repair.h, RepairFallback).
inline constexpr size_t kMaxFallbacks = 5;
// tuning: fallback candidates re-cut (flashcp_recut.h).
inline constexpr size_t kMaxRecuts = 3;
// tuning: linear-programming rounds per re-cut candidate.
inline constexpr int32_t kRecutRounds = 8;

// ---- Sliver repair (flashcp_slivers.h) -----------------------------------
// tuning: a whole-document sliver fix tries at most this many of each rank's
// shortest whole documents (pairs: its square), which bounds its work.
inline constexpr size_t kMaxWholeTried = 16;

// ---- Grouped plans (flashcp_grouped.h) ------------------------------------
// tuning: unfilled group bounds, in R x mean rank workloads (smaller: larger
// groups, better balance, more moved).
inline constexpr std::array<double, 4> kGroupBounds = {1.0, 0.85, 0.7, 0.55};
// tuning: filled groups' (bound, small share) per variant: bound in R x mean,
// a document small (left to Whole-Doc) at most share x bound pairs.
inline constexpr std::array<std::pair<double, double>, 4> kFilledGroups = {
    {{1.0, 0.1}, {0.97, 0.1}, {0.93, 0.1}, {1.0, 0.2}}};

// ---- Balancing exchanges (flashcp_roles.h), per stage ---------------------
// tuning: grouped candidates: the lightest ranks a balancing exchange tries.
inline constexpr int32_t kBalancePartners = 4;
// tuning: grouped candidates: balancing exchanges per call, per rank.
inline constexpr int32_t kBalanceMovesPerRank = 2;
// tuning: grouped candidates: balancing exchanges per plan (the plan-time
// budget), at least one call.
inline constexpr int32_t kBalanceMoves = 512;
// tuning: grouped candidates over R by at most this x R are balanced.
inline constexpr double kBalanceReach = 1.05;
// tuning: post-pass candidates: the lightest ranks a balancing exchange tries.
inline constexpr int32_t kPostPassPartners = 8;
// tuning: post-pass candidates: balancing exchanges per call, per rank.
inline constexpr int32_t kPostPassMovesPerRank = 4;

// ---- Role swaps (flashcp_roles.h) -----------------------------------------
// tuning: role swaps per plan, per rank.
inline constexpr int32_t kSwapsPerRank = 1;

// ---- Post-pass candidates' screens (flashcp_judge.h) ----------------------
// tuning: a raw post-pass candidate over this x R is dropped unrepaired.
inline constexpr double kRawReach = 1.1;
// tuning: a raw candidate moving (targeted phase) over this x the best so far
// is dropped unrepaired: chunk heap and capacity groups.
inline constexpr double kMovedReach = 1.1;
// tuning: the same for density fills (their balancing seldom closes a gap).
inline constexpr double kFillMovedReach = 1.0;
// tuning: at N where the all-gather is held, a raw candidate over this x
// chosen's all-gather is dropped unrepaired (post-passes).
inline constexpr double kAllgatherReach = 1.1;

// ---- Chunk heap (flashcp_kv.h) --------------------------------------------
// One chunk-heap variant: chunks per rank, neighbour slack in mean rank
// workloads (0: MagiAttention's rule), tail affinity.
struct ChunkHeapVariant {
  int32_t chunks_per_rank;
  double slack;
  bool tail_affinity;
};
// tuning: chunk-heap variants, in the order tried (kRankBands takes a prefix:
// the first six won most often on the data sets).
inline constexpr ChunkHeapVariant kChunkHeapVariants[] = {
    {8, 0.0, false},   {16, 0.0, false},  {16, 0.01, false}, {8, 0.03, false},
    {16, 0.01, true},  {8, 0.03, true},   {8, 0.01, false},  {8, 0.1, false},
    {16, 0.03, false}, {16, 0.1, false},  {8, 0.01, true},   {8, 0.1, true},
    {16, 0.03, true},  {16, 0.1, true}};

// ---- Density fills (flashcp_kvfill.h) -------------------------------------
// tuning: split points tried each side of the one found without the minimum.
inline constexpr int64_t kFillScan = 64;
// tuning: workload error, in mean rank workloads, that ends the scan early.
inline constexpr double kFillTolerance = 5e-3;

// ---- Capacity groups (flashcp_kvgroups.h) ---------------------------------
// One capacity-group candidate's parameters.
struct KvGroupParams {
  double alpha = 1.0;      // the first deal's budget, in mean rank workloads
  double rho_scale = 1.0;  // rho = rho_scale x the whole documents' pairs per token
  double lpt_scale = 0.0;  // Whole-Doc's rho (WholeDocOptions), in median densities
};
// tuning: capacity-group candidates, in the order tried (kRankBands takes a
// prefix).
inline constexpr KvGroupParams kKvGroupParams[] = {
    {1.0, 2.0, 0.0}, {1.0, 1.0, 0.0}, {0.98, 1.0, 0.0}, {1.0, 1.3, 0.0}, {0.98, 1.6, 0.0},
    {1.0, 1.6, 0.0}};
// tuning: deal-level-equalize passes per capacity-group candidate.
inline constexpr int kKvGroupPasses = 3;

// ---- Node placement (flashcp_nodes.h) ------------------------------------
// tuning: Kernighan-Lin passes per start, at most.
inline constexpr int32_t kNodePlacementPasses = 8;
// tuning: swaps a pass makes after its best prefix before it stops.
inline constexpr size_t kNodePlacementStall = 4;

// ---- Which stages run at which N ------------------------------------------
// One stage at one band of N: how many of its variants are generated (0:
// the stage does not run), how many raw candidates are repaired and judged
// (0: every one, as generated), the imbalance a raw one may have (x R), and
// whether the all-gather is held (no candidate moves more under it than
// the plan it would replace).
struct StageAtN {
  size_t variants = 0;
  size_t repaired = 0;
  double reach = 1.0;
  bool allgather_held = false;
};
// The stages at N <= max_ranks (and above the row before).
struct RankBand {
  int32_t max_ranks;
  StageAtN grouped;     // flashcp_grouped.h
  StageAtN chunk_heap;  // flashcp_kv.h
  StageAtN fill;        // flashcp_kvfill.h
  StageAtN kv_groups;   // flashcp_kvgroups.h
  // Grouped plans' variants: filled (kFilledGroups), else kGroupBounds.
  bool filled_groups;
  // GroupDocuments keeps its rank order from one document to the next
  // (speed only: plans are the same either way).
  bool keep_rank_order;
};
// tuning: which stages run at which N. At N = 2 a cut document moves the same
// however it is grouped; up to 8 ranks the plan-time budget is 1 ms and the
// all-gather is the exchange that may be used; beyond 32 ranks the budget
// (20 ms at N = 64) goes to fills and capacity groups.
inline constexpr RankBand kRankBands[] = {
    // max_ranks  grouped            chunk_heap          fill             kv_groups
    {2, {}, {}, {}, {}, false, false},
    {8, {4, 0, 1.0, true}, {}, {}, {1, 1, kRawReach, true}, false, false},
    {16, {4, 0, kBalanceReach, false}, {14, 14, kRawReach, false}, {2, 2, kRawReach, false},
     {6, 2, kRawReach, false}, true, false},
    {32, {4, 0, kBalanceReach, false}, {6, 2, kRawReach, false}, {2, 2, kRawReach, false},
     {2, 2, kRawReach, false}, true, true},
    {std::numeric_limits<int32_t>::max(), {4, 0, kBalanceReach, false}, {},
     {2, 2, kRawReach, false}, {1, 2, kRawReach, false}, true, true},
};

// The row of kRankBands for N ranks (N >= 1).
constexpr const RankBand& BandOf(int32_t n) {
  for (const RankBand& band : kRankBands) {
    if (n <= band.max_ranks) return band;
  }
  return kRankBands[std::size(kRankBands) - 1];
}

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_TUNING_H_
