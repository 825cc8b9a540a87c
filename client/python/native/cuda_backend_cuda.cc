// The CUDA hook over worker/cuda/shard_attention.h (built only with the CUDA
// backend).
#include <utility>

#include "client/python/native/cuda_backend.h"
#include "core/status_macros.h"
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

}  // namespace

bool CudaBackendBuilt() { return true; }

absl::StatusOr<std::unique_ptr<CudaShardAttention>> MakeCudaShardAttention(
    const worker::CpRankLayout& plan, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
    float scale, uintptr_t stream) {
  if (plan.collective == worker::Collective::kAllToAll) {
    return absl::UnimplementedError(
        "scheme: all_to_all has no CUDA path yet (docs/gpu.md); pass CPU tensors");
  }
  if (plan.block_size > 0)  // the shard kernels are the causal ones (docs/gpu.md)
    return absl::UnimplementedError(
        "attention_mask: the CUDA path does not compute block_diffusion yet; use CPU tensors");
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
