// Attention under the block-diffusion mask on the GPU, forward (with the
// log-sum-exp) and backward (dQ, then dK/dV), over the CP step's staged K/V
// (cp_layout.h, block_size > 0): every shard is prefixed, its staged rows are
// exactly the K/V its queries attend to, each staged row carries its copy
// (noisy or clean) and position, and the kernels evaluate
// core::BlockDiffusionSees (core/mask_rule.h, the same function the CPU
// kernel worker/attention_masked_cpu.cc calls) per (query, key).
//
// Written for correctness over speed: one thread per (query row, query head)
// in forward and dQ, one per (staged row, KV head) in dK/dV, O(queries x keys)
// per shard, no tiling. Storage bf16 (inputs, O, dQ, staged dK/dV), all
// arithmetic in fp32 (online softmax in forward, probabilities recomputed from
// the fp32 LSE in backward, D = dO . O from the stored bf16 O). GQA: query
// head h reads KV head h / (heads_q / heads_kv). head_dim up to 256.
#ifndef FLASHCP_WORKER_CUDA_MASKED_ATTENTION_KERNELS_H_
#define FLASHCP_WORKER_CUDA_MASKED_ATTENTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/cuda/attention.h"

namespace flashcp::worker::cuda {

// The masked shards of one rank's layout as device arrays (MaskedBatch,
// masked_batch.h, uploads them). Per query i < q_count: its shard. Per shard
// s: first query row (local), query count, first query's position, 1 if
// noisy, first staged row, staged row count, and the index of its first
// query in the per-query array. Per staged row r: its shard, 1 if noisy,
// position. Plain C++17 (nvcc compiles this header).
struct MaskedTables {
  int64_t block_size = 0, q_count = 0, stage_rows = 0;
  const int32_t* q_shard = nullptr;
  const int64_t *shard_q_row = nullptr, *shard_q_len = nullptr, *shard_q_pos = nullptr,
                *shard_kv_first = nullptr, *shard_kv_len = nullptr, *shard_q_first = nullptr;
  const uint8_t* shard_noisy = nullptr;
  const int32_t* stage_shard = nullptr;
  const uint8_t* stage_noisy = nullptr;
  const int64_t* stage_pos = nullptr;
};

// o, lse at the shards' query rows: o [rows][heads_q][D] bf16, lse
// [rows][heads_q] fp32 (natural log). A query that sees no key (never in a
// valid layout) gets O = 0, LSE = -inf.
absl::Status LaunchMaskedAttentionForward(const AttentionShape& shape, const MaskedTables& batch,
                                          const bf16* q, const bf16* stage_k,
                                          const bf16* stage_v, bf16* o, float* lse,
                                          cudaStream_t stream);

// dq at the shards' query rows; gk, gv [stage rows][heads_kv][D] every staged
// row overwritten (0 for a key no query sees). `delta` is scratch of
// (max query row + 1) * heads_q floats (rows as q).
absl::Status LaunchMaskedAttentionBackward(const AttentionShape& shape, const MaskedTables& batch,
                                           const bf16* q, const bf16* stage_k,
                                           const bf16* stage_v, const bf16* o, const float* lse,
                                           const bf16* dout, float* delta, bf16* dq, bf16* gk,
                                           bf16* gv, cudaStream_t stream);

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_MASKED_ATTENTION_KERNELS_H_
