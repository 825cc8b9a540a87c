// Attention under the block-diffusion mask on the CPU, forward and backward,
// over staged K/V whose rows carry what the mask needs (cp_layout.h, the
// block_size fields): per (query, key) the kernel asks
// core::BlockDiffusionSees, the mask's one statement. Plain fp32 (scores,
// softmax with the row maximum subtracted, fp32 sums), O(queries x keys) per
// shard; the probabilities are recomputed from the log-sum-exp in backward.
// Layouts as attention_cpu.h ([rows][heads][head_dim], lse [rows][heads]).
#ifndef FLASHCP_WORKER_ATTENTION_MASKED_CPU_H_
#define FLASHCP_WORKER_ATTENTION_MASKED_CPU_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/attention_cpu.h"
#include "worker/cp_layout.h"
#include "worker/thread_pool.h"

namespace flashcp::worker {

// One shard's attention: its queries at rows [q_row, q_row + q_len) of the
// query-side arrays, at document positions [q_pos, q_pos + q_len) of a
// noisy or clean copy; its staged keys [kv_len][H][D] with each key's copy
// and position. Keys and queries are of one document.
struct MaskedShardAttention {
  const float* k = nullptr;
  const float* v = nullptr;
  const uint8_t* key_noisy = nullptr;  // [kv_len]
  const int64_t* key_pos = nullptr;    // [kv_len]
  int64_t kv_len = 0;
  int64_t q_row = 0, q_len = 0, q_pos = 0;
  bool q_noisy = false;
  float* dk = nullptr;  // backward output [kv_len][H][D], overwritten
  float* dv = nullptr;
};

// The shards of a block-diffusion layout (p.block_size > 0) over staged K/V
// stage_k, stage_v ([stage rows][H][D]) and, in backward, their gradients
// gk, gv (same shape; null in forward). `row_floats` is H * D.
std::vector<MaskedShardAttention> MaskedStagedShards(const CpRankLayout& p, const float* stage_k,
                                                     const float* stage_v, float* gk, float* gv,
                                                     int64_t row_floats);

// InvalidArgument naming the field for a bad shape or block size, a null
// pointer, a query range outside [0, q_rows), or a query that sees no key.
absl::Status MaskedAttentionForwardCpu(const AttentionShape& shape, int64_t block_size,
                                       absl::Span<const MaskedShardAttention> shards,
                                       int64_t q_rows, const float* q, float* o, float* lse,
                                       ThreadPool& pool);

// Writes dq on the named rows and every shard's dk, dv (keys no query sees
// get 0). Race-free: dq per (shard, head), dk/dv per (shard, head).
absl::Status MaskedAttentionBackwardCpu(const AttentionShape& shape, int64_t block_size,
                                        absl::Span<const MaskedShardAttention> shards,
                                        int64_t q_rows, const float* q, const float* o,
                                        const float* lse, const float* dout, float* dq,
                                        ThreadPool& pool);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_ATTENTION_MASKED_CPU_H_
