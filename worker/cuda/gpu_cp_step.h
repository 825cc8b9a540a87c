// One rank's FlashCP attention step on the GPU, forward and backward, on a
// DeviceCommunicator and an Attention implementation (cuDNN or plain).
//
// Forward: pack this rank's K and V rows the scheme sends (cp_layout.h), start
// the attention of whole documents (shards with no prefix) on the compute
// stream, and exchange KV meanwhile (the communicator's stream waits only for
// the packing; the call blocks the host, not the GPU); then stage each
// prefixed shard's KV as [prefix pieces, own rows] and run its attention.
// Backward: prefixed shards first (their remote dK, dV are what must travel),
// gradients of remote rows summed in fp32 and sent back as bf16 to their
// owners while the whole documents' backward runs; each owner adds what comes
// back in fp32, then rounds dK, dV to bf16 once.
// Under block diffusion (plan.block_size > 0) every shard is prefixed and its
// attention is the masked kernel pair (masked_attention_kernels.h, bf16
// storage, fp32 arithmetic), not `attention`; the exchange is the same.
//
// Under all_to_all (plan.collective == kAllToAll) the step is
// GpuAllToAllStep's (gpu_a2a_step.h): heads, not KV rows, travel, and the
// log-sum-exps stay with the heads (lse is written as zeros). Under the
// two-level scheme (a2a.two_level) that step runs a GpuCpRank of its own over
// the head-parallel rows for the KV across nodes.
//
// Local tensors (device, row = token, C/N rows, padding rows at the end):
//   q, o, dout, dq [rows][heads_q][D] bf16; k, v, dk, dv [rows][heads_kv][D]
//   bf16; lse [rows][heads_q] fp32. Every element of o, lse, dq, dk, dv is
//   written: shard rows by the attention itself (so a NaN sentinel put there
//   beforehand shows a missed row), padding rows as 0.
#ifndef FLASHCP_WORKER_CUDA_GPU_CP_STEP_H_
#define FLASHCP_WORKER_CUDA_GPU_CP_STEP_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/attention.h"
#include "worker/cp_layout.h"
#include "worker/cuda/device_communicator.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/gpu_a2a_step.h"
#include "worker/cuda/masked_batch.h"

namespace flashcp::worker::cuda {

// Device time of the attention launches of one step (CUDA events on the
// compute stream), in milliseconds. Attention only: packing, staging and
// exchange waits are outside these spans.
struct CpAttentionTimes {
  float whole_fwd_ms = 0, prefix_fwd_ms = 0, prefix_bwd_ms = 0, whole_bwd_ms = 0;
  float total() const { return whole_fwd_ms + prefix_fwd_ms + prefix_bwd_ms + whole_bwd_ms; }
};

class GpuCpRank {
 public:
  // `attention` and `comm` must outlive the rank. Uploads the index arrays and
  // allocates the exchange and staging buffers (sizes from the plan). Under
  // all_to_all `attention` is not used: `head_attention` makes the attention
  // of this position's heads (empty: CudnnAttention).
  static absl::StatusOr<std::unique_ptr<GpuCpRank>> Create(
      CpRankLayout plan, const AttentionShape& shape, Attention& attention,
      DeviceCommunicator& comm, cudaStream_t compute,
      const AttentionFactory& head_attention = {});

  absl::Status Forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse);
  // After Forward, with the same q, k, v, o, lse still alive.
  absl::Status Backward(const bf16* dout, bf16* dq, bf16* dk, bf16* dv);
  // Waits for the compute stream; the times of the last Forward + Backward.
  absl::StatusOr<CpAttentionTimes> Times() const;

  const CpRankLayout& plan() const { return plan_; }
  const VarlenBatch* whole_batch() const { return whole_ ? &*whole_ : nullptr; }
  const VarlenBatch* prefix_batch() const { return prefix_ ? &*prefix_ : nullptr; }

 private:
  GpuCpRank(CpRankLayout plan, const AttentionShape& shape, Attention& attention,
            DeviceCommunicator& comm, cudaStream_t compute)
      : plan_(std::move(plan)), shape_(shape), attention_(attention), comm_(comm),
        compute_(compute) {}
  absl::Status Init();

  CpRankLayout plan_;
  AttentionShape shape_;
  Attention& attention_;
  DeviceCommunicator& comm_;
  cudaStream_t compute_;
  int64_t width_ = 0;      // heads_kv * head_dim
  int64_t real_rows_ = 0;  // local rows the shards cover: [0, real_rows_)

  std::unique_ptr<GpuAllToAllStep> a2a_;  // all_to_all: the whole step
  std::optional<VarlenBatch> whole_, prefix_;
  // Block diffusion (plan_.block_size > 0): every shard is prefixed and runs
  // the masked kernels (masked_attention_kernels.h) instead of `attention_`;
  // masked_delta_ is their backward scratch (local_rows * heads_q).
  std::optional<MaskedBatch> masked_;
  DeviceBuffer<float> masked_delta_;
  DeviceBuffer<int64_t> d_pack_rows_, d_stage_src_, d_round_rows_;
  std::vector<std::pair<int64_t, int64_t>> rounds_;  // (first, count) in d_round_rows_
  DeviceBuffer<bf16> pack_, recv_, stage_k_, stage_v_, gstage_k_, gstage_v_, tmp_dk_, tmp_dv_;
  DeviceBuffer<bf16> ret_bf16_, back_;
  DeviceBuffer<float> acc_k_, acc_v_, ret_;
  CudaEvent packed_, returned_;
  CudaEvent t_[8];  // timing: whole fwd, prefix fwd, prefix bwd, whole bwd (start, end)
  // Saved by Forward for Backward.
  const bf16 *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *o_ = nullptr;
  const float* lse_ = nullptr;
};

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_GPU_CP_STEP_H_
