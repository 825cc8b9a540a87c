// flashcp's capacity groups (docs/planner.md, "Least KV moved"): plans in
// which each document too heavy or too long to keep whole is cut into
// mirrored pairs of chunks over the fewest ranks that carry it, the groups
// of different documents disjoint but where a rank's room ends one group
// and starts the next, every rank levelled to the same workload.
//
// A pair of mirrored chunks of one document ([a, a + l) and
// [L - a - l, L - a)) holds l (L + 1) pairs wherever it sits: pair lengths
// move workload between a group's ranks at 2 tokens per L + 1 pairs, so
// levelling a long document's group moves few tokens, which equalization
// then returns by heads of short documents (few pairs). A group's longest
// pair is outermost (the document's head and tail on one rank, the one
// needing its longest prefix); its rank receives about L - 2 l, its
// innermost sends about 2 (k - 1) l: a document costs about its own length
// at its bottleneck rank, on few ranks, and a rank holds pieces of at most
// a few such documents.
//
// Steps: (1) which documents are cut, and a first deal of them: every rank
// must end with C/N tokens, so one that takes a share of s tokens and w
// pairs of a long document fills the rest with shorter ones at about rho
// pairs per token (rho: those documents' pairs per token, less what the
// ranks holding no cut document take); in those units the share costs
// w - rho s of a budget alpha x mean - rho C/N; (2) the rest by LPT
// (Whole-Doc's placement), steered by that deal; (3) passes of: deal the
// cut documents again within R x mean less what each rank's whole
// documents (and the last pass's equalization) hold, level each group's
// pair lengths (three rounds over the groups, as they share ranks),
// equalize tokens by heads (WholeDocPieces' step 2); the pass with the
// least maximum rank workload is kept.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_KVGROUPS_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_KVGROUPS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/internal/flashcp_options.h"
#include "core/types.h"

namespace flashcp::core::internal {

// One candidate's parameters.
struct KvGroupParams {
  double alpha = 1.0;      // the first deal's budget, in mean rank workloads
  double rho_scale = 1.0;  // rho = rho_scale x the whole documents' pairs per token
  double lpt_scale = 0.0;  // Whole-Doc's rho (WholeDocOptions), in median densities
};

// The raw pieces (for FinishPlan) of one candidate, appended to `out`:
// every rank holds exactly its RankTargets tokens. A document (longest
// first) is cut while it is longer than C/N or its pairs less rho x its
// tokens exceed the budget less rho x C/N. False (and `out` as it was)
// where nothing is cut, the budget is <= 0, or the cut documents' pairs
// (each chunk >= max(options.min_shard, 1) tokens) fit no pass.
bool KvGroupPieces(const Batch& batch, const FlashCpOptions& options, const KvGroupParams& params,
                   std::vector<Shard>& out);

// `chosen` (a valid flashcp plan), or the capacity-group candidate
// (kKvGroupParams) that, slivers repaired (RepairSlivers within R x mean),
// balanced by whole-document exchanges where over the target
// (BalanceByWholeExchanges) and roles swapped (SwapRolesForTargeted),
// meets options.target, has no more cut shards under options.min_shard
// than chosen, and moves strictly less than chosen (and than the
// candidates before it) under its cheaper exchange; at N <= 8 also no more
// under the compacted all-gather. A raw candidate more than 1.1 x the
// target off balance or moving more than 1.1 x the best so far (at N <= 8
// also 1.1 x chosen's all-gather) is dropped unrepaired. At N <= 2 or
// where chosen cuts nothing, chosen. The stop token's status once it says
// stop.
absl::StatusOr<Plan> PreferKvGroups(const Batch& batch, const FlashCpOptions& options,
                                    Plan chosen);

// PreferKvGroups over the candidates of `params`, in that order.
absl::StatusOr<Plan> PreferKvGroupsOf(const Batch& batch, const FlashCpOptions& options,
                                      Plan chosen, const std::vector<KvGroupParams>& params);

// The judge behind PreferKvGroupsOf (and other stages' candidates, e.g.
// flashcp_kvfill.h): `chosen`, or the best of `candidates` (raw pieces for
// FinishPlan, each rank exactly its RankTargets tokens, in the order
// given) by the rules of PreferKvGroups above, a raw candidate moving more
// than moved_reach x the best so far dropped unrepaired.
inline constexpr double kKvGroupsMovedReach = 1.1;  // PreferKvGroups' reach
absl::StatusOr<Plan> PreferRawCandidates(const Batch& batch, const FlashCpOptions& options,
                                         Plan chosen, std::vector<std::vector<Shard>> candidates,
                                         double moved_reach = kKvGroupsMovedReach);

// The candidates, in the order tried: at N <= 8 the first kKvGroupsSmall
// (the plan-time budget there is 1 ms), from 17 to 32 ranks the first
// kKvGroupsLarge and beyond 32 the first kKvGroupsHuge (20 ms at N = 64),
// else all; of those within reach,
// the one (N <= 8) or two that move least raw are repaired and judged.
// Deal-level-equalize passes stop at the first within R.
inline constexpr KvGroupParams kKvGroupParams[] = {
    {1.0, 2.0, 0.0}, {1.0, 1.0, 0.0}, {0.98, 1.0, 0.0}, {1.0, 1.3, 0.0}, {0.98, 1.6, 0.0},
    {1.0, 1.6, 0.0}};
inline constexpr size_t kKvGroupsSmall = 1;
inline constexpr size_t kKvGroupsLarge = 2;
inline constexpr size_t kKvGroupsHuge = 1;
// Deal-level-equalize passes per candidate (KvGroupPieces).
inline constexpr int kKvGroupPasses = 3;

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_KVGROUPS_H_
