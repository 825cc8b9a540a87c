#include "core/internal/flashcp_kv.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "core/analysis.h"
#include "core/internal/flashcp_pieces.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {

namespace {

// The packed sequence's chunks: sizes (tokens), causal areas (SPEC Eq. 3),
// whether each continues chunk k - 1's document (its first token is not a
// document's first), and the chunk holding the last token of chunk k's
// first document.
struct Chunks {
  std::vector<int64_t> sizes;
  std::vector<double> area;
  std::vector<uint8_t> joined;
  std::vector<int64_t> tail_chunk;
};

// Chunk k is real tokens [k C / K, (k + 1) C / K) of the packed sequence.
Chunks MakeChunks(const Batch& batch, int64_t chunks) {
  const int64_t total = TotalTokens(batch.doc_lens);
  Chunks c{std::vector<int64_t>(chunks), std::vector<double>(chunks, 0.0),
           std::vector<uint8_t>(chunks, 0), std::vector<int64_t>(chunks, -1)};
  for (int64_t k = 0; k < chunks; ++k) c.sizes[k] = (k + 1) * total / chunks - k * total / chunks;
  size_t doc = 0;
  int64_t doc_pos = 0;
  int64_t doc_first_chunk = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    c.joined[k] = k > 0 && doc_pos > 0;
    if (!c.joined[k]) doc_first_chunk = k;
    int64_t left = c.sizes[k];
    while (left > 0) {
      const int64_t take = std::min(left, batch.doc_lens[doc] - doc_pos);
      c.area[k] += RangeWorkload(doc_pos, take);
      left -= take;
      doc_pos += take;
      if (doc_pos == batch.doc_lens[doc]) {
        for (int64_t j = doc_first_chunk; j <= k; ++j) {
          if (c.tail_chunk[j] < 0) c.tail_chunk[j] = k;
        }
        doc_first_chunk = k;
        ++doc;
        doc_pos = 0;
      }
    }
  }
  return c;
}

// The least-loaded rank with room, lowest index on ties (what a scan over
// the ranks picks): a tournament tree whose node i (1 <= i < leaves) holds
// the winner below it, -1 where none has room; leaf leaves + r is rank r
// (-1 from N on, and once the rank is full). Every rank of a left subtree
// is below every rank of its right sibling, so on equal loads the left
// wins. Per chunk only the picked rank changes: one leaf-to-root walk.
class LeastLoaded {
 public:
  LeastLoaded(const std::vector<double>& load, int32_t n, bool open) : load_(load) {
    while (leaves_ < static_cast<size_t>(n)) leaves_ *= 2;
    tree_.assign(2 * leaves_, -1);
    for (int32_t r = 0; r < n; ++r) tree_[leaves_ + r] = open ? r : -1;
    for (size_t i = leaves_ - 1; i >= 1; --i) tree_[i] = Winner(tree_[2 * i], tree_[2 * i + 1]);
  }
  int32_t Least() const { return tree_[1]; }
  // Rank r's load changed (closed: it takes no more chunks).
  void Update(int32_t r, bool closed) {
    if (closed) tree_[leaves_ + r] = -1;
    for (size_t i = (leaves_ + static_cast<size_t>(r)) / 2; i >= 1; i /= 2) {
      tree_[i] = Winner(tree_[2 * i], tree_[2 * i + 1]);
    }
  }

 private:
  int32_t Winner(int32_t a, int32_t b) const {
    if (a < 0) return b;
    if (b < 0) return a;
    return load_[b] < load_[a] ? b : a;
  }
  const std::vector<double>& load_;
  size_t leaves_ = 1;
  std::vector<int32_t> tree_;
};

// Each rank's last chunk takes up the difference to its token target
// (near-equal chunks differ by a token; the last ranks hold one padding
// token each).
void FitToTargets(const Batch& batch, const std::vector<int32_t>& owner,
                  std::vector<int64_t>& sizes) {
  const int32_t n = batch.cp_size;
  const int64_t chunks = static_cast<int64_t>(sizes.size());
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
}

}  // namespace

std::vector<Shard> KvHeapPieces(const Batch& batch, int32_t chunks_per_rank, double slack,
                                bool tail_affinity) {
  const int32_t n = batch.cp_size;
  const int64_t chunks = static_cast<int64_t>(chunks_per_rank) * n;
  Chunks c = MakeChunks(batch, chunks);
  // Largest area first (ties: the later chunk), each to the least-loaded
  // rank with fewer than chunks_per_rank chunks, or to the rank holding a
  // neighbouring chunk of the same document (or, with tail_affinity, the
  // chunk holding its first document's last token) if that is within
  // `slack` pairs of the least load.
  std::vector<int64_t> order(chunks);
  for (int64_t k = 0; k < chunks; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return c.area[a] != c.area[b] ? c.area[a] > c.area[b] : a > b;
  });
  std::vector<double> load(n, 0.0);
  std::vector<int32_t> count(n, 0);
  std::vector<int32_t> owner(chunks, -1);
  LeastLoaded least_loaded(load, n, chunks_per_rank > 0);
  for (int64_t k : order) {
    const int32_t least = least_loaded.Least();
    int32_t pick = least;
    for (const int64_t j : {k - 1, k + 1, tail_affinity ? c.tail_chunk[k] : int64_t{-1}}) {
      if (j < 0 || j >= chunks || owner[j] < 0 || j == k) continue;
      if (j != c.tail_chunk[k] && !c.joined[std::max(j, k)]) continue;
      const int32_t r = owner[j];
      if (count[r] >= chunks_per_rank || load[r] > load[least] + slack) continue;
      if (pick == least || load[r] < load[pick]) pick = r;
    }
    owner[k] = pick;
    ++count[pick];
    load[pick] += c.area[k];
    least_loaded.Update(pick, count[pick] >= chunks_per_rank);
  }
  FitToTargets(batch, owner, c.sizes);
  return CutPacked(batch, c.sizes, owner);
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
