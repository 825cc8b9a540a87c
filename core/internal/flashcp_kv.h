// flashcp's chunk-heap candidates (docs/planner.md, "Least KV moved"):
// MagiAttention's dispatch (equal-token chunks of the packed sequence dealt
// largest causal area first to the least-loaded rank, every rank the same
// number of chunks: exact tokens and fine balance at any N), except that a
// chunk goes to the rank holding its neighbouring chunk of the same document
// (or its tail chunk) where that rank is within a slack of the least load, so
// a long document sits on fewer ranks and each rank needs the prefixes of
// fewer documents.
// flashcp keeps such a candidate (slivers repaired, balanced by
// whole-document exchanges, roles swapped) where it meets the target and
// moves less (flashcp_stages.h; at which N: kRankBands).
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_KV_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_KV_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/internal/flashcp_judge.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_tuning.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Raw pieces (for FinishPlan) of the packed sequence in chunks_per_rank x N
// near-equal chunks, dealt by causal area descending (ties: the later chunk
// first), each to the least-loaded rank that holds fewer than
// chunks_per_rank chunks (ties: the lower rank), or instead to the owner of
// chunk k - 1 or k + 1 where that chunk shares a document with it (with
// tail_affinity, also of the chunk holding the last token of chunk k's
// first document: a cut document's head then tends to join its tail, on the
// rank that needs its longest prefix), the owner is not full and its load is
// at most the least load + `slack` pairs (of several such, the lightest;
// ties: in that order). slack = 0 is MagiAttention's rule but for ties. Each rank's last chunk then takes up the difference to its
// RankTargets tokens, so every rank holds exactly those (chunks_per_rank >=
// 1; where a rank has fewer tokens than chunks, some chunks are empty and
// CutPacked drops them).
std::vector<Shard> KvHeapPieces(const Batch& batch, int32_t chunks_per_rank, double slack,
                                bool tail_affinity = false);

// The chunk-heap stage's generator (flashcp_stages.h): the first
// at.variants of kChunkHeapVariants (chunks per rank, neighbour slack in
// mean rank workloads, tail affinity), offered to `judge` raw. The stop
// token's status once it says stop.
absl::Status ChunkHeapCandidates(const Batch& batch, const FlashCpOptions& options,
                                 const RankBand& band, const StageAtN& at, CandidateJudge& judge);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_KV_H_
