#include "core/internal/flashcp_util.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <utility>


namespace flashcp::core::internal {

std::vector<Shard> PerDocPieces(const Batch& batch, const std::vector<int32_t>& docs) {
  // PlanPerDoc's zigzag (baselines.cc) on the sub-batch, without its sort:
  // each document in 2N chunks of L / 2N tokens, chunks k and 2N-1-k to rank
  // k, the L % 2N leftovers dealt one at a time round robin across documents
  // (a rank's first leftover of a document to its front chunk, the second to
  // its back chunk). flashcp_test checks it against PlanPerDoc.
  const int32_t n = batch.cp_size;
  std::vector<Shard> pieces;
  pieces.reserve(docs.size() * 2 * static_cast<size_t>(n));
  std::vector<int64_t> chunk(2 * static_cast<size_t>(n));
  int32_t next = 0;
  for (int32_t d : docs) {
    const int64_t len = batch.doc_lens[d];
    const int64_t base = len / (2 * n);
    std::fill(chunk.begin(), chunk.end(), base);
    for (int64_t left = len % (2 * n); left > 0; --left) {
      const int32_t r = next;
      next = (next + 1) % n;
      if (chunk[r] == base) {
        ++chunk[r];
      } else {
        ++chunk[2 * n - 1 - r];
      }
    }
    int64_t start = 0;
    for (int32_t k = 0; k < 2 * n; ++k) {
      if (chunk[k] > 0) pieces.push_back(Shard{d, start, chunk[k], k < n ? k : 2 * n - 1 - k});
      start += chunk[k];
    }
  }
  return pieces;
}

void WholeDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                    const std::vector<int64_t>& tokens_needed, std::vector<double>& workload,
                    std::vector<Shard>& out, const WholeDocOptions& options) {
  const int32_t n = batch.cp_size;
  // 1. LPT: longest first, each whole to the least-loaded rank (lowest index on ties).
  std::vector<int64_t> tokens(n, 0);
  std::vector<std::vector<int32_t>> held(n);  // per rank, its documents longest first
  // Min-heap of (key, rank): only the chosen rank's key changes per step.
  const auto key = [&](int32_t q) {
    return workload[q] - options.rho * static_cast<double>(tokens[q] - tokens_needed[q]);
  };
  std::vector<std::pair<double, int32_t>> heap(n);
  for (int32_t q = 0; q < n; ++q) heap[q] = {key(q), q};
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  for (int32_t d : docs) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const int32_t r = heap.back().second;
    const int64_t len = batch.doc_lens[d];
    workload[r] += RangeWorkload(0, len);
    tokens[r] += len;
    held[r].push_back(d);
    heap.back() = {key(r), r};
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  }
  // 2. Equalize tokens: donors (over their need) give to receivers (under
  // their need), least-loaded receiver first.
  std::vector<int64_t> deficit(n);
  for (int32_t r = 0; r < n; ++r) deficit[r] = tokens_needed[r] - tokens[r];
  const auto least_loaded_receiver = [&](int64_t min_deficit) {
    int32_t best = -1;
    for (int32_t q = 0; q < n; ++q) {
      if (deficit[q] >= min_deficit && deficit[q] > 0 &&
          (best < 0 || workload[q] < workload[best])) {
        best = q;
      }
    }
    return best;
  };
  for (int32_t r = 0; r < n; ++r) {
    int64_t excess = -deficit[r];
    std::vector<int32_t>& mine = held[r];
    if (options.whole_moves && excess > 0) {
      // Shortest first; a moved document leaves `mine`.
      for (size_t i = mine.size(); i-- > 0 && excess > 0;) {
        const int64_t len = batch.doc_lens[mine[i]];
        if (len > excess) continue;
        const int32_t to = least_loaded_receiver(len);
        if (to < 0) continue;
        const double moved = RangeWorkload(0, len);
        out.push_back(Shard{mine[i], 0, len, to});
        workload[to] += moved;
        workload[r] -= moved;
        deficit[to] -= len;
        excess -= len;
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    for (int32_t d : mine) {
      const int64_t len = batch.doc_lens[d];
      int64_t head = 0;  // tokens [0, head) of d already handed out
      while (excess > 0 && head < len) {
        // Total need equals total tokens, so an excess implies some deficit.
        const int32_t to = least_loaded_receiver(1);
        const int64_t take = std::min({excess, deficit[to], len - head});
        const double moved = RangeWorkload(head, take);
        out.push_back(Shard{d, head, take, to});
        workload[to] += moved;
        workload[r] -= moved;
        deficit[to] -= take;
        excess -= take;
        head += take;
      }
      if (head < len) out.push_back(Shard{d, head, len - head, r});
    }
    if (deficit[r] < 0) deficit[r] = 0;  // the donor now holds exactly its need
  }
}

std::vector<int32_t> DocsLongestFirst(const Batch& batch) {
  std::vector<int32_t> order(batch.doc_lens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return batch.doc_lens[a] > batch.doc_lens[b];
  });
  return order;
}

std::vector<double> PieceWorkloads(int32_t cp_size, const std::vector<Shard>& pieces) {
  std::vector<double> w(cp_size, 0.0);
  for (const Shard& s : pieces) w[s.rank] += RangeWorkload(s.start, s.len);
  return w;
}

PlanScore ScorePieces(const Batch& batch, const std::vector<Shard>& pieces) {
  const int32_t n = batch.cp_size;
  std::vector<double> w(n, 0.0);
  std::vector<int64_t> nonlast(n, 0);
  PlanScore score;
  for (const Shard& s : pieces) {
    if (s.len == 0) continue;
    const int64_t len = batch.doc_lens[s.doc];
    w[s.rank] += RangeWorkload(s.start, s.len);
    if (s.start + s.len < len) nonlast[s.rank] += s.len;
    if (s.len < len) {
      if (s.start == 0) ++score.cut_docs;
      if (score.min_cut_len == 0 || s.len < score.min_cut_len) score.min_cut_len = s.len;
    }
  }
  double total = 0, max_w = 0;
  for (double x : w) {
    total += x;
    max_w = std::max(max_w, x);
  }
  score.imbalance = total > 0 ? max_w / (total / n) : 1.0;
  score.max_nonlast = *std::max_element(nonlast.begin(), nonlast.end());
  return score;
}

PlanScore ScorePlan(const Plan& plan) {
  return ScorePieces(Batch{plan.doc_lens, plan.cp_size}, plan.shards);
}

}  // namespace flashcp::core::internal
