// Planning under the block-diffusion mask (core/mask.h; docs/bdlm.md): the
// plans cover the 2C-token [noisy ; clean] sequence as 2n plan documents
// (types.h, Plan) and carry the mask.
#ifndef FLASHCP_CORE_INTERNAL_BDLM_H_
#define FLASHCP_CORE_INTERNAL_BDLM_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Turbo-dLLM's schedule (ScalingIntelligence/Turbo-dLLM, Apache-2.0,
// dllm_parallel/core/schedules/block.py), reimplemented.
// dual_end_pairs: (j, n_b - 1 - j) for j < n_b / 2, then (n_b / 2) alone
// when n_b is odd.
std::vector<std::vector<int64_t>> DualEndPairs(int64_t num_blocks);
// _dual_end_assignments: each worker's tasks (pairs, or the odd middle block
// alone) in order. The pairs are dealt in contiguous runs, worker w getting
// P / W + (w < P % W) of them; the odd middle block goes to the worker with
// the least sum of block indices (the first on a tie); with fewer tasks than
// workers (_short_dual_end_assignments) single blocks from the last down
// each go to the lightest worker (least sum, then lowest index).
// InvalidArgument when num_blocks < workers ("block_size": every worker must
// own a whole block) or either is < 1.
absl::StatusOr<std::vector<std::vector<std::vector<int64_t>>>> DualEndAssignments(
    int64_t num_blocks, int32_t workers);
// attention/cp_backend.py clean_shards_for_rank, layout "dual_chunk": rank r
// owns balanced_bounds(L, 2c, r) and balanced_bounds(L, 2c, 2c - 1 - r),
// where balanced_bounds gives part k the range [k q + min(k, m), + q + (k < m))
// with q, m = divmod(L, parts). Half-open [begin, end) token ranges.
std::pair<int64_t, int64_t> BalancedBounds(int64_t items, int64_t parts, int64_t index);

// csbp (Strategy::kCsbp) under block diffusion: Turbo-dLLM's plan over the
// packed sequence (Turbo-dLLM packs with no per-document mask, so its blocks
// are the packed noisy stream's b-token blocks, a document's blocks cut
// where documents do not start at multiples of b): noisy blocks by
// DualEndAssignments, the clean copy in 2N chunks, rank r holding chunks r
// and 2N-1-r. Each chunk pair has the tokens that bring the rank to its
// 2C/N; where every rank's noisy tokens are equal (2N divides the blocks)
// the chunks are exactly clean_shards_for_rank's dual chunks.
// FailedPrecondition ("block_size") where the packed stream has fewer than
// N blocks or a rank's noisy blocks alone exceed its 2C/N tokens.
absl::StatusOr<Plan> PlanCsbp(const Batch& batch, int64_t block_size);

// flashcp under block diffusion (bdlm_flashcp.cc): flashcp's causal plan of
// the batch with each clean token on its noisy twin's rank, noisy cuts moved
// to block boundaries, the tokens made 2C/N, checked on the mask's workload;
// csbp's plan where that one moves less.
absl::StatusOr<Plan> PlanBlockDiffusionFlashCp(const Batch& batch, const PlanOptions& options);

// MakePlan under options.attention_mask = block diffusion: llama3, per_doc,
// zigzag and ring over the 2C sequence (2n plan documents), csbp, flashcp;
// InvalidArgument naming "strategy" for the others.
absl::StatusOr<Plan> PlanBlockDiffusion(Strategy strategy, const Batch& batch,
                                        const PlanOptions& options);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_BDLM_H_
