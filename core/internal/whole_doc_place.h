// The paper's Whole-Doc sharding of a subset of documents (LPT placement,
// then token equalization by heads), a building block of the
// workload-aware planners (whole_doc, flashcp_paper, flashcp). Pure
// functions over plain data.
#ifndef FLASHCP_CORE_INTERNAL_WHOLE_DOC_PLACE_H_
#define FLASHCP_CORE_INTERNAL_WHOLE_DOC_PLACE_H_

#include <cstdint>
#include <vector>

#include "core/types.h"

namespace flashcp::core::internal {

// The paper's Whole-Doc sharding of `docs` (indices, longest first) onto
// ranks that already carry `workload[r]` from other pieces and must take
// exactly `tokens_needed[r]` more tokens (summing to the docs' tokens):
//  1. each document whole to the rank of least workload (LPT);
//  2. communication-aware token equalization: over-full ranks cut heads off
//     their longest documents and hand them to the under-full rank of least
//     workload. A head of h tokens moves only h(h+1)/2 workload and keeps the
//     donor's tail (the document's last shard) where it is, so only the
//     receiver gains non-last tokens.
// Appends the pieces to `out` and updates `workload`. The defaults are the
// paper's method; flashcp varies them:
struct WholeDocOptions {
  // LPT places each document on the rank minimizing
  //   workload[r] - rho * (tokens[r] - tokens_needed[r]),
  // anticipating that equalization will move about rho workload per excess
  // token (rho = 0: plain LPT).
  double rho = 0.0;
  // Before cutting heads, a donor hands whole documents (shortest first) that
  // fit both its excess and a receiver's deficit: a whole document of l
  // tokens moves the same l(l+1)/2 workload as an l-token head but is never
  // communicated.
  bool whole_moves = false;
  // flashcp's minimum-shard rule (PlanOptions::min_shard_tokens; 0 = off, the
  // paper's method). Equalization cuts heads only off documents of at least
  // 2 * min_shard tokens while such a document is available, sends a head
  // only to a receiver that can take min_shard tokens when one exists, and
  // never leaves a donor a tail shorter than min_shard when the head can be
  // shortened instead. RepairSlivers tries to remove what is left.
  int64_t min_shard = 0;
  // With min_shard: a head shorter than min_shard is instead sent longer, by
  // the length of the receiver's shortest whole document that the donor takes
  // back in exchange, if the longer head has at most max_swap_head tokens
  // (0: any length). A long head is communicated, hence the cap.
  int64_t max_swap_head = 0;
};
void WholeDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                    const std::vector<int64_t>& tokens_needed, std::vector<double>& workload,
                    std::vector<Shard>& out, const WholeDocOptions& options = {});
// The LPT step of WholeDocPieces alone: per rank its tokens and its
// documents (longest first, as placed), plus the number of documents.
struct WholeDocPlacement {
  std::vector<int64_t> tokens;
  std::vector<std::vector<int32_t>> held;
  int64_t docs = 0;
};
// WholeDocPieces' working buffers, owned by the caller and reused across
// calls (e.g. a planner's candidates within one plan) so that a call does
// not allocate once the buffers have grown. Contents between calls are
// meaningless; never share one between threads.
struct WholeDocScratch {
  WholeDocPlacement placement;
  std::vector<double> keys;    // LPT key per rank (+inf past N)
  std::vector<int32_t> tree;   // LPT tournament tree over the ranks
  std::vector<int64_t> deficit;
  // Equalization's receivers, each with a copy of its rank's workload.
  struct Receiver {
    double workload;
    int32_t rank;
  };
  std::vector<Receiver> receivers;
};
// The same, with caller-owned scratch (identical results).
void WholeDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                    const std::vector<int64_t>& tokens_needed, std::vector<double>& workload,
                    std::vector<Shard>& out, const WholeDocOptions& options,
                    WholeDocScratch& scratch);
// WholeDocPieces in steps, so that one LPT placement can be equalized under
// several options (flashcp's head-swap caps) without placing again, and a
// candidate's score need not walk its whole documents:
//  - PlaceWholeDocs is step 1 with `rho`: adds the documents' workload to
//    `workload` and fills `placement`.
//  - EqualizeWholeDocs is step 2 (ignores options.rho). It consumes
//    `placement` (copy it first to equalize it again): appends to `out` every
//    piece that is cut or moved off its LPT rank, and leaves in
//    `placement.held` the documents that stay whole where LPT put them
//    (never cut, never communicated, so they change no score but workload).
//    Returns whether options.max_swap_head decided anything: where it did
//    not, equalizing the same placement with max_swap_head = 0 gives the
//    same result (the cap is read nowhere else).
//  - AppendHeldWhole appends those as whole shards.
// WholeDocPieces is the three in turn; `scratch.placement` is used by none
// of them.
void PlaceWholeDocs(const Batch& batch, const std::vector<int32_t>& docs,
                    const std::vector<int64_t>& tokens_needed, double rho,
                    std::vector<double>& workload, WholeDocPlacement& placement,
                    WholeDocScratch& scratch);
bool EqualizeWholeDocs(const Batch& batch, const std::vector<int64_t>& tokens_needed,
                       WholeDocPlacement& placement, std::vector<double>& workload,
                       std::vector<Shard>& out, const WholeDocOptions& options,
                       WholeDocScratch& scratch);
void AppendHeldWhole(const Batch& batch, const WholeDocPlacement& placement,
                     std::vector<Shard>& out);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_WHOLE_DOC_PLACE_H_
