// The CUDA hook over worker/cuda/shard_attention.h (built only with the CUDA
// backend).
#include <utility>

#include "client/python/native/cuda_backend.h"
#include "core/status_macros.h"
#include "worker/cuda/attention.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/masked_attention_kernels.h"
#include "worker/cuda/masked_batch.h"
#include "worker/cuda/shard_attention.h"

static_assert(flashcp::python::kCudaWholeShards == flashcp::worker::cuda::kWholeShards);
static_assert(flashcp::python::kCudaPrefixedShards == flashcp::worker::cuda::kPrefixedShards);

namespace flashcp::python {
namespace {

void* P(uintptr_t a) { return reinterpret_cast<void*>(a); }

class Cudnn final : public CudaShardAttention {
 public:
  explicit Cudnn(std::unique_ptr<worker::cuda::ShardAttention> a) : a_(std::move(a)) {}

  absl::Status Forward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) override {
    return a_->Forward({P(b.q), P(b.k), P(b.v), P(b.k_stage), P(b.v_stage), P(b.out), P(b.lse)},
                       P(stream), groups);
  }
  absl::Status Backward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) override {
    return a_->Backward({P(b.q), P(b.k), P(b.v), P(b.k_stage), P(b.v_stage), P(b.out), P(b.dout),
                         P(b.lse), P(b.dq), P(b.dk), P(b.dv), P(b.dk_stage), P(b.dv_stage)},
                        P(stream), groups);
  }
  std::string fallback_reason() const override { return a_->fallback_reason(); }

 private:
  std::unique_ptr<worker::cuda::ShardAttention> a_;
};

// Block diffusion (plan.block_size > 0): every shard is prefixed and runs the
// masked kernels (worker/cuda/masked_attention_kernels.h, the GPU step's);
// the whole-shard group is empty, so a call for it does nothing.
class Masked final : public CudaShardAttention {
 public:
  Masked(worker::cuda::AttentionShape shape, worker::cuda::MaskedBatch batch,
         worker::cuda::DeviceBuffer<float> delta)
      : shape_(shape), batch_(std::move(batch)), delta_(std::move(delta)) {}

  absl::Status Forward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) override {
    if ((groups & kCudaPrefixedShards) == 0) return absl::OkStatus();
    return worker::cuda::LaunchMaskedAttentionForward(
        shape_, batch_.tables(), B(b.q), B(b.k_stage), B(b.v_stage), Bw(b.out), F(b.lse),
        S(stream));
  }
  // One delta scratch per kernel: calls on one stream (the binding orders
  // the prefixed group's calls on the current stream).
  absl::Status Backward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) override {
    if ((groups & kCudaPrefixedShards) == 0) return absl::OkStatus();
    return worker::cuda::LaunchMaskedAttentionBackward(
        shape_, batch_.tables(), B(b.q), B(b.k_stage), B(b.v_stage), B(b.out),
        reinterpret_cast<const float*>(b.lse), B(b.dout), delta_.data(), Bw(b.dq),
        Bw(b.dk_stage), Bw(b.dv_stage), S(stream));
  }
  std::string fallback_reason() const override { return ""; }

 private:
  static const worker::cuda::bf16* B(uintptr_t a) {
    return reinterpret_cast<const worker::cuda::bf16*>(a);
  }
  static worker::cuda::bf16* Bw(uintptr_t a) { return reinterpret_cast<worker::cuda::bf16*>(a); }
  static float* F(uintptr_t a) { return reinterpret_cast<float*>(a); }
  static cudaStream_t S(uintptr_t a) { return reinterpret_cast<cudaStream_t>(a); }

  worker::cuda::AttentionShape shape_;
  worker::cuda::MaskedBatch batch_;
  worker::cuda::DeviceBuffer<float> delta_;
};

}  // namespace

bool CudaBackendBuilt() { return true; }

absl::StatusOr<std::unique_ptr<CudaShardAttention>> MakeCudaShardAttention(
    const worker::CpRankLayout& plan, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
    float scale, uintptr_t stream) {
  if (plan.collective == worker::Collective::kAllToAll) {
    return absl::UnimplementedError(
        "scheme: all_to_all has no CUDA path yet (docs/gpu.md); pass CPU tensors");
  }
  if (plan.block_size > 0) {
    const worker::cuda::AttentionShape shape{heads_q, heads_kv, head_dim, scale};
    FLASHCP_RETURN_IF_ERROR(worker::cuda::ValidateAttentionShape(shape));
    FLASHCP_ASSIGN_OR_RETURN(worker::cuda::MaskedBatch batch,
                             worker::cuda::MaskedBatch::Create(
                                 plan, reinterpret_cast<cudaStream_t>(stream)));
    FLASHCP_ASSIGN_OR_RETURN(
        worker::cuda::DeviceBuffer<float> delta,
        worker::cuda::DeviceBuffer<float>::Allocate(plan.local_rows * heads_q));
    return std::unique_ptr<CudaShardAttention>(
        new Masked(shape, std::move(batch), std::move(delta)));
  }
  worker::cuda::ShardAttentionSpec spec;
  spec.heads_q = heads_q;
  spec.heads_kv = heads_kv;
  spec.head_dim = head_dim;
  spec.scale = scale;
  spec.q_rows = plan.local_rows;
  spec.stage_rows = static_cast<int64_t>(plan.stage_src.size());
  spec.whole_start = plan.whole_start;
  spec.whole_len = plan.whole_len;
  spec.prefix_q_start = plan.prefix_q_start;
  spec.prefix_q_len = plan.prefix_q_len;
  spec.prefix_kv_len = plan.prefix_kv_len;
  FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<worker::cuda::ShardAttention> a,
                           worker::cuda::ShardAttention::Create(spec, P(stream)));
  return std::unique_ptr<CudaShardAttention>(new Cudnn(std::move(a)));
}

}  // namespace flashcp::python
