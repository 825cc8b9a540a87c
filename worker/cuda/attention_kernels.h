// Our own plain CUDA attention (forward and backward) for the varlen,
// bottom-right causal problem of attention.h: the fallback where cuDNN rejects
// a graph, and the oracle on the GPU. Written for clarity over speed (one warp
// per query or key row, shared-memory tiles of 32 rows, fp32 in registers);
// expect a small fraction of cuDNN's rate.
//
// Tolerance against the fp64 CPU reference (worker/attention_reference.h) on bf16
// inputs drawn from N(0, 1): relative L2 error ||x - ref|| / ||ref|| below
// 1e-2 for O, dQ, dK, dV (bf16 output rounding, ~4e-3, dominates) and below
// 1e-4 for the fp32 LSE.
#ifndef FLASHCP_WORKER_CUDA_ATTENTION_KERNELS_H_
#define FLASHCP_WORKER_CUDA_ATTENTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/cuda/attention.h"

namespace flashcp::worker::cuda {

// Launchers: asynchronous on `stream`; they check arguments and the launch.
// Unimplemented for head_dim other than 64 or 128.
absl::Status LaunchPlainAttentionForward(const AttentionShape& shape, const VarlenBatch& batch,
                                         const AttentionForwardArgs& args, cudaStream_t stream);

// `delta` is scratch of batch.q_rows() * shape.heads_q floats (rowsum(dO * O),
// indexed by absolute Q row).
absl::Status LaunchPlainAttentionBackward(const AttentionShape& shape, const VarlenBatch& batch,
                                          const AttentionBackwardArgs& args, float* delta,
                                          cudaStream_t stream);

// The plain kernels behind the Attention interface; owns the backward scratch.
class PlainAttention final : public Attention {
 public:
  static absl::StatusOr<std::unique_ptr<PlainAttention>> Create(const AttentionShape& shape);
  absl::string_view name() const override { return "plain"; }
  absl::Status Forward(const VarlenBatch& batch, const AttentionForwardArgs& args,
                       cudaStream_t stream) override;
  absl::Status Backward(const VarlenBatch& batch, const AttentionBackwardArgs& args,
                        cudaStream_t stream) override;

 private:
  explicit PlainAttention(const AttentionShape& shape) : shape_(shape) {}
  AttentionShape shape_;
  DeviceBuffer<float> delta_;
};

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_ATTENTION_KERNELS_H_
