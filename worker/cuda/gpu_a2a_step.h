// One rank's all-to-all (Ulysses) attention step on the GPU, forward and
// backward: worker/a2a_step.h's arithmetic (the CPU engine's) on device
// buffers, bf16 storage, fp32 sums, through a DeviceCommunicator (NCCL: one
// ncclGroupStart/End of ncclSend/ncclRecv per exchange, one message per
// peer and direction). GpuCpRank runs it for a layout whose collective is
// kAllToAll (gpu_cp_step.h).
//
// Per phase, within the rank's group of K (cp_layout.h's a2a part):
//   forward:  Q | K | V rows of this rank's real tokens for every other
//             position's heads out, the group's other tokens of this
//             position's heads in; the group's documents attend whole on
//             the head-parallel rows (an Attention of this position's
//             heads); the output rows back to their owners;
//   backward: dO as Q went; the attention's backward; dQ | dK | dV back to
//             their owners, who sum a replicated KV head's gradients in
//             fp32, position by position, and round to bf16 once.
// The communicator counts exactly core::AnalyzePlan's bytes[kAllToAll] with
// dtype_bytes 2 and query_heads Hq. The log-sum-exps stay with the heads
// (the output exchange carries O only): Forward writes lse as zeros.
// GQA: where this position's query heads read its KV heads in the
// attention's order (query head a reads KV head a / (hq / hkv)), the KV heads
// go in as they are; otherwise each query head gets its KV head's copy and
// the copies' gradients are summed in fp32.
//
// The two-level scheme (plan.a2a.two_level; two_level_layout.h): the same
// step over the rank's node part, with the attention replaced by a GpuCpRank
// over the head-parallel rows (the layout's KV-row fields as a targeted
// layout of a2a.rows rows, this position's heads): whole runs on their own
// rows, the KV other nodes need out to the same position there and their
// prefixes in (one SendRecv each way, the communicator's grouped call), the
// prefixed runs on the staged KV; its backward returns the received rows'
// gradients. Bytes: core::TwoLevelGroupPhase's. Only where the position's
// query heads read its KV heads in the attention's order (Unimplemented
// naming query_heads otherwise: expanded KV heads would travel across nodes).
#ifndef FLASHCP_WORKER_CUDA_GPU_A2A_STEP_H_
#define FLASHCP_WORKER_CUDA_GPU_A2A_STEP_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/rank_groups.h"
#include "worker/cp_layout.h"
#include "worker/cuda/attention.h"
#include "worker/cuda/device_communicator.h"
#include "worker/cuda/device_memory.h"

namespace flashcp::worker::cuda {

class GpuCpRank;

// Makes the attention of one position's heads (the all-to-all attends Hq / K
// query heads, not the model's Hq).
using AttentionFactory =
    std::function<absl::StatusOr<std::unique_ptr<Attention>>(const AttentionShape&)>;

class GpuAllToAllStep {
 public:
  // `plan`: this rank's layout under all_to_all; `shape`: the model's heads
  // (Hq, Hkv, D, scale). FailedPrecondition naming query_heads where the
  // group's size does not divide Hq; InvalidArgument for another layout.
  // Uploads the row permutation, allocates every buffer (sizes from the
  // plan) and makes the position's attention with `make_attention`.
  static absl::StatusOr<std::unique_ptr<GpuAllToAllStep>> Create(
      const CpRankLayout& plan, const AttentionShape& shape,
      const AttentionFactory& make_attention, DeviceCommunicator& comm, cudaStream_t compute);
  ~GpuAllToAllStep();

  // q, o [local_rows][Hq][D], k, v [local_rows][Hkv][D] bf16, lse
  // [local_rows][Hq] fp32 (zeros); padding rows of o are 0.
  absl::Status Forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse);
  // After Forward: dq, dk, dv as q, k, v (every element written).
  absl::Status Backward(const bf16* dout, bf16* dq, bf16* dk, bf16* dv);
  // The attention launches' device time (events on the compute stream), ms;
  // two-level: the whole GpuCpRank step's, its KV exchange included.
  absl::StatusOr<float> ForwardMs() const;
  absl::StatusOr<float> BackwardMs() const;

  const core::AllToAllHeads& heads() const { return heads_; }

 private:
  GpuAllToAllStep(const CpRankLayout& plan, const AttentionShape& shape, DeviceCommunicator& comm,
                  cudaStream_t compute)
      : plan_(plan), shape_(shape), comm_(comm), compute_(compute) {}
  absl::Status Init(const AttentionFactory& make_attention);
  const AllToAllLayout& A() const { return plan_.a2a; }
  int32_t K() const { return static_cast<int32_t>(plan_.a2a.group.size()); }
  int32_t Pos() const { return plan_.a2a.position; }
  // Orders the communicator's stream after the compute stream's work so far.
  absl::Status CommWaitsForCompute(const char* what);
  // Backward step 3: the attention's dQ, dK, dV as this position's rows.
  absl::Status PackHeadGradientRows();
  // Row-major strided copy of `rows` rows of `width` elements.
  absl::Status Copy2D(bf16* dst, int64_t dst_pitch, const bf16* src, int64_t src_pitch,
                      int64_t rows, int64_t width, const char* what);

  CpRankLayout plan_;
  AttentionShape shape_;
  DeviceCommunicator& comm_;
  cudaStream_t compute_;
  core::AllToAllHeads heads_;
  int32_t hq_ = 0, hkv_ = 0;   // this position's query and KV heads
  int32_t attn_kv_ = 0;        // KV heads the attention reads: hkv_, or hq_ (expanded)
  std::vector<int32_t> kv_of_;  // per query head of this position: its local KV head
  std::unique_ptr<Attention> attention_;
  std::unique_ptr<GpuCpRank> cross_;  // two-level: the attention and the KV across nodes
  std::optional<VarlenBatch> docs_;  // the group's documents on the head-parallel rows
  DeviceBuffer<int64_t> d_doc_row_, d_inverse_;  // gathered -> head-parallel, and back
  // Exchange buffers (bf16): send_ per peer at send_first_[i], gathered_
  // [S][w_j] (w_j = (hq_ + 2 hkv_) D) in gathered order, heads_ the same rows
  // in head-parallel order; ret_ per peer at ret_first_[i].
  std::vector<int64_t> send_first_, ret_first_;
  DeviceBuffer<bf16> send_, gathered_, heads_buf_, ret_;
  // Head-parallel tensors (S rows) kept from Forward for Backward.
  DeviceBuffer<bf16> qh_, kh_, vh_, oh_, doh_, dqh_, dkh_, dvh_;
  DeviceBuffer<float> lseh_, acc_kh_, acc_vh_, acc_k_, acc_v_;
  CudaEvent packed_, t_[4];
  bool forward_done_ = false;
};

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_GPU_A2A_STEP_H_
