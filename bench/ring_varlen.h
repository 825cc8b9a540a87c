// The Ring-Attn baseline's sharding as the paper ran it (bench/paper_step_model):
// ring-flash-attention's varlen ring. Header-only, for the bench and its test.
#ifndef FLASHCP_BENCH_RING_VARLEN_H_
#define FLASHCP_BENCH_RING_VARLEN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace flashcp::bench {

// ring-flash-attention's ring_flash_attn_varlen_func sharding (its tests'
// extract_local: each document's tokens chunked into N, rank k taking chunk
// k), which the paper's Ring-Attn baseline uses for packed input. The L % N
// leftover tokens of a document go one each to ranks in a round robin
// carried across documents, so that every rank holds the canonical C/N
// tokens (ValidatePlan), as per_doc deals its leftovers.
inline core::Plan PlanRingVarlen(const core::Batch& batch) {
  const int32_t n = batch.cp_size;
  core::Plan plan;
  plan.cp_size = n;
  plan.doc_lens = batch.doc_lens;
  plan.padding = core::PaddingTokens(core::TotalTokens(batch.doc_lens), n);
  int32_t next = 0;
  for (int32_t d = 0; d < static_cast<int32_t>(batch.doc_lens.size()); ++d) {
    const int64_t len = batch.doc_lens[d];
    std::vector<int64_t> chunk(n, len / n);
    for (int64_t left = len % n; left > 0; --left) {
      ++chunk[next];
      next = (next + 1) % n;
    }
    int64_t start = 0;
    for (int32_t k = 0; k < n; ++k) {
      if (chunk[k] == 0) continue;
      plan.shards.push_back(core::Shard{d, start, chunk[k], k});
      start += chunk[k];
    }
  }
  // ValidatePlan: shards grouped by rank ascending (documents in order).
  std::stable_sort(plan.shards.begin(), plan.shards.end(),
                   [](const core::Shard& a, const core::Shard& b) { return a.rank < b.rank; });
  return plan;
}

}  // namespace flashcp::bench

#endif  // FLASHCP_BENCH_RING_VARLEN_H_
