// CSBP (context-sharded block parallelism) reimplemented from Turbo-dLLM's
// public code (ScalingIntelligence/Turbo-dLLM, Apache-2.0):
//  - dllm_parallel/core/schedules/block.py: dual_end_pairs,
//    _dual_end_assignments, _short_dual_end_assignments;
//  - dllm_parallel/attention/cp_backend.py: balanced_bounds,
//    clean_shards_for_rank (layout "dual_chunk").
// Also the dispatcher of every strategy under the block-diffusion mask.
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/internal/bdlm.h"
#include "core/internal/strategies_internal.h"
#include "core/mask.h"

namespace flashcp::core::internal {

std::vector<std::vector<int64_t>> DualEndPairs(int64_t num_blocks) {
  std::vector<std::vector<int64_t>> pairs;
  for (int64_t left = 0; left < num_blocks / 2; ++left) {
    pairs.push_back({left, num_blocks - 1 - left});
  }
  if (num_blocks % 2 != 0) pairs.push_back({num_blocks / 2});
  return pairs;
}

absl::StatusOr<std::vector<std::vector<std::vector<int64_t>>>> DualEndAssignments(
    int64_t num_blocks, int32_t workers) {
  if (num_blocks < 1 || workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_size: csbp needs blocks and workers, got ", num_blocks, " and ", workers));
  }
  if (num_blocks < workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: csbp gives every rank a whole block: ", num_blocks,
                     " blocks for ", workers, " ranks"));
  }
  using Tasks = std::vector<std::vector<int64_t>>;
  std::vector<Tasks> out(workers);
  const Tasks tasks = DualEndPairs(num_blocks);
  const auto sum = [](const Tasks& t) {
    int64_t s = 0;
    for (const auto& task : t) s = std::accumulate(task.begin(), task.end(), s);
    return s;
  };
  if (static_cast<int64_t>(tasks.size()) < workers) {
    // _short_dual_end_assignments: LPT over single blocks, largest first.
    std::vector<int64_t> cost(workers, 0);
    for (int64_t block = num_blocks - 1; block >= 0; --block) {
      const int32_t w = static_cast<int32_t>(
          std::min_element(cost.begin(), cost.end()) - cost.begin());  // first minimum
      out[w].push_back({block});
      cost[w] += block;
    }
    return out;
  }
  const bool odd = tasks.back().size() == 1;
  const int64_t paired = static_cast<int64_t>(tasks.size()) - (odd ? 1 : 0);
  const int64_t per = paired / workers, rem = paired % workers;
  int64_t next = 0;
  for (int32_t w = 0; w < workers; ++w) {
    const int64_t count = per + (w < rem ? 1 : 0);
    for (int64_t k = 0; k < count; ++k) out[w].push_back(tasks[next++]);
  }
  if (odd) {
    int32_t owner = 0;
    for (int32_t w = 1; w < workers; ++w) {
      if (sum(out[w]) < sum(out[owner])) owner = w;
    }
    out[owner].push_back(tasks.back());
  }
  return out;
}

std::pair<int64_t, int64_t> BalancedBounds(int64_t items, int64_t parts, int64_t index) {
  const int64_t base = items / parts, rem = items % parts;
  const int64_t start = index * base + std::min(index, rem);
  return {start, start + base + (index < rem ? 1 : 0)};
}

absl::StatusOr<Plan> PlanCsbp(const Batch& batch, int64_t block_size) {
  const int32_t n = batch.cp_size;
  const int64_t total = TotalTokens(batch.doc_lens);
  const int64_t blocks = (total + block_size - 1) / block_size;
  absl::StatusOr<std::vector<std::vector<std::vector<int64_t>>>> schedule =
      DualEndAssignments(blocks, n);
  if (!schedule.ok()) return absl::FailedPreconditionError(schedule.status().message());
  // Noisy: the packed noisy stream in blocks, block k to its scheduled owner.
  std::vector<int32_t> owner(blocks, 0);
  std::vector<int64_t> noisy(n, 0);
  for (int32_t w = 0; w < n; ++w) {
    for (const auto& task : (*schedule)[w]) {
      for (int64_t k : task) {
        owner[k] = w;
        noisy[w] += std::min(block_size, total - k * block_size);
      }
    }
  }
  std::vector<int64_t> block_sizes(blocks);
  for (int64_t k = 0; k < blocks; ++k) block_sizes[k] = std::min(block_size, total - k * block_size);
  std::vector<Shard> pieces = CutPacked(batch, block_sizes, owner);
  // Clean: rank r's two chunks r and 2N-1-r fill it to its 2C/N tokens; with
  // equal noisy shares they are balanced_bounds(C, 2N, .) exactly.
  const int64_t plan_total = 2 * total;
  std::vector<int64_t> sizes(2 * n);
  std::vector<int32_t> owners(2 * n);
  for (int32_t r = 0; r < n; ++r) {
    const int64_t clean = RankRealTokens(plan_total, n, r) - noisy[r];
    if (clean < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block_size: csbp's schedule gives rank ", r, " ", noisy[r],
          " noisy tokens, above its ", RankRealTokens(plan_total, n, r), " tokens"));
    }
    const auto [h0, h1] = BalancedBounds(total, 2 * n, r);
    const auto [t0, t1] = BalancedBounds(total, 2 * n, 2 * n - 1 - r);
    const int64_t head_base = h1 - h0, tail_base = t1 - t0;
    int64_t head = head_base + (clean - head_base - tail_base) / 2;
    head = std::clamp<int64_t>(head, 0, clean);
    sizes[r] = head;
    sizes[2 * n - 1 - r] = clean - head;
    owners[r] = r;
    owners[2 * n - 1 - r] = r;
  }
  std::vector<Shard> clean_pieces = CutPacked(batch, sizes, owners);
  const int32_t docs = static_cast<int32_t>(batch.doc_lens.size());
  for (Shard& s : clean_pieces) {
    s.doc += docs;
    pieces.push_back(s);
  }
  const AttentionMask mask{MaskKind::kBlockDiffusion, block_size};
  Plan plan = FinishPlan(PlanBatch(batch, mask), std::move(pieces));
  plan.mask = mask;
  return plan;
}

absl::StatusOr<Plan> PlanBlockDiffusion(Strategy strategy, const Batch& batch,
                                        const PlanOptions& options) {
  const AttentionMask& mask = options.attention_mask;
  const Batch doubled = PlanBatch(batch, mask);
  if (!PlansMask(strategy, mask)) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy: ", StrategyName(strategy),
                     " does not plan attention_mask block_diffusion (llama3, per_doc, ring, "
                     "zigzag, csbp, flashcp do)"));
  }
  absl::StatusOr<Plan> plan;
  switch (strategy) {
    case Strategy::kLlama3:
      plan = PlanLlama3(doubled);
      break;
    case Strategy::kPerDoc:
    case Strategy::kZigzag:
      plan = PlanPerDoc(doubled);
      break;
    case Strategy::kRing:
      plan = PlanRing(doubled);
      break;
    case Strategy::kCsbp:
      return PlanCsbp(batch, mask.block_size);
    case Strategy::kFlashCp:
      return PlanBlockDiffusionFlashCp(batch, options);
    default:  // PlansMask said no above
      return absl::InternalError("strategy: no block_diffusion planner");
  }
  plan->mask = mask;
  return plan;
}

}  // namespace flashcp::core::internal
