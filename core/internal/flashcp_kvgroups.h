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

#include "absl/status/status.h"
#include "core/internal/flashcp_judge.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

// The raw pieces (for FinishPlan) of one candidate, appended to `out`:
// every rank holds exactly its RankTargets tokens. A document (longest
// first) is cut while it is longer than C/N or its pairs less rho x its
// tokens exceed the budget less rho x C/N. False (and `out` as it was)
// where nothing is cut, the budget is <= 0, or the cut documents' pairs
// (each chunk >= max(options.min_shard, 1) tokens) fit no pass.
bool KvGroupPieces(const Batch& batch, const FlashCpOptions& options, const KvGroupParams& params,
                   std::vector<Shard>& out);

// The capacity-group stage's generator (flashcp_stages.h): the pieces of
// the first at.variants of kKvGroupParams that KvGroupPieces makes (its
// deal-level-equalize passes stop at the first within R), offered to
// `judge` raw. The stop token's status once it says stop.
absl::Status KvGroupCandidates(const Batch& batch, const FlashCpOptions& options,
                               const RankBand& band, const StageAtN& at, CandidateJudge& judge);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_KVGROUPS_H_
