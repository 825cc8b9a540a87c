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
// largest divisor of C/N below it, if that is at least half of it; else (a
// C/N with no such divisor, e.g. a prime: chunks of 1 token would make a plan
// of C shards) the padded sequence is cut into K = ceil((C/N) / chunk) x N
// near-equal chunks (lengths differing by one) and each rank's last chunk
// takes up the difference to its token target after the heap has dealt
// them. Written from the description, not copied.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <queue>
#include <tuple>
#include <vector>

#include "absl/numeric/int128.h"
#include "core/analysis.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

int64_t MagiChunkTokens(int64_t total, int32_t n) {
  const int64_t per_rank = TokensPerRank(total, n);
  const int64_t want = (per_rank + 7) / 8;  // ceil(C / 8N) of the padded sequence
  int64_t chunk = std::max<int64_t>(1, want);
  while (per_rank % chunk != 0) --chunk;
  return 2 * chunk >= want ? chunk : 0;
}

Plan PlanMagi(const Batch& batch) {
  const int32_t n = batch.cp_size;
  const int64_t total = TotalTokens(batch.doc_lens);
  const int64_t per_rank = TokensPerRank(total, n);
  const int64_t exact = MagiChunkTokens(total, n);
  // Chunks per rank, and chunk k's range [bound[k], bound[k+1]) of the
  // padded sequence (near-equal where no divisor fits).
  const int64_t want = (per_rank + 7) / 8;
  const int64_t limit = exact > 0 ? per_rank / exact : (per_rank + want - 1) / want;
  const int64_t chunks = limit * n;
  const int64_t padded = per_rank * n;
  std::vector<int64_t> bound(chunks + 1);
  for (int64_t k = 0; k <= chunks; ++k) {
    bound[k] = exact > 0 ? k * exact
                         : static_cast<int64_t>(absl::int128(k) * padded / chunks);
  }

  // Causal area of each chunk; the padding (the last PaddingTokens tokens)
  // attends to nothing.
  std::vector<double> area(chunks, 0.0);
  {
    int32_t doc = 0;
    int64_t doc_pos = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      int64_t left = bound[k + 1] - bound[k];
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

  // Real tokens per chunk: each rank's last chunk takes up the difference
  // between its chunks' tokens and its target (RankRealTokens: one padding
  // token fewer on the last PaddingTokens ranks; near-equal chunks off by up
  // to one token each), so every rank holds exactly its target.
  std::vector<int64_t> sizes(chunks);
  std::vector<int64_t> held(n, 0);
  for (int64_t k = 0; k < chunks; ++k) {
    sizes[k] = bound[k + 1] - bound[k];
    held[owner[k]] += sizes[k];
  }
  const std::vector<int64_t> targets = RankTargets(batch);
  std::vector<int64_t> last_chunk(n, -1);
  for (int64_t k = 0; k < chunks; ++k) last_chunk[owner[k]] = k;
  for (int32_t r = 0; r < n; ++r) {
    if (targets[r] >= held[r]) {
      sizes[last_chunk[r]] += targets[r] - held[r];
      continue;
    }
    // Too many: off the rank's chunks from its last back (a short chunk may
    // empty; CutPacked skips it).
    int64_t excess = held[r] - targets[r];
    for (int64_t k = last_chunk[r]; k >= 0 && excess > 0; --k) {
      if (owner[k] != r) continue;
      const int64_t take = std::min(excess, sizes[k]);
      sizes[k] -= take;
      excess -= take;
    }
  }
  return FinishPlan(batch, CutPacked(batch, sizes, owner));
}

}  // namespace flashcp::core::internal
