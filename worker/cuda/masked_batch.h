// The device tables of the masked kernels (masked_attention_kernels.h) for
// one rank's block-diffusion layout (cp_layout.h, block_size > 0), uploaded
// once by the GPU step. Host C++20 (the kernels' header is C++17 for nvcc).
#ifndef FLASHCP_WORKER_CUDA_MASKED_BATCH_H_
#define FLASHCP_WORKER_CUDA_MASKED_BATCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/cp_layout.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/masked_attention_kernels.h"

namespace flashcp::worker::cuda {

class MaskedBatch {
 public:
  // InvalidArgument naming the field unless p.block_size > 0 and the shard
  // and staged-row arrays agree (cp_layout.h).
  static absl::StatusOr<MaskedBatch> Create(const CpRankLayout& p, cudaStream_t stream);
  // Pointers into this batch's buffers: valid while it lives.
  const MaskedTables& tables() const { return t_; }

 private:
  MaskedTables t_;
  DeviceBuffer<int32_t> q_shard_, stage_shard_;
  DeviceBuffer<int64_t> shard_q_row_, shard_q_len_, shard_q_pos_, shard_kv_first_, shard_kv_len_,
      shard_q_first_, stage_pos_;
  DeviceBuffer<uint8_t> shard_noisy_, stage_noisy_;
};

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_MASKED_BATCH_H_
