// flashcp's balancing exchanges (docs/planner.md, "Least KV moved"): the
// heaviest rank's workload lowered by exchanges of whole documents (and cut
// pieces) that keep every rank's tokens.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_BALANCE_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_BALANCE_H_

#include <cstdint>

#include "core/types.h"

namespace flashcp::core::internal {

// Lowers the heaviest rank's workload by exchanges of whole documents that
// keep every rank's tokens: the heaviest rank A hands a lighter rank B one
// whole document x and takes back a shorter whole y and len(x) - len(y)
// more tokens of B's: either a whole z of exactly that length, which moves
// W(x) - W(y) - W(z) = len(y) len(z) pairs from A to B and no KV, or the
// head of that length of a longer whole z (both of z's pieces >= min_shard
// tokens), which moves len(y) len(head) pairs and cuts z (its head's KV
// then goes from A to B). Each step takes, over the `partners` lightest
// ranks, the exchange leaving the larger of the two ranks' workloads least
// (ties: fewer tokens cut, then the lighter partner, then x, y, z in each
// rank's slot order: plan order at the first step; after it a y taken in
// holds the slot of the x it replaced, and pieces moved in come last),
// only if that is below A's; stops when A is at or under
// `max_workload`, when no exchange lowers A, or after max_moves steps.
// Without move_cut, documents already cut are not touched. `plan` must be
// valid.
//
// With move_cut, x may also be a piece of a cut document (of len(x) tokens
// from its position p): it moves len(x) p pairs more (its prefix's), and
// for a y of exactly its length that alone (no z); its tokens count as cut
// (its KV now comes from or goes to B).
Plan BalanceByWholeExchanges(const Batch& batch, const Plan& plan, double max_workload,
                             int32_t partners, int32_t max_moves, int64_t min_shard,
                             bool move_cut = false);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_BALANCE_H_
