// Varlen (packed THD) causal attention on the GPU, forward and backward, and
// the one interface both implementations sit behind: cuDNN's fused SDPA (the
// fast path, cudnn_attention.h) and our plain CUDA kernels (the fallback and
// the on-GPU oracle, attention_kernels.h).
//
// The problem. A batch holds `n` sequences. Sequence i has q_len[i] queries
// and kv_len[i] >= q_len[i] keys; its queries are the LAST q_len[i] positions
// of its keys (a CP shard: its KV is [document prefix, the shard itself]), so
// query t (0-based) attends to keys 0 .. kv_len - q_len + t: the bottom-right
// causal mask. Whole documents have q_len == kv_len.
//
// Layouts (row-major; sequence i occupies rows [start, start + len) of its
// tensors; sequences need not be adjacent, gaps are left untouched):
//   Q, O, dO, dQ : [total_q,  heads_q,  head_dim] bf16
//   K, V, dK, dV : [total_kv, heads_kv, head_dim] bf16
//   LSE          : [total_q,  heads_q] fp32, natural-log log-sum-exp of the
//                  scaled scores (scale * q.k), what backward needs.
// Grouped-query attention: heads_q is a multiple of heads_kv; query head h
// reads KV head h / (heads_q / heads_kv).
// Accumulation is fp32 throughout; storage bf16.
#ifndef FLASHCP_WORKER_CUDA_ATTENTION_H_
#define FLASHCP_WORKER_CUDA_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/cuda/device_memory.h"

namespace flashcp::worker::cuda {

using bf16 = __nv_bfloat16;

struct AttentionShape {
  int32_t heads_q = 32;   // query heads
  int32_t heads_kv = 32;  // KV heads; divides heads_q
  int32_t head_dim = 128; // D
  float scale = 0.0f;     // softmax scale; 0 means 1/sqrt(head_dim)

  float EffectiveScale() const;
};

// InvalidArgument naming the field unless 1 <= heads_kv <= heads_q <= 256,
// heads_kv divides heads_q, head_dim is a multiple of 8 in [8, 256] and
// scale >= 0.
absl::Status ValidateAttentionShape(const AttentionShape& shape);

// Where the sequences of one batch lie and how long they are, on the host and
// mirrored on the device (uploaded once by Create). The device arrays are what
// kernels and cuDNN read.
class VarlenBatch {
 public:
  // Packed: sequence i starts where sequence i-1 ends (both Q and KV side).
  static absl::StatusOr<VarlenBatch> Create(std::vector<int32_t> q_len,
                                            std::vector<int32_t> kv_len,
                                            const AttentionShape& shape, cudaStream_t stream);
  // Explicit first rows: q_start[i] is sequence i's first row in Q, O, dO, dQ
  // and LSE; kv_start[i] its first row in K, V, dK, dV. Starts must ascend and
  // sequences must not overlap (backward writes each row once).
  // InvalidArgument for mismatched sizes, a negative length, q_len > kv_len,
  // overlapping or descending sequences, or element offsets that overflow
  // int32 (cuDNN's ragged offsets are int32 elements). Copies on `stream` and
  // waits for the copy.
  static absl::StatusOr<VarlenBatch> Create(std::vector<int64_t> q_start, std::vector<int32_t> q_len,
                                            std::vector<int64_t> kv_start,
                                            std::vector<int32_t> kv_len,
                                            const AttentionShape& shape, cudaStream_t stream);

  // Create's checks and host tables without device memory (no CUDA call):
  // the device arrays are unset until UseDeviceTables points them at memory
  // the caller filled with host_tables() (the flashcp binding: a torch
  // tensor, so a training step's tables come from torch's allocator).
  static absl::StatusOr<VarlenBatch> Describe(std::vector<int64_t> q_start,
                                              std::vector<int32_t> q_len,
                                              std::vector<int64_t> kv_start,
                                              std::vector<int32_t> kv_len,
                                              const AttentionShape& shape);
  // The int32 arrays below, back to back (7 * (num_seqs + 1) entries).
  const std::vector<int32_t>& host_tables() const { return host_; }
  // `device` must hold host_tables() (count entries) while calls read this
  // batch; InvalidArgument where it is null or count differs.
  absl::Status UseDeviceTables(const int32_t* device, size_t count);

  int32_t num_seqs() const { return static_cast<int32_t>(q_len_.size()); }
  const std::vector<int32_t>& q_len() const { return q_len_; }
  const std::vector<int32_t>& kv_len() const { return kv_len_; }
  int64_t total_q() const { return total_q_; }    // sum of q_len
  int64_t total_kv() const { return total_kv_; }  // sum of kv_len
  int64_t q_rows() const { return q_rows_; }      // rows a Q-side tensor must hold
  int64_t kv_rows() const { return kv_rows_; }    // rows a KV-side tensor must hold
  int32_t max_q() const { return max_q_; }
  int32_t max_kv() const { return max_kv_; }
  // Attention workload, (query, key) pairs under the mask: SPEC Eq. 3 summed.
  double Pairs() const;

  // Device arrays (int32). *_start and the *_elems ragged offsets have
  // num_seqs + 1 entries (the last is the end of the last sequence); seq_*
  // have num_seqs. *_elems are starts times the row width in elements, which
  // is what cuDNN's ragged offsets are.
  const int32_t* d_q_start() const { return tables() + 0 * stride_; }
  const int32_t* d_kv_start() const { return tables() + 1 * stride_; }
  const int32_t* d_seq_q() const { return tables() + 2 * stride_; }
  const int32_t* d_seq_kv() const { return tables() + 3 * stride_; }
  const int32_t* d_q_elems() const { return tables() + 4 * stride_; }   // q_start * heads_q * D
  const int32_t* d_kv_elems() const { return tables() + 5 * stride_; }  // kv_start * heads_kv * D
  const int32_t* d_lse_elems() const { return tables() + 6 * stride_; } // q_start * heads_q

 private:
  std::vector<int32_t> q_len_, kv_len_;
  int64_t total_q_ = 0, total_kv_ = 0, q_rows_ = 0, kv_rows_ = 0;
  int32_t max_q_ = 0, max_kv_ = 0;
  const int32_t* tables() const { return external_ != nullptr ? external_ : dev_.data(); }
  size_t stride_ = 0;  // num_seqs + 1, each array's slot in the tables
  std::vector<int32_t> host_;
  DeviceBuffer<int32_t> dev_;             // Create's upload
  const int32_t* external_ = nullptr;     // UseDeviceTables' (caller-owned)
};

struct AttentionForwardArgs {
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  bf16* out = nullptr;  // every element written
  float* lse = nullptr; // every element written
};

struct AttentionBackwardArgs {
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  const bf16* out = nullptr;
  const bf16* dout = nullptr;
  const float* lse = nullptr;
  bf16* dq = nullptr;  // every element written
  bf16* dk = nullptr;  // every element written
  bf16* dv = nullptr;  // every element written
};

// One implementation of the attention above. Calls are asynchronous on
// `stream`; buffers must stay alive until the stream passes them. Not
// thread-safe (implementations cache plans and workspace).
class Attention {
 public:
  virtual ~Attention() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::Status Forward(const VarlenBatch& batch, const AttentionForwardArgs& args,
                               cudaStream_t stream) = 0;
  virtual absl::Status Backward(const VarlenBatch& batch, const AttentionBackwardArgs& args,
                                cudaStream_t stream) = 0;
};

// FLOPs of one call, SPEC: 4 * H * D * pairs forward; backward 2.5x that.
inline double AttentionForwardFlops(const VarlenBatch& b, const AttentionShape& s) {
  return 4.0 * s.heads_q * s.head_dim * b.Pairs();
}
inline double AttentionBackwardFlops(const VarlenBatch& b, const AttentionShape& s) {
  return 2.5 * AttentionForwardFlops(b, s);
}

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_ATTENTION_H_
