// Building blocks shared by the workload-aware planners (whole_doc,
// flashcp_paper, flashcp): SPEC Eq. 3 on token ranges and per rank, the
// Per-Doc zigzag and Whole-Doc sharding of a subset of documents. Pure
// functions over plain data.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_UTIL_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Workload (SPEC Eq. 3, (query, key) pairs) of tokens [start, start + len):
// core::ShardWorkload, the one implementation. Additive over token ranges:
// W(a, x) + W(a + x, y) = W(a, x + y).
inline double RangeWorkload(int64_t start, int64_t len) { return ShardWorkload(start, len); }

// Whether every sum of workloads of disjoint ranges within `tokens` tokens
// (each term an integer) is an exact double, in any order: W(0, tokens) <
// 2^53, which bounds every such sum (W is superadditive).
inline bool WorkloadsExact(int64_t tokens) { return RangeWorkload(0, tokens) < 0x1p53; }

// `ranks`, sorted by the strict total order `before` until the ranks r with
// changed[r] != 0 changed their keys, sorted again: the others keep their
// order, the changed ones are sorted and merged back, which gives the order
// a full sort gives, for less where few changed. `kept`, `moved`: buffers.
template <typename Flags, typename Before>
void ResortChangedRanks(std::vector<int32_t>& ranks, const Flags& changed, Before before,
                        std::vector<int32_t>& kept, std::vector<int32_t>& moved) {
  kept.clear();
  moved.clear();
  for (int32_t r : ranks) (changed[r] != 0 ? moved : kept).push_back(r);
  std::sort(moved.begin(), moved.end(), before);
  std::merge(kept.begin(), kept.end(), moved.begin(), moved.end(), ranks.begin(), before);
}

// Per-Doc (WLB-LLM) zigzag of the documents `docs` (indices into
// batch.doc_lens) alone: PlanPerDoc's pieces for the sub-batch, mapped back
// (unsorted and unmerged). Rank r gets
// floor(P/N) + (r < P % N ? 1 : 0) of their P tokens.
//
// With min_shard > 0 (flashcp's minimum-shard rule) a document of L tokens is
// zigzagged over c = clamp(L / (2 min_shard), 1, N) ranks instead of N, so
// every chunk has at least min_shard tokens (c = 1: the document stays
// whole). The c ranks are consecutive, starting where the previous document's
// ended (mod N), so the documents' tokens still spread evenly; c = N for every
// document gives exactly the pieces above.
// With `room` (per-rank tokens still free), a reduced zigzag goes to the c
// ranks with the most room instead, and `room` is decreased. If that leaves
// some rank below zero room (only when the documents are nearly the whole
// batch), the excess goes back to ranks with room left by chains of
// cut-point shifts between the reduced zigzags' pieces (RepairSlivers'
// chains, each piece keeping >= min_shard; no workload check: the caller
// scores the result), and `*refit` (if given) is set; where no chain can
// carry it, the pieces stay as they were and some room stays < 0.
std::vector<Shard> PerDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                                int64_t min_shard = 0, std::vector<int64_t>* room = nullptr,
                                bool* refit = nullptr);
// PerDocPieces document by document, without its final fitting: appends the
// zigzags of `docs` to `pieces` (and, if given, to `begins` each
// document's first index in `pieces`), decreasing `room` if given. What
// carries from one document to the next is in `cursor` (fresh for a list's
// first document) and `room`, so a longer prefix of one list continues
// where a shorter one stopped: PerDocPieces is this from a fresh cursor,
// then the fitting.
struct PerDocCursor {
  int32_t next = 0;   // the leftover round robin
  int32_t first = 0;  // first rank of the next reduced zigzag
  std::vector<int64_t> chunk, rooms;  // buffers, reused
  std::vector<int32_t> chosen;
};
void AppendPerDocPieces(const Batch& batch, std::span<const int32_t> docs, int64_t min_shard,
                        std::vector<int64_t>* room, PerDocCursor& cursor,
                        std::vector<Shard>& pieces, std::vector<size_t>* begins = nullptr);

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

// Documents sorted longest first (ties by index): the planners' common order.
std::vector<int32_t> DocsLongestFirst(const Batch& batch);
// Per-rank workload of raw pieces (any order; merging does not change it).
std::vector<double> PieceWorkloads(int32_t cp_size, const std::vector<Shard>& pieces);
// Adds the pieces' workloads to `workload` (per rank), in their order: on a
// list's prefix, then on the rest, the sums are exactly PieceWorkloads'.
void AddPieceWorkloads(std::span<const Shard> pieces, std::vector<double>& workload);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_UTIL_H_
