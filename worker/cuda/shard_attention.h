// One rank's CP shard attention on cuDNN, over caller-owned device buffers:
// the host API the flashcp Python binding calls (client/python/native): a
// long-lived ShardAttention (cuDNN handle, graphs cached by shape class) and
// per step a ShardBatches (the layout's shard groups). The
// header names no CUDA type (pointers and the stream cross as void*) so that
// a binding compiled without CUDA headers can hold the declarations; only
// builds with the CUDA backend (FLASHCP_HAVE_CUDA) compile and link it.
//
// The shards are a worker::CpRankLayout's two groups: whole shards (queries
// and keys at the same local rows of q / k, v) and prefixed shards (queries
// at local rows of q, keys staged contiguously per shard in k_stage, v_stage:
// [document prefix, own rows], in layout order), as attention.h's varlen
// batches with the bottom-right causal mask. Layouts (row-major, bf16 unless
// noted; heads_q a multiple of heads_kv, GQA native):
//   q, out, dout, dq        [q_rows, heads_q, head_dim]
//   k, v, dk, dv            [q_rows, heads_kv, head_dim]
//   k_stage, v_stage, dk_stage, dv_stage  [stage_rows, heads_kv, head_dim]
//   lse                     [q_rows, heads_q] fp32 (natural log, scaled scores)
// Rows no shard names (a padding row) are left as the caller gave them.
#ifndef FLASHCP_WORKER_CUDA_SHARD_ATTENTION_H_
#define FLASHCP_WORKER_CUDA_SHARD_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/graph_cache.h"

namespace flashcp::worker::cuda {

struct ShardAttentionSpec {
  int32_t heads_q = 0;
  int32_t heads_kv = 0;
  int32_t head_dim = 0;
  float scale = 0.0f;      // softmax scale, > 0
  int64_t q_rows = 0;      // local rows (C/N)
  int64_t stage_rows = 0;  // rows of the staged KV (sum of prefix_kv_len)
  std::vector<int64_t> whole_start;
  std::vector<int32_t> whole_len;
  std::vector<int64_t> prefix_q_start;
  std::vector<int32_t> prefix_q_len;
  std::vector<int32_t> prefix_kv_len;
};

struct ShardForwardBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* k_stage = nullptr;
  const void* v_stage = nullptr;
  void* out = nullptr;
  void* lse = nullptr;
};

struct ShardBackwardBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* k_stage = nullptr;
  const void* v_stage = nullptr;
  const void* out = nullptr;
  const void* dout = nullptr;
  const void* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;        // whole shards' key gradients
  void* dv = nullptr;
  void* dk_stage = nullptr;  // prefixed shards' staged-key gradients
  void* dv_stage = nullptr;
};

// The two shard groups, as bits: whole shards need no exchanged KV, so a
// caller can run them while the exchange is in flight, and the prefixed ones
// after it.
inline constexpr uint32_t kWholeShards = 1;
inline constexpr uint32_t kPrefixedShards = 2;
inline constexpr uint32_t kAllShards = kWholeShards | kPrefixedShards;

// Device memory for one cuDNN graph execution's workspace, as
// cudnn_attention.h's WorkspaceFn (the same type): `bytes` (> 0) bytes usable
// on the call's stream until the stream passes the call's work.
using ShardWorkspaceFn = absl::FunctionRef<absl::StatusOr<void*>(size_t bytes)>;

// One step's shard groups (a layout's), described on the host: built per
// step without any CUDA call; the int32 tables the kernels read go to device
// memory the caller provides (UseDeviceTables: the binding uploads them into
// a torch tensor) or that Upload allocates.
class ShardBatches {
 public:
  // InvalidArgument for a bad shape or shard list (a shard outside q_rows or
  // stage_rows, overlapping shards, lists of different lengths).
  static absl::StatusOr<std::unique_ptr<ShardBatches>> Describe(const ShardAttentionSpec& spec);
  ~ShardBatches();

  const ShardAttentionSpec& spec() const;
  // Both groups' tables (whole group's, then the prefixed group's), int32.
  const std::vector<int32_t>& tables() const;
  // `device` holds tables() (count int32) for as long as calls on this batch
  // run; InvalidArgument for null or a wrong count.
  absl::Status UseDeviceTables(const void* device, int64_t count);
  // Uploads tables() into device memory this object owns (cudaMalloc) on
  // `stream` (a cudaStream_t) and waits for the copy.
  absl::Status Upload(void* stream);
  // Whether the tables are on the device (UseDeviceTables or Upload ran).
  bool ready() const;

  class Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit ShardBatches(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ShardAttentionShape {
  int32_t heads_q = 0;
  int32_t heads_kv = 0;
  int32_t head_dim = 0;
  float scale = 0.0f;  // softmax scale, > 0
};

// cuDNN attention over ShardBatches, long-lived: one per device and shape
// keeps its cuDNN handle and graph cache (cudnn_attention.h: keyed by shape
// class, at most max_graphs) across steps and batches. Calls are serialized
// by the caller (not thread-safe).
class ShardAttention {
 public:
  // On the calling thread's current CUDA device. InvalidArgument for a bad
  // shape; FailedPrecondition where no device or cuDNN handle is usable.
  static absl::StatusOr<std::unique_ptr<ShardAttention>> Create(const ShardAttentionShape& shape,
                                                                size_t max_graphs = 64);
  ~ShardAttention();

  // Asynchronous on `stream` (a cudaStream_t); the buffers must stay alive
  // until the stream passes them. `groups` (bits above) says which shard
  // groups run; a group that does not run reads and writes none of its own
  // buffers (k, v, dk, dv: whole; k_stage, v_stage, dk_stage, dv_stage:
  // prefixed), which may then be null. Calls for different groups write
  // disjoint rows of out, lse and dq, so they may run on different streams
  // at once. InvalidArgument where the batch's shape is not this object's,
  // FailedPrecondition where its tables are not on the device. With
  // `workspace`, cuDNN's workspace comes from it; without, from this object
  // (grown by cudaMalloc and kept).
  absl::Status Forward(const ShardBatches& batches, const ShardForwardBuffers& b, void* stream,
                       uint32_t groups, ShardWorkspaceFn workspace);
  absl::Status Backward(const ShardBatches& batches, const ShardBackwardBuffers& b, void* stream,
                        uint32_t groups, ShardWorkspaceFn workspace);
  absl::Status Forward(const ShardBatches& batches, const ShardForwardBuffers& b, void* stream,
                       uint32_t groups = kAllShards);
  absl::Status Backward(const ShardBatches& batches, const ShardBackwardBuffers& b, void* stream,
                        uint32_t groups = kAllShards);

  // Empty while every call ran on cuDNN; else why cuDNN's graph was rejected
  // and the plain kernels ran instead (cudnn_attention.h).
  std::string fallback_reason() const;
  // The graph cache's counters (worker/graph_cache.h).
  GraphCacheStats graph_stats() const;

  class Impl;

 private:
  explicit ShardAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_SHARD_ATTENTION_H_
