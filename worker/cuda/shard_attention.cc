#include "worker/cuda/shard_attention.h"

#include <cuda_runtime_api.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "worker/cuda/attention.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/cudnn_attention.h"

namespace flashcp::worker::cuda {

class ShardAttention::Impl {
 public:
  std::unique_ptr<CudnnAttention> attention;
  std::optional<VarlenBatch> whole;   // keys at the queries' own rows of k, v
  std::optional<VarlenBatch> prefix;  // keys staged in k_stage, v_stage
};

namespace {

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }
const bf16* B(const void* p) { return static_cast<const bf16*>(p); }
bf16* B(void* p) { return static_cast<bf16*>(p); }

// Each shard of a group inside [0, rows) (VarlenBatch checks order and overlap).
absl::Status CheckInside(const char* group, const std::vector<int64_t>& start,
                         const std::vector<int32_t>& len, int64_t rows, const char* buffer) {
  for (size_t i = 0; i < start.size(); ++i) {
    if (start[i] < 0 || len[i] < 0 || start[i] + len[i] > rows)
      return absl::InvalidArgumentError(absl::StrCat(group, " shard ", i, ": rows [", start[i], ", ",
                                                     start[i] + len[i], ") outside ", buffer, "'s ",
                                                     rows, " rows"));
  }
  return absl::OkStatus();
}

}  // namespace

ShardAttention::ShardAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardAttention::~ShardAttention() = default;

absl::StatusOr<std::unique_ptr<ShardAttention>> ShardAttention::Create(
    const ShardAttentionSpec& spec, void* stream) {
  if (!(spec.scale > 0.0f))
    return absl::InvalidArgumentError(absl::StrCat("scale: ", spec.scale, "; must be positive"));
  if (spec.whole_start.size() != spec.whole_len.size() ||
      spec.prefix_q_start.size() != spec.prefix_q_len.size() ||
      spec.prefix_q_len.size() != spec.prefix_kv_len.size())
    return absl::InvalidArgumentError("shard lists of different lengths");
  const AttentionShape shape{spec.heads_q, spec.heads_kv, spec.head_dim, spec.scale};
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  FLASHCP_RETURN_IF_ERROR(CheckInside("whole", spec.whole_start, spec.whole_len, spec.q_rows, "q"));
  FLASHCP_RETURN_IF_ERROR(
      CheckInside("prefixed", spec.prefix_q_start, spec.prefix_q_len, spec.q_rows, "q"));
  std::vector<int64_t> kv_start;  // staged KV: consecutive per shard, in layout order
  int64_t at = 0;
  for (int32_t len : spec.prefix_kv_len) {
    kv_start.push_back(at);
    at += len;
  }
  if (at != spec.stage_rows)
    return absl::InvalidArgumentError(absl::StrCat("stage_rows ", spec.stage_rows,
                                                   "; the prefixed shards' keys take ", at));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaFree(nullptr), "CUDA context");  // FailedPrecondition without a device
  auto impl = std::make_unique<Impl>();
  FLASHCP_ASSIGN_OR_RETURN(impl->attention, CudnnAttention::Create(shape));
  if (!spec.whole_len.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(VarlenBatch b,
                             VarlenBatch::Create(spec.whole_start, spec.whole_len, spec.whole_start,
                                                 spec.whole_len, shape, S(stream)));
    impl->whole.emplace(std::move(b));
  }
  if (!spec.prefix_q_len.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(VarlenBatch b,
                             VarlenBatch::Create(spec.prefix_q_start, spec.prefix_q_len, kv_start,
                                                 spec.prefix_kv_len, shape, S(stream)));
    impl->prefix.emplace(std::move(b));
  }
  return std::unique_ptr<ShardAttention>(new ShardAttention(std::move(impl)));
}

absl::Status ShardAttention::Forward(const ShardForwardBuffers& b, void* stream,
                                     uint32_t groups) {
  float* lse = static_cast<float*>(b.lse);
  if (impl_->whole && (groups & kWholeShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Forward(
        *impl_->whole, {B(b.q), B(b.k), B(b.v), B(b.out), lse}, S(stream)));
  if (impl_->prefix && (groups & kPrefixedShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Forward(
        *impl_->prefix, {B(b.q), B(b.k_stage), B(b.v_stage), B(b.out), lse}, S(stream)));
  return CudaLaunchStatus("ShardAttention::Forward");
}

absl::Status ShardAttention::Backward(const ShardBackwardBuffers& b, void* stream,
                                      uint32_t groups) {
  const float* lse = static_cast<const float*>(b.lse);
  if (impl_->whole && (groups & kWholeShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Backward(
        *impl_->whole,
        {B(b.q), B(b.k), B(b.v), B(b.out), B(b.dout), lse, B(b.dq), B(b.dk), B(b.dv)}, S(stream)));
  if (impl_->prefix && (groups & kPrefixedShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Backward(
        *impl_->prefix,
        {B(b.q), B(b.k_stage), B(b.v_stage), B(b.out), B(b.dout), lse, B(b.dq), B(b.dk_stage),
         B(b.dv_stage)},
        S(stream)));
  return CudaLaunchStatus("ShardAttention::Backward");
}

std::string ShardAttention::fallback_reason() const {
  return impl_->attention->fallback_reason();
}

}  // namespace flashcp::worker::cuda
