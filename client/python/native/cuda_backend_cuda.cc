// The CUDA hook over worker/cuda/shard_attention.h (built only with the CUDA
// backend).
#include <utility>

#include "absl/strings/str_cat.h"
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

// The shard groups of a layout (not block diffusion). Under all_to_all the
// query-side rows are the head-parallel rows (cp_layout.h's AttentionRows)
// and the whole shards the group's documents; there are no prefixed shards,
// except under the two-level scheme (a2a.two_level: runs of a node part whose
// prefix came across nodes, staged as the targeted scheme's).
worker::cuda::ShardAttentionSpec SpecOf(const worker::CpRankLayout& plan, int32_t heads_q,
                                        int32_t heads_kv, int32_t head_dim, float scale) {
  worker::cuda::ShardAttentionSpec spec;
  spec.heads_q = heads_q;
  spec.heads_kv = heads_kv;
  spec.head_dim = head_dim;
  spec.scale = scale;
  spec.q_rows = worker::AttentionRows(plan);
  spec.stage_rows = static_cast<int64_t>(plan.stage_src.size());
  spec.whole_start = plan.whole_start;
  spec.whole_len = plan.whole_len;
  spec.prefix_q_start = plan.prefix_q_start;
  spec.prefix_q_len = plan.prefix_q_len;
  spec.prefix_kv_len = plan.prefix_kv_len;
  return spec;
}

worker::cuda::ShardForwardBuffers ForwardBuffers(const CudaShardBuffers& b) {
  return {P(b.q), P(b.k), P(b.v), P(b.k_stage), P(b.v_stage), P(b.out), P(b.lse)};
}
worker::cuda::ShardBackwardBuffers BackwardBuffers(const CudaShardBuffers& b) {
  return {P(b.q),    P(b.k),  P(b.v),  P(b.k_stage), P(b.v_stage),  P(b.out),     P(b.dout),
          P(b.lse),  P(b.dq), P(b.dk), P(b.dv),      P(b.dk_stage), P(b.dv_stage)};
}

// all_to_all attends whole documents under the causal document mask only
// (flashcp.torch refuses it under block diffusion before it gets here).
absl::Status CheckCollective(const worker::CpRankLayout& plan) {
  if (plan.collective == worker::Collective::kAllToAll && plan.block_size > 0) {
    return absl::UnimplementedError(
        "scheme: all_to_all under attention_mask block_diffusion is not built; use targeted");
  }
  return absl::OkStatus();
}

// One layout on its own attention (graphs and workspace die with it): the
// per-step object of CudaShardAttention, kept for callers without an
// allocator; flashcp.torch uses the cache below.
class Cudnn final : public CudaShardAttention {
 public:
  Cudnn(std::unique_ptr<worker::cuda::ShardAttention> a,
        std::unique_ptr<worker::cuda::ShardBatches> batches)
      : a_(std::move(a)), batches_(std::move(batches)) {}

  absl::Status Forward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) override {
    return a_->Forward(*batches_, ForwardBuffers(b), P(stream), groups);
  }
  absl::Status Backward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) override {
    return a_->Backward(*batches_, BackwardBuffers(b), P(stream), groups);
  }
  std::string fallback_reason() const override { return a_->fallback_reason(); }

 private:
  std::unique_ptr<worker::cuda::ShardAttention> a_;
  std::unique_ptr<worker::cuda::ShardBatches> batches_;
};

class Batch final : public CudaShardBatch {
 public:
  explicit Batch(std::unique_ptr<worker::cuda::ShardBatches> b) : b_(std::move(b)) {}
  const std::vector<int32_t>& tables() const override { return b_->tables(); }
  absl::Status UseDeviceTables(uintptr_t device, int64_t count) override {
    return b_->UseDeviceTables(P(device), count);
  }
  const worker::cuda::ShardBatches& batches() const { return *b_; }

 private:
  std::unique_ptr<worker::cuda::ShardBatches> b_;
};

class Cache final : public CudaAttentionCache {
 public:
  Cache(worker::cuda::ShardAttentionShape shape, std::unique_ptr<worker::cuda::ShardAttention> a)
      : shape_(shape), a_(std::move(a)) {}

  absl::StatusOr<std::unique_ptr<CudaShardBatch>> Describe(
      const worker::CpRankLayout& plan) override {
    FLASHCP_RETURN_IF_ERROR(CheckCollective(plan));
    if (plan.block_size > 0) {
      return absl::UnimplementedError(
          "attention_mask block_diffusion: the cached CUDA attention runs causal layouts only "
          "(the masked kernels run per step, CudaAttention)");
    }
    FLASHCP_ASSIGN_OR_RETURN(
        std::unique_ptr<worker::cuda::ShardBatches> b,
        worker::cuda::ShardBatches::Describe(
            SpecOf(plan, shape_.heads_q, shape_.heads_kv, shape_.head_dim, shape_.scale)));
    return std::unique_ptr<CudaShardBatch>(new Batch(std::move(b)));
  }
  absl::Status Forward(const CudaShardBatch& batch, const CudaShardBuffers& b, uintptr_t stream,
                       uint32_t groups, CudaWorkspaceFn workspace) override {
    return a_->Forward(static_cast<const Batch&>(batch).batches(), ForwardBuffers(b), P(stream),
                       groups, Workspace{workspace});
  }
  absl::Status Backward(const CudaShardBatch& batch, const CudaShardBuffers& b, uintptr_t stream,
                        uint32_t groups, CudaWorkspaceFn workspace) override {
    return a_->Backward(static_cast<const Batch&>(batch).batches(), BackwardBuffers(b),
                        P(stream), groups, Workspace{workspace});
  }
  std::string fallback_reason() const override { return a_->fallback_reason(); }
  worker::GraphCacheStats graph_stats() const override { return a_->graph_stats(); }

 private:
  // The caller's addresses as pointers (the lambda lives for the call).
  struct Workspace {
    CudaWorkspaceFn fn;
    absl::StatusOr<void*> operator()(size_t bytes) const {
      FLASHCP_ASSIGN_OR_RETURN(uintptr_t a, fn(bytes));
      return P(a);
    }
  };

  worker::cuda::ShardAttentionShape shape_;
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
  FLASHCP_RETURN_IF_ERROR(CheckCollective(plan));
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
  FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<worker::cuda::ShardBatches> batches,
                           worker::cuda::ShardBatches::Describe(
                               SpecOf(plan, heads_q, heads_kv, head_dim, scale)));
  FLASHCP_ASSIGN_OR_RETURN(
      std::unique_ptr<worker::cuda::ShardAttention> a,
      worker::cuda::ShardAttention::Create({heads_q, heads_kv, head_dim, scale}));
  FLASHCP_RETURN_IF_ERROR(batches->Upload(P(stream)));
  return std::unique_ptr<CudaShardAttention>(new Cudnn(std::move(a), std::move(batches)));
}

absl::StatusOr<std::unique_ptr<CudaAttentionCache>> MakeCudaAttentionCache(
    int32_t heads_q, int32_t heads_kv, int32_t head_dim, float scale, int64_t max_graphs) {
  if (max_graphs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_graphs: ", max_graphs, "; must be at least 1"));
  }
  const worker::cuda::ShardAttentionShape shape{heads_q, heads_kv, head_dim, scale};
  FLASHCP_ASSIGN_OR_RETURN(
      std::unique_ptr<worker::cuda::ShardAttention> a,
      worker::cuda::ShardAttention::Create(shape, static_cast<size_t>(max_graphs)));
  return std::unique_ptr<CudaAttentionCache>(new Cache(shape, std::move(a)));
}

}  // namespace flashcp::python
