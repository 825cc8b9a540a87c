// MagiAttention's default dispatch (SandAI-org/MagiAttention, v1.1), as a
// baseline: the packed sequence in chunks of equal length, each chunk's
// causal area (its (query, key) pairs, SPEC Eq. 3) its workload, chunks
// dealt by MinHeapDispatchAlg (magi_attention/meta/solver/dispatch_solver.py,
// DispatchSolver._solve_with_minhp): chunks by workload descending, each to
// the least-loaded rank that still has room, every rank ceil(chunks / N)
// chunks at most. The chunk length is ceil(C / 8N) (the chunk-size rule of
// magi_attention/api/magi_attn_interface.py); MagiAttention pads the sequence
// to a multiple of chunk x N, which a plan cannot (it pads fewer than N
// tokens), so where C/N is not a multiple of ceil(C / 8N) the chunk is the
// largest divisor of C/N below it. Written from the description, not copied.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <queue>
#include <tuple>
#include <vector>

#include "core/analysis.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

int64_t MagiChunkTokens(int64_t total, int32_t n) {
  const int64_t per_rank = TokensPerRank(total, n);
  const int64_t padded = per_rank * n;
  int64_t chunk = std::max<int64_t>(1, (padded + 8 * int64_t{n} - 1) / (8 * int64_t{n}));
  while (per_rank % chunk != 0) --chunk;
  return chunk;
}

Plan PlanMagi(const Batch& batch) {
  const int32_t n = batch.cp_size;
  const int64_t total = TotalTokens(batch.doc_lens);
  const int64_t chunk = MagiChunkTokens(total, n);
  const int64_t per_rank = TokensPerRank(total, n);
  const int64_t chunks = per_rank * n / chunk;
  const int64_t limit = per_rank / chunk;  // ceil(chunks / N) = chunks / N: whole chunks

  // Causal area of each chunk of the padded sequence; the padding (the last
  // PaddingTokens tokens) attends to nothing.
  std::vector<double> area(chunks, 0.0);
  {
    int32_t doc = 0;
    int64_t doc_pos = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      int64_t left = chunk;
      while (left > 0 && doc < static_cast<int32_t>(batch.doc_lens.size())) {
        const int64_t take = std::min(left, batch.doc_lens[doc] - doc_pos);
        area[k] += ShardWorkload(doc_pos, take);
        left -= take;
        doc_pos += take;
        if (doc_pos == batch.doc_lens[doc]) {
          ++doc;
          doc_pos = 0;
        }
      }
    }
  }

  // Descending by workload; among equal workloads the later chunk first (the
  // reference reverses a stable ascending argsort).
  std::vector<int64_t> order(chunks);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return area[a] != area[b] ? area[a] > area[b] : a > b;
  });
  // Min-heap of (load, rank): the least load, then the lowest rank.
  using Entry = std::pair<double, int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (int32_t r = 0; r < n; ++r) heap.push({0.0, r});
  std::vector<int64_t> count(n, 0);
  std::vector<int32_t> owner(chunks, 0);
  for (int64_t k : order) {
    Entry top = heap.top();
    heap.pop();
    while (count[top.second] >= limit) {  // full ranks leave the heap
      top = heap.top();
      heap.pop();
    }
    owner[k] = top.second;
    ++count[top.second];
    heap.push({top.first + area[k], top.second});
  }

  // Real tokens per chunk: a rank that holds a padding token (the last
  // PaddingTokens ranks, one each) gives it up from its last chunk, so every
  // rank holds exactly RankRealTokens.
  std::vector<int64_t> sizes(chunks, chunk);
  const std::vector<int64_t> targets = RankTargets(batch);
  std::vector<int64_t> last_chunk(n, -1);
  for (int64_t k = 0; k < chunks; ++k) last_chunk[owner[k]] = k;
  for (int32_t r = 0; r < n; ++r) sizes[last_chunk[r]] -= per_rank - targets[r];
  return FinishPlan(batch, CutPacked(batch, sizes, owner));
}

}  // namespace flashcp::core::internal
