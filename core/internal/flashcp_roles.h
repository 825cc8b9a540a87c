// flashcp's repairs of a finished plan (docs/planner.md, "Least KV moved"),
// each keeping every rank's tokens: role swaps, which lower the targeted
// exchange by changing which of a cut document's ranks holds which of its
// pieces, and balancing exchanges of whole documents (and cut pieces),
// which lower the heaviest rank's workload.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_ROLES_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_ROLES_H_

#include <cstdint>

#include "core/types.h"

namespace flashcp::core::internal {

// A rank's role in a cut document is the set of the document's pieces it
// holds. Swapping the roles of two ranks in one document (rank a takes b's
// pieces of it and b takes a's) changes the targeted exchange (SPEC
// "Targeted exchange, per phase") of those two ranks only: every other
// rank's sends and receives depend on how many distinct ranks own the
// document's pieces, not on which. Roles of equal tokens are swapped, so
// every rank keeps its tokens.
//
// Greedy: while the phase bottleneck (max over ranks of max(send,
// receive)) is set by a rank b, take the swap of one of b's roles with a
// role of equal tokens in the same document that leaves both ranks
// strictly below the bottleneck, the one with the least resulting maximum
// of the two (ties: b's first role in (document, start) order, then the
// partner's), such that both ranks stay at or under max(max_workload, the
// plan's maximum rank workload) pairs and at or under the plan's maximum
// non-last tokens (so neither the imbalance beyond max_workload nor the
// compacted all-gather grows). Stops when no such swap exists or after
// max_swaps swaps. Returns the plan with the swaps made; `plan` must be
// valid (ValidatePlan; not checked), and the result is too (same pieces,
// same per-rank tokens).
Plan SwapRolesForTargeted(const Batch& batch, const Plan& plan, double max_workload,
                          int32_t max_swaps);

// Lowers the heaviest rank's workload by exchanges of whole documents that
// keep every rank's tokens: the heaviest rank A hands a lighter rank B one
// whole document x and takes back a shorter whole y and len(x) - len(y)
// more tokens of B's: either a whole z of exactly that length, which moves
// W(x) - W(y) - W(z) = len(y) len(z) pairs from A to B and no KV, or the
// head of that length of a longer whole z (both of z's pieces >= min_shard
// tokens), which moves len(y) len(head) pairs and cuts z (its head's KV
// then goes from A to B). Each step takes, over the `partners` lightest
// ranks, the exchange leaving the larger of the two ranks' workloads least
// (ties: fewer tokens cut, then the lighter partner, then x, y, z in plan
// order), only if that is below A's; stops when A is at or under
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

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_ROLES_H_
