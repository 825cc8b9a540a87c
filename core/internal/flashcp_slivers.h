// flashcp's sliver repair primitives (docs/planner.md, "Minimum shard"):
// edits of raw pieces that keep every rank's token count and move only cut
// points or whole documents (on sliver_repair.h's state). Pure functions
// over plain data.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_SLIVERS_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_SLIVERS_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/types.h"

namespace flashcp::core::internal {

// Where raw pieces overfill some ranks (room < 0, room = tokens still free
// per rank), moves the excess to ranks with room left along chains of
// cut-point shifts between cut documents' pieces (RepairSlivers'
// chains), so that no piece falls below min_shard and the pieces' shape,
// hence their balance, changes only at the cut points that move (no
// workload check: the caller scores the result). PerDocPieces fits reduced
// zigzags with it, RecutPieces its rounded cut points. On success replaces
// `pieces` (merged) and `room` and returns true; else leaves both as they
// were. Bounded: at most 4N + 16 moves, each up to log2(overflow) chain
// searches, each O(N + pieces), over a boundary graph built once and
// updated in place by each move (docs/planner.md, "Complexity").
bool ShiftPiecesToRoom(const Batch& batch, int64_t min_shard, std::vector<Shard>& pieces,
                       std::vector<int64_t>& room);

// RepairSlivers' max_nonlast_growth when the non-last tokens are not bounded.
inline constexpr int64_t kAnyNonlastGrowth = int64_t{1} << 62;

// Removes cut shards shorter than `min_shard` from raw pieces (returns them
// merged, as FinishPlan's shards, in no particular order), keeping every
// rank's token count. For each such sliver of a document on rank A, next to
// a piece of the same document on rank B, either
//  - absorb: B's piece grows over the sliver (A loses its s tokens), or
//  - grow: the sliver grows to min_shard tokens out of B's piece (when that
//    piece keeps at least min_shard),
// and the tokens A lost (or gained) are returned along a chain of cut-point
// shifts: the boundary between two touching pieces of some other cut
// document on ranks X and Y moves by s tokens, which hands s tokens from one
// to the other, allowed only when the shrinking piece keeps >= min_shard
// tokens. The chain is a shortest path between B and A over such boundaries
// (BFS over ranks). Where no chain exists (or it would break the workload
// bound below), whole documents move between A and B instead: the sliver
// grows by g tokens (min_shard - s <= g, B's piece keeps >= min_shard)
// while A hands B whole documents worth exactly g more than it gets back
// (one, or one each way), or B absorbs it while handing A exactly s more;
// the one with the least resulting maximum non-last tokens is taken.
// Failing that, a new cut: the sliver grows by min_shard out of B's piece
// while A hands B the min_shard-token head of its shortest whole document
// of >= 2 min_shard tokens. Every fix must leave each rank it changes at
// most max(max_workload, the current maximum rank workload), so a plan at
// or under max_workload stays there; whole-document moves and new cuts
// must also raise the maximum over ranks of non-last tokens by at most
// max_nonlast_growth. At most N + 16 + min(4 x (initial slivers), the
// attempts that fit 2^20 piece and document visits) attempts; a sliver
// nothing removes stays (docs/planner.md, "Minimum shard").
std::vector<Shard> RepairSlivers(const Batch& batch, std::vector<Shard> pieces,
                                 int64_t min_shard,
                                 double max_workload = std::numeric_limits<double>::infinity(),
                                 int64_t max_nonlast_growth = kAnyNonlastGrowth);
// RepairSlivers' working buffers, owned by the caller and reused across
// calls (a planner's candidates within one plan), so that a call allocates
// little once they have grown. Contents between calls are meaningless;
// never share one between threads.
struct RepairScratch {
  RepairScratch();
  ~RepairScratch();
  // Not movable: a moved-from scratch would hold no buffers.
  RepairScratch(const RepairScratch&) = delete;
  RepairScratch& operator=(const RepairScratch&) = delete;
  struct Buffers;  // flashcp_repair.cc
  std::unique_ptr<Buffers> buffers;
};
// The same, with caller-owned scratch (identical results).
std::vector<Shard> RepairSlivers(const Batch& batch, std::vector<Shard> pieces,
                                 int64_t min_shard, double max_workload,
                                 int64_t max_nonlast_growth, RepairScratch& scratch);
// RepairSlivers' result for a caller that keeps only a repair leaving no
// sliver: nullopt where its attempts certainly leave one (a cut document of
// L tokens ends whole or in at most floor(L / min_shard) pieces, and each
// attempt lowers one document's piece count by at most two), without making
// them; then the pieces as given had a sliver too. Else RepairSlivers'
// result (which may still keep a sliver).
std::optional<std::vector<Shard>> RepairAllSlivers(const Batch& batch, std::vector<Shard> pieces,
                                                   int64_t min_shard, double max_workload,
                                                   int64_t max_nonlast_growth,
                                                   RepairScratch& scratch);
// Whether RepairAllSlivers of every raw pieces that hold `part` (raw pieces
// of some documents, all of their pieces) and only other documents besides
// certainly returns nullopt: `part`'s documents alone need more attempts
// than such a repair may make, whatever the other documents hold. Told from
// `part` alone, so that a caller can skip the candidates that share it
// without building them.
bool PartKeepsSlivers(const Batch& batch, std::span<const Shard> part, int64_t min_shard,
                      RepairScratch& scratch);

// A lower bound on the maximum rank workload (SPEC Eq. 3 pairs) of every
// plan of `batch` with no cut shard shorter than `min_shard` > 0: the rank
// holding a document's last token holds at least its last s = min(L,
// min_shard) tokens (a cut document's last shard has >= min_shard tokens; an
// uncut document is whole) and floor(total / N) tokens in all, each of
// workload >= 1, so at least W(L - s, s) + floor(total / N) - s. The maximum
// over documents. Where it exceeds R times the mean workload, every plan
// meeting R has a sliver (docs/planner.md, "When a sliver is needed").
double SliverFreeWorkloadBound(const Batch& batch, int64_t min_shard);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_SLIVERS_H_
