// The static baselines: Llama3 CP, Per-Doc CP (= Ring-Attn zigzag sharding)
// and Ring-Attn. Every rank gets exactly its canonical token target.
#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

std::vector<Shard> CutPacked(const Batch& batch, const std::vector<int64_t>& sizes,
                             const std::vector<int32_t>& owners) {
  std::vector<Shard> pieces;
  int32_t doc = 0;
  int64_t doc_pos = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    int64_t left = sizes[k];
    while (left > 0) {
      const int64_t take = std::min(left, batch.doc_lens[doc] - doc_pos);
      pieces.push_back(Shard{doc, doc_pos, take, owners[k]});
      left -= take;
      doc_pos += take;
      if (doc_pos == batch.doc_lens[doc]) {
        ++doc;
        doc_pos = 0;
      }
    }
  }
  return pieces;
}

std::vector<int64_t> RankTargets(const Batch& batch) {
  const int64_t total = TotalTokens(batch.doc_lens);
  std::vector<int64_t> targets(batch.cp_size);
  for (int32_t r = 0; r < batch.cp_size; ++r) targets[r] = RankRealTokens(total, batch.cp_size, r);
  return targets;
}

namespace {

// Sorts valid pieces (documents and ranks in range, no two with one rank,
// document and start) by (rank, document, start) and merges touching ones of
// one document on one rank, in place, in O(pieces + documents + ranks): a
// counting sort by document, a stable one by rank, then one pass over each
// run of one document on one rank (a few pieces), sorted by start and
// merged. The keys are distinct, so the order is the one any sort gives.
// Planners finish many candidates of thousands of pieces; a comparison sort
// was most of it.
void SortAndMerge(const Batch& batch, std::vector<Shard>& pieces) {
  const auto before = [](const Shard& a, const Shard& b) {
    return std::tie(a.rank, a.doc, a.start) < std::tie(b.rank, b.doc, b.start);
  };
  constexpr size_t kSmall = 64;  // below this a comparison sort is cheaper
  // Pieces often come as a plan's shards, already in order: only merges
  // are left.
  const bool sorted =
      std::adjacent_find(pieces.begin(), pieces.end(),
                         [&](const Shard& a, const Shard& b) { return !before(a, b); }) ==
      pieces.end();
  bool runs_sorted = true;  // each run of one document on one rank by start
  if (!sorted && pieces.size() < kSmall) {
    std::sort(pieces.begin(), pieces.end(), before);
  } else if (!sorted) {
    std::vector<Shard> by_doc(pieces.size());
    std::vector<int32_t> doc_next(batch.doc_lens.size() + 1, 0);
    std::vector<int32_t> rank_next(static_cast<size_t>(batch.cp_size) + 1, 0);
    for (const Shard& s : pieces) {
      ++doc_next[s.doc + 1];
      ++rank_next[s.rank + 1];
    }
    std::partial_sum(doc_next.begin(), doc_next.end(), doc_next.begin());
    std::partial_sum(rank_next.begin(), rank_next.end(), rank_next.begin());
    for (const Shard& s : pieces) by_doc[doc_next[s.doc]++] = s;
    for (const Shard& s : by_doc) pieces[rank_next[s.rank]++] = s;
    runs_sorted = false;
  }
  // Merged in place: the first `kept` entries are the shards so far.
  size_t kept = 0;
  for (size_t b = 0; b < pieces.size();) {
    size_t e = b + 1;
    while (e < pieces.size() && pieces[e].rank == pieces[b].rank &&
           pieces[e].doc == pieces[b].doc) {
      ++e;
    }
    if (!runs_sorted && e - b > 1) {
      std::sort(pieces.begin() + static_cast<std::ptrdiff_t>(b),
                pieces.begin() + static_cast<std::ptrdiff_t>(e),
                [](const Shard& x, const Shard& y) { return x.start < y.start; });
    }
    for (size_t i = b; i < e; ++i) {
      if (i > b) {
        Shard& prev = pieces[kept - 1];  // this run's last shard so far
        if (prev.start + prev.len == pieces[i].start) {
          prev.len += pieces[i].len;
          continue;
        }
      }
      if (kept != i) pieces[kept] = pieces[i];
      ++kept;
    }
    b = e;
  }
  pieces.resize(kept);
}

}  // namespace

Plan FinishPlan(const Batch& batch, std::vector<Shard> pieces) {
  std::erase_if(pieces, [](const Shard& s) { return s.len == 0; });
  SortAndMerge(batch, pieces);
  Plan plan;
  plan.cp_size = batch.cp_size;
  plan.doc_lens = batch.doc_lens;
  plan.padding = PaddingTokens(TotalTokens(batch.doc_lens), batch.cp_size);
  plan.shards = std::move(pieces);
  return plan;
}

Plan PlanRing(const Batch& batch) {
  std::vector<int32_t> owners(batch.cp_size);
  for (int32_t r = 0; r < batch.cp_size; ++r) owners[r] = r;
  return FinishPlan(batch, CutPacked(batch, RankTargets(batch), owners));
}

Plan PlanLlama3(const Batch& batch) {
  // Chunk k (k < N) and chunk 2N-1-k belong to rank k; the front chunk takes
  // the larger half when the rank's target is odd.
  const int32_t n = batch.cp_size;
  const std::vector<int64_t> targets = RankTargets(batch);
  std::vector<int64_t> sizes(2 * n);
  std::vector<int32_t> owners(2 * n);
  for (int32_t r = 0; r < n; ++r) {
    sizes[r] = (targets[r] + 1) / 2;
    sizes[2 * n - 1 - r] = targets[r] / 2;
    owners[r] = r;
    owners[2 * n - 1 - r] = r;
  }
  return FinishPlan(batch, CutPacked(batch, sizes, owners));
}

Plan PlanPerDoc(const Batch& batch) {
  // Each document of length L splits into 2N chunks of L / 2N tokens; chunk k
  // and chunk 2N-1-k go to rank k. The L % 2N leftover tokens are dealt one at
  // a time to ranks in a round robin that runs across documents, a rank's
  // first leftover of a document joining its front chunk and its second its
  // back chunk. Each rank then gets 2 * sum(L / 2N) plus its share of the
  // leftovers, the first (total % N) ranks one more: the canonical targets.
  const int32_t n = batch.cp_size;
  std::vector<Shard> pieces;
  std::vector<int64_t> chunk(2 * n);
  int32_t next = 0;  // round-robin position, carried across documents
  for (int32_t d = 0; d < static_cast<int32_t>(batch.doc_lens.size()); ++d) {
    const int64_t len = batch.doc_lens[d];
    std::fill(chunk.begin(), chunk.end(), len / (2 * n));
    for (int64_t left = len % (2 * n); left > 0; --left) {
      const int32_t r = next;
      next = (next + 1) % n;
      // A rank receives at most two leftovers of one document (left < 2N).
      if (chunk[r] == len / (2 * n)) {
        ++chunk[r];
      } else {
        ++chunk[2 * n - 1 - r];
      }
    }
    int64_t start = 0;
    for (int32_t k = 0; k < 2 * n; ++k) {
      const int32_t rank = k < n ? k : 2 * n - 1 - k;
      pieces.push_back(Shard{d, start, chunk[k], rank});
      start += chunk[k];
    }
  }
  return FinishPlan(batch, std::move(pieces));
}

}  // namespace flashcp::core::internal
