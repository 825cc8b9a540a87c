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

class ShardBatches::Impl {
 public:
  ShardAttentionSpec spec;
  std::optional<VarlenBatch> whole;   // keys at the queries' own rows of k, v
  std::optional<VarlenBatch> prefix;  // keys staged in k_stage, v_stage
  std::vector<int32_t> tables;        // whole's host tables, then prefix's
  DeviceBuffer<int32_t> uploaded;     // Upload's copy of `tables`
  bool ready = false;
};

class ShardAttention::Impl {
 public:
  ShardAttentionShape shape;
  std::unique_ptr<CudnnAttention> attention;
  DeviceBuffer<uint8_t> workspace;  // for the calls given no WorkspaceFn

  absl::StatusOr<void*> OwnWorkspace(size_t bytes) {
    FLASHCP_RETURN_IF_ERROR(workspace.Reserve(bytes));
    return static_cast<void*>(workspace.data());
  }
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

ShardBatches::ShardBatches(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardBatches::~ShardBatches() = default;

absl::StatusOr<std::unique_ptr<ShardBatches>> ShardBatches::Describe(
    const ShardAttentionSpec& spec) {
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
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  if (!spec.whole_len.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(VarlenBatch b,
                             VarlenBatch::Describe(spec.whole_start, spec.whole_len,
                                                   spec.whole_start, spec.whole_len, shape));
    impl->tables = b.host_tables();
    impl->whole.emplace(std::move(b));
  }
  if (!spec.prefix_q_len.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(VarlenBatch b,
                             VarlenBatch::Describe(spec.prefix_q_start, spec.prefix_q_len,
                                                   kv_start, spec.prefix_kv_len, shape));
    impl->tables.insert(impl->tables.end(), b.host_tables().begin(), b.host_tables().end());
    impl->prefix.emplace(std::move(b));
  }
  return std::unique_ptr<ShardBatches>(new ShardBatches(std::move(impl)));
}

const ShardAttentionSpec& ShardBatches::spec() const { return impl_->spec; }
const std::vector<int32_t>& ShardBatches::tables() const { return impl_->tables; }
bool ShardBatches::ready() const { return impl_->ready || impl_->tables.empty(); }

absl::Status ShardBatches::UseDeviceTables(const void* device, int64_t count) {
  if (count != static_cast<int64_t>(impl_->tables.size()) ||
      (device == nullptr && count > 0))
    return absl::InvalidArgumentError(absl::StrCat(
        "shard tables: ", count, " int32 at ", device == nullptr ? "null" : "an address",
        "; expected ", impl_->tables.size(), " at a device address"));
  const int32_t* at = static_cast<const int32_t*>(device);
  if (impl_->whole) {
    const size_t n = impl_->whole->host_tables().size();
    FLASHCP_RETURN_IF_ERROR(impl_->whole->UseDeviceTables(at, n));
    at += n;
  }
  if (impl_->prefix)
    FLASHCP_RETURN_IF_ERROR(
        impl_->prefix->UseDeviceTables(at, impl_->prefix->host_tables().size()));
  impl_->ready = true;
  return absl::OkStatus();
}

absl::Status ShardBatches::Upload(void* stream) {
  const std::vector<int32_t>& t = impl_->tables;
  if (t.empty()) return absl::OkStatus();
  FLASHCP_ASSIGN_OR_RETURN(impl_->uploaded, DeviceBuffer<int32_t>::Allocate(t.size()));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(impl_->uploaded.data(), t.data(),
                                               t.size() * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, S(stream)),
                               "upload shard tables (", t.size() * 4, " bytes)");
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(S(stream)), "upload shard tables: sync");
  return UseDeviceTables(impl_->uploaded.data(), static_cast<int64_t>(t.size()));
}

ShardAttention::ShardAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardAttention::~ShardAttention() = default;

absl::StatusOr<std::unique_ptr<ShardAttention>> ShardAttention::Create(
    const ShardAttentionShape& s, size_t max_graphs) {
  if (!(s.scale > 0.0f))
    return absl::InvalidArgumentError(absl::StrCat("scale: ", s.scale, "; must be positive"));
  const AttentionShape shape{s.heads_q, s.heads_kv, s.head_dim, s.scale};
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  // FailedPrecondition without a usable device.
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaFree(nullptr), "CUDA context");
  auto impl = std::make_unique<Impl>();
  impl->shape = s;
  CudnnOptions options;
  options.max_graphs = max_graphs;
  FLASHCP_ASSIGN_OR_RETURN(impl->attention, CudnnAttention::Create(shape, options));
  return std::unique_ptr<ShardAttention>(new ShardAttention(std::move(impl)));
}

namespace {

// The batch was described for this attention's shape, and its tables are on
// the device.
absl::Status CheckBatches(const ShardAttentionShape& s, const ShardBatches& batches) {
  const ShardAttentionSpec& b = batches.spec();
  if (b.heads_q != s.heads_q || b.heads_kv != s.heads_kv || b.head_dim != s.head_dim ||
      b.scale != s.scale)
    return absl::InvalidArgumentError(absl::StrCat(
        "shard batches of heads_q ", b.heads_q, ", heads_kv ", b.heads_kv, ", head_dim ",
        b.head_dim, ", scale ", b.scale, " on an attention of heads_q ", s.heads_q, ", heads_kv ",
        s.heads_kv, ", head_dim ", s.head_dim, ", scale ", s.scale));
  if (!batches.ready())
    return absl::FailedPreconditionError(
        "shard batches: tables not on the device (UseDeviceTables or Upload first)");
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardAttention::Forward(const ShardBatches& batches, const ShardForwardBuffers& b,
                                     void* stream, uint32_t groups, ShardWorkspaceFn workspace) {
  FLASHCP_RETURN_IF_ERROR(CheckBatches(impl_->shape, batches));
  const ShardBatches::Impl& g = batches.impl();
  float* lse = static_cast<float*>(b.lse);
  if (g.whole && (groups & kWholeShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Forward(
        *g.whole, {B(b.q), B(b.k), B(b.v), B(b.out), lse}, S(stream), workspace));
  if (g.prefix && (groups & kPrefixedShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Forward(
        *g.prefix, {B(b.q), B(b.k_stage), B(b.v_stage), B(b.out), lse}, S(stream), workspace));
  return CudaLaunchStatus("ShardAttention::Forward");
}

absl::Status ShardAttention::Backward(const ShardBatches& batches, const ShardBackwardBuffers& b,
                                      void* stream, uint32_t groups, ShardWorkspaceFn workspace) {
  FLASHCP_RETURN_IF_ERROR(CheckBatches(impl_->shape, batches));
  const ShardBatches::Impl& g = batches.impl();
  const float* lse = static_cast<const float*>(b.lse);
  if (g.whole && (groups & kWholeShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Backward(
        *g.whole,
        {B(b.q), B(b.k), B(b.v), B(b.out), B(b.dout), lse, B(b.dq), B(b.dk), B(b.dv)}, S(stream),
        workspace));
  if (g.prefix && (groups & kPrefixedShards))
    FLASHCP_RETURN_IF_ERROR(impl_->attention->Backward(
        *g.prefix,
        {B(b.q), B(b.k_stage), B(b.v_stage), B(b.out), B(b.dout), lse, B(b.dq), B(b.dk_stage),
         B(b.dv_stage)},
        S(stream), workspace));
  return CudaLaunchStatus("ShardAttention::Backward");
}

absl::Status ShardAttention::Forward(const ShardBatches& batches, const ShardForwardBuffers& b,
                                     void* stream, uint32_t groups) {
  Impl* impl = impl_.get();
  return Forward(batches, b, stream, groups,
                 [impl](size_t bytes) { return impl->OwnWorkspace(bytes); });
}

absl::Status ShardAttention::Backward(const ShardBatches& batches, const ShardBackwardBuffers& b,
                                      void* stream, uint32_t groups) {
  Impl* impl = impl_.get();
  return Backward(batches, b, stream, groups,
                  [impl](size_t bytes) { return impl->OwnWorkspace(bytes); });
}

std::string ShardAttention::fallback_reason() const {
  return impl_->attention->fallback_reason();
}

GraphCacheStats ShardAttention::graph_stats() const { return impl_->attention->graph_stats(); }

}  // namespace flashcp::worker::cuda
