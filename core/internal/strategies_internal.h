// Per-strategy planners behind MakePlan. Each takes a batch that passed
// ValidateBatch and returns a plan that passes ValidatePlan.
#ifndef FLASHCP_CORE_INTERNAL_STRATEGIES_INTERNAL_H_
#define FLASHCP_CORE_INTERNAL_STRATEGIES_INTERNAL_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Turns raw pieces (any order, touching same-rank pieces allowed, zero-length
// pieces dropped) into a plan: shards by rank, each rank's in (doc, start)
// order, touching pieces of one document on one rank merged, padding set.
Plan FinishPlan(const Batch& batch, std::vector<Shard> pieces);

// Cuts the packed sequence into consecutive chunks of `sizes` tokens (summing
// to the batch's tokens), chunk k going to `owners[k]`, and intersects them
// with document boundaries: raw pieces for FinishPlan.
std::vector<Shard> CutPacked(const Batch& batch, const std::vector<int64_t>& sizes,
                             const std::vector<int32_t>& owners);

// The canonical per-rank real-token targets, RankRealTokens for every rank.
std::vector<int64_t> RankTargets(const Batch& batch);

Plan PlanLlama3(const Batch& batch);
Plan PlanPerDoc(const Batch& batch);  // also the Ring-Attn zigzag sharding
Plan PlanRing(const Batch& batch);
Plan PlanMagi(const Batch& batch);    // MagiAttention's default dispatch (magi.cc)
// Tokens per chunk PlanMagi uses: MagiAttention's ceil(C / 8N), lowered to
// the largest divisor of C/N at most that so every rank gets whole chunks;
// 0 where that divisor is below half of ceil(C / 8N) (PlanMagi then cuts
// near-equal chunks, magi.cc).
int64_t MagiChunkTokens(int64_t total, int32_t n);
Plan PlanWholeDoc(const Batch& batch);
// BASP (basp.cc): InvalidArgument naming doc_lens or cp_size unless the batch
// is B documents of one length L with B | N and (N / B) | L.
absl::StatusOr<Plan> PlanBasp(const Batch& batch);
Plan PlanFlashCpPaper(const Batch& batch, double target_imbalance);
// flashcp (flashcp.cc): PlanFlashCpCompacted's plan, or a grouped
// one where that moves less, its roles then swapped (flashcp_roles.h), then
// from 9 to 32 ranks a chunk-heap one, beyond 8 a density fill and at
// N >= 3 a capacity-group one, each where it moves less (flashcp_kv.h,
// flashcp_kvfill.h, flashcp_kvgroups.h), then its ranks placed on nodes
// (flashcp_nodes.h; flashcp.cc lists the stages; docs/planner.md, "Least KV
// moved").
// Both flashcp planners return options.stop's status once it says stop (the
// ILP, core/ilp/ilp.h, too).
absl::StatusOr<Plan> PlanFlashCp(const Batch& batch, const PlanOptions& options);
// flashcp's candidate search (flashcp.cc), scored on the compacted all-gather.
absl::StatusOr<Plan> PlanFlashCpCompacted(const Batch& batch, const PlanOptions& options);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_STRATEGIES_INTERNAL_H_
