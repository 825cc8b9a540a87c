// Raw pieces and their workload (flashcp_pieces.h).
#include "core/internal/flashcp_pieces.h"

#include <numeric>

namespace flashcp::core::internal {

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
  AddPieceWorkloads(pieces, w);
  return w;
}

void AddPieceWorkloads(std::span<const Shard> pieces, std::vector<double>& workload) {
  for (const Shard& s : pieces) workload[s.rank] += RangeWorkload(s.start, s.len);
}

}  // namespace flashcp::core::internal
