#include "core/internal/flashcp_options.h"

#include "core/internal/flashcp_pieces.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

FlashCpOptions FlashCpOptions::For(const Batch& batch, const PlanOptions& options) {
  FlashCpOptions o;
  o.target = options.target_imbalance;
  o.min_shard = options.min_shard_tokens;
  o.ranks_per_node = options.ranks_per_node;
  o.stop = &options.stop;
  o.order = DocsLongestFirst(batch);
  o.targets = RankTargets(batch);
  for (int64_t len : batch.doc_lens) o.total_work += RangeWorkload(0, len);
  o.mean_work = o.total_work / batch.cp_size;
  o.max_work = o.target * o.mean_work;
  o.median_density =
      (static_cast<double>(batch.doc_lens[o.order[o.order.size() / 2]]) + 1.0) / 2.0;
  o.sliver_cost = kSliverCostFactor * o.min_shard;
  return o;
}

}  // namespace flashcp::core::internal
