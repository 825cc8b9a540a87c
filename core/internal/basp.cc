// BASP (batch-aware sequence parallelism, arXiv 2609.03151; no public code):
// reimplemented from the paper's description (../shared/paper/
// related-systems-notes.md, section 2). B documents of equal length L with B
// dividing N: group i = ranks [iK, (i+1)K), K = N / B, holds document i,
// zigzagged in 2K chunks (chunks k and 2K-1-k to the group's rank k), so
// every exchange is K-way and, with K ranks a node, stays on the node. No
// fallback: any other batch is refused.
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

absl::StatusOr<Plan> PlanBasp(const Batch& batch) {
  const int64_t b = static_cast<int64_t>(batch.doc_lens.size());
  const int32_t n = batch.cp_size;
  if (n % b != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_size: basp gives each of the batch's B = ", b,
        " documents a group of N / B ranks, so B must divide N = ", n));
  }
  const int64_t len = batch.doc_lens[0];
  for (int64_t d = 1; d < b; ++d) {
    if (batch.doc_lens[d] != len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "doc_lens: basp needs documents of equal length; doc ", d, " has ",
          batch.doc_lens[d], " tokens, doc 0 has ", len));
    }
  }
  const int32_t k = static_cast<int32_t>(n / b);
  // Equal tokens per rank with no document crossing a group: each group's K
  // ranks hold exactly one document, so K must divide L (padding would fall
  // on the last ranks only and unbalance the groups).
  if (len % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "doc_lens: basp splits each document of ", len, " tokens evenly over its group of K = ",
        k, " ranks (N / B), so K must divide the length"));
  }
  const int64_t t = len / k;  // tokens per rank
  std::vector<Shard> pieces;
  pieces.reserve(static_cast<size_t>(2 * n));
  for (int32_t d = 0; d < static_cast<int32_t>(b); ++d) {
    int64_t start = 0;
    for (int32_t c = 0; c < 2 * k; ++c) {
      // Chunk c and chunk 2K-1-c to the group's rank c; the front chunk takes
      // the larger half of an odd T.
      const int32_t local = c < k ? c : 2 * k - 1 - c;
      const int64_t size = c < k ? (t + 1) / 2 : t / 2;
      pieces.push_back(Shard{d, start, size, d * k + local});
      start += size;
    }
  }
  return FinishPlan(batch, std::move(pieces));
}

}  // namespace flashcp::core::internal
