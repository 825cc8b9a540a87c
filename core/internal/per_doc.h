// The Per-Doc (WLB-LLM) zigzag of a subset of documents, a building block
// of the workload-aware planners (whole_doc, flashcp_paper, flashcp). Pure
// functions over plain data.
#ifndef FLASHCP_CORE_INTERNAL_PER_DOC_H_
#define FLASHCP_CORE_INTERNAL_PER_DOC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/types.h"

namespace flashcp::core::internal {

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

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_PER_DOC_H_
