// flashcp's density-fill candidates (docs/planner.md, "Least KV moved"):
// every rank, in turn, takes its tokens from both ends of the batch's
// documents ordered by density, so that it ends at the mean workload.
//
// A document of L tokens cut into mirrored pieces ([a, a + l) beside
// [L - a - l', L - a), or a middle [a, L - a)) holds (L + 1) / 2 pairs per
// token wherever the pieces sit, the same density as the whole document.
// So the documents denser than the mean rank (pairs per token above mean
// workload / C/N, the long ones) are "dense", the rest "sparse", and a
// rank that takes x dense tokens from the dense end (longest first, each
// document peeled from the outside in: its first rank holds its head and
// tail, the one needing its longest prefix) and its other tokens from the
// sparse end (whole documents, the last one's head cut to fit; a document
// longer than C/N peeled mirrored, so that the ranks taking its rest get
// the same pairs per token) reaches the mean workload at one x, found by
// interpolation. A long document then lies on
// consecutive ranks, the groups of different documents disjoint but where
// one rank's dense share ends one and starts the next: the rank holding its
// tail receives about L minus its pair, the innermost sends about as much,
// and a rank needs the prefixes of at most two long documents. Heads of
// sparse documents, not of long ones, fine-tune each rank's workload.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_KVFILL_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_KVFILL_H_

#include <vector>

#include "absl/status/status.h"
#include "core/internal/flashcp_judge.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Where a rank's whole sparse documents come from.
enum class SparseOrder {
  kShortestFirst,  // fewer, shorter sparse heads cut (least moved)
  kLongestFirst,   // the shortest documents kept for the last ranks' fine tuning
};

// The raw pieces (for FinishPlan) of one fill, appended to `out`: every rank
// exactly its RankTargets tokens, every cut piece >= options.min_shard
// (at least 1). Rank r aims at (the pairs not yet dealt) / (N - r); the
// last rank takes what is left. A rank's sparse head is cut from the
// shortest sparse document that keeps both pieces >= the minimum (with
// shortest first, failing that, one whole document fewer and a longer
// head); of the splits near the one found without the minimum, the one
// nearest the aim. False (and `out` as it was) where N < 2,
// no document is dense, or some rank finds no split that gives it exactly
// its tokens.
bool KvFillPieces(const Batch& batch, const FlashCpOptions& options, SparseOrder order,
                  std::vector<Shard>& out);

// The density-fill stage's generator (flashcp_stages.h): the fills of the
// first at.variants sparse orders (shortest first, longest first) that
// KvFillPieces makes, offered to `judge` raw. The stop token's status once
// it says stop.
absl::Status FillCandidates(const Batch& batch, const FlashCpOptions& options,
                            const RankBand& band, const StageAtN& at, CandidateJudge& judge);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_KVFILL_H_
