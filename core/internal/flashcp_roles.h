// flashcp's role swaps of a finished plan (docs/planner.md, "Least KV
// moved"), each keeping every rank's tokens: which of a cut document's
// ranks holds which of its pieces, changed to lower the targeted exchange.
// Balancing exchanges are flashcp_balance.h's (included here for code
// written against this header).
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_ROLES_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_ROLES_H_

#include <cstdint>

#include "core/internal/flashcp_balance.h"  // BalanceByWholeExchanges, formerly here
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

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_ROLES_H_
