#include "core/internal/flashcp_kv.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "core/analysis.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {

std::vector<Shard> KvHeapPieces(const Batch& batch, int32_t chunks_per_rank, double slack,
                                bool tail_affinity) {
  const int32_t n = batch.cp_size;
  const int64_t total = TotalTokens(batch.doc_lens);
  const int64_t chunks = static_cast<int64_t>(chunks_per_rank) * n;
  // Chunk k is real tokens [k C / K, (k + 1) C / K) of the packed sequence.
  std::vector<int64_t> sizes(chunks);
  for (int64_t k = 0; k < chunks; ++k) sizes[k] = (k + 1) * total / chunks - k * total / chunks;
  // Per chunk its causal area (SPEC Eq. 3) and whether it continues chunk
  // k - 1's document (its first token is not a document's first).
  std::vector<double> area(chunks, 0.0);
  std::vector<uint8_t> joined(chunks, 0);
  // The chunk holding the last token of chunk k's first document.
  std::vector<int64_t> tail_chunk(chunks, -1);
  {
    size_t doc = 0;
    int64_t doc_pos = 0;
    int64_t doc_first_chunk = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      joined[k] = k > 0 && doc_pos > 0;
      if (!joined[k]) doc_first_chunk = k;
      int64_t left = sizes[k];
      while (left > 0) {
        const int64_t take = std::min(left, batch.doc_lens[doc] - doc_pos);
        area[k] += RangeWorkload(doc_pos, take);
        left -= take;
        doc_pos += take;
        if (doc_pos == batch.doc_lens[doc]) {
          for (int64_t j = doc_first_chunk; j <= k; ++j) {
            if (tail_chunk[j] < 0) tail_chunk[j] = k;
          }
          doc_first_chunk = k;
          ++doc;
          doc_pos = 0;
        }
      }
    }
  }
  // Largest area first (ties: the later chunk), each to the least-loaded
  // rank with fewer than chunks_per_rank chunks, or to the rank holding a
  // neighbouring chunk of the same document (or, with tail_affinity, the
  // chunk holding its first document's last token) if that is within
  // `slack` pairs of the least load.
  std::vector<int64_t> order(chunks);
  for (int64_t k = 0; k < chunks; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return area[a] != area[b] ? area[a] > area[b] : a > b;
  });
  std::vector<double> load(n, 0.0);
  std::vector<int32_t> count(n, 0);
  std::vector<int32_t> owner(chunks, -1);
  // The least-loaded rank with room, lowest index on ties (what a scan over
  // the ranks picks): a tournament tree whose node i (1 <= i < leaves) holds
  // the winner below it, -1 where none has room; leaf leaves + r is rank r
  // (-1 from N on, and once the rank is full). Every rank of a left subtree
  // is below every rank of its right sibling, so on equal loads the left
  // wins. Per chunk only the picked rank changes: one leaf-to-root walk.
  size_t leaves = 1;
  while (leaves < static_cast<size_t>(n)) leaves *= 2;
  std::vector<int32_t> tree(2 * leaves, -1);
  for (int32_t r = 0; r < n; ++r) tree[leaves + r] = chunks_per_rank > 0 ? r : -1;
  const auto winner = [&](int32_t a, int32_t b) {
    if (a < 0) return b;
    if (b < 0) return a;
    return load[b] < load[a] ? b : a;
  };
  for (size_t i = leaves - 1; i >= 1; --i) tree[i] = winner(tree[2 * i], tree[2 * i + 1]);
  for (int64_t k : order) {
    const int32_t least = tree[1];
    int32_t pick = least;
    for (const int64_t j : {k - 1, k + 1, tail_affinity ? tail_chunk[k] : int64_t{-1}}) {
      if (j < 0 || j >= chunks || owner[j] < 0 || j == k) continue;
      if (j != tail_chunk[k] && !joined[std::max(j, k)]) continue;
      const int32_t r = owner[j];
      if (count[r] >= chunks_per_rank || load[r] > load[least] + slack) continue;
      if (pick == least || load[r] < load[pick]) pick = r;
    }
    owner[k] = pick;
    ++count[pick];
    load[pick] += area[k];
    if (count[pick] >= chunks_per_rank) tree[leaves + pick] = -1;
    for (size_t i = (leaves + static_cast<size_t>(pick)) / 2; i >= 1; i /= 2) {
      tree[i] = winner(tree[2 * i], tree[2 * i + 1]);
    }
  }
  // Each rank's last chunk takes up the difference to its token target
  // (near-equal chunks differ by a token; the last ranks hold one padding
  // token each).
  std::vector<int64_t> held(n, 0), last(n, -1);
  for (int64_t k = 0; k < chunks; ++k) {
    held[owner[k]] += sizes[k];
    last[owner[k]] = k;
  }
  const std::vector<int64_t> targets = RankTargets(batch);
  for (int32_t r = 0; r < n; ++r) {
    int64_t diff = targets[r] - held[r];
    for (int64_t k = last[r]; k >= 0 && diff != 0; --k) {
      if (owner[k] != r) continue;
      const int64_t change = std::max(diff, -sizes[k]);
      sizes[k] += change;
      diff -= change;
    }
  }
  return CutPacked(batch, sizes, owner);
}

absl::Status ChunkHeapCandidates(const Batch& batch, const FlashCpOptions& options,
                                 const RankBand& /*band*/, const StageAtN& at,
                                 CandidateJudge& judge) {
  const size_t variants = std::min(at.variants, std::size(kChunkHeapVariants));
  for (size_t v = 0; v < variants; ++v) {
    FLASHCP_RETURN_IF_ERROR(options.CheckStop());
    const ChunkHeapVariant& variant = kChunkHeapVariants[v];
    std::vector<Shard> pieces = KvHeapPieces(batch, variant.chunks_per_rank,
                                             variant.slack * options.mean_work,
                                             variant.tail_affinity);
    judge.Offer(pieces);
  }
  return absl::OkStatus();
}

}  // namespace flashcp::core::internal
