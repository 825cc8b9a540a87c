// The binding's CUDA hook: one rank's shard attention on the project's cuDNN
// path (worker/cuda/shard_attention.h), over device buffers the Python side
// takes from CUDA torch tensors (data_ptr()) and the caller's stream
// (torch.cuda.current_stream().cuda_stream). CMake compiles
// cuda_backend_cuda.cc where the CUDA backend is built and
// cuda_backend_none.cc (Unimplemented) elsewhere: no CUDA header or #ifdef
// here. Counts are checked by the caller (native_cuda.cc).
#ifndef FLASHCP_CLIENT_PYTHON_NATIVE_CUDA_BACKEND_H_
#define FLASHCP_CLIENT_PYTHON_NATIVE_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/cp_layout.h"
#include "worker/graph_cache.h"

namespace flashcp::python {

// Device addresses (0 where a call does not use the buffer); layouts as in
// worker/cuda/shard_attention.h.
struct CudaShardBuffers {
  uintptr_t q = 0, k = 0, v = 0, k_stage = 0, v_stage = 0, out = 0, lse = 0;
  uintptr_t dout = 0, dq = 0, dk = 0, dv = 0, dk_stage = 0, dv_stage = 0;
};

// Shard groups, as bits (worker/cuda/shard_attention.h's kWholeShards,
// kPrefixedShards): which of the layout's two groups a call runs.
inline constexpr uint32_t kCudaWholeShards = 1;
inline constexpr uint32_t kCudaPrefixedShards = 2;

class CudaShardAttention {
 public:
  virtual ~CudaShardAttention() = default;
  // Asynchronous on `stream` (a cudaStream_t as an integer); `groups` as
  // ShardAttention::Forward's (a group that does not run touches none of its
  // buffers).
  virtual absl::Status Forward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) = 0;
  virtual absl::Status Backward(const CudaShardBuffers& b, uintptr_t stream, uint32_t groups) = 0;
  virtual std::string fallback_reason() const = 0;
};

// One step's shard groups for a CudaAttentionCache (a layout's, described on
// the host with no CUDA call): the caller uploads tables() into device memory
// it owns (the flashcp binding: a torch tensor) and hands it over with
// UseDeviceTables, before any call on the batch.
class CudaShardBatch {
 public:
  virtual ~CudaShardBatch() = default;
  virtual const std::vector<int32_t>& tables() const = 0;
  // InvalidArgument for a null address or a count other than tables()'s.
  virtual absl::Status UseDeviceTables(uintptr_t device, int64_t count) = 0;
};

// Device memory for one cuDNN graph execution's workspace: at least `bytes`
// (> 0) bytes at the returned address, usable on the call's stream until the
// stream passes the call's work (torch's caching allocator's memory, freed
// after the call, qualifies). Called at most once per graph execution.
using CudaWorkspaceFn = absl::FunctionRef<absl::StatusOr<uintptr_t>(size_t bytes)>;

// The long-lived CUDA attention of one device and attention shape: its cuDNN
// handle and graph cache (keyed by shape class, at most max_graphs, LRU;
// worker/graph_cache.h) serve every step's batches. Not thread-safe (the
// binding serializes calls).
class CudaAttentionCache {
 public:
  virtual ~CudaAttentionCache() = default;
  // This rank's shard groups under `plan` (all_to_all: the head-parallel
  // rows'); Unimplemented for block-diffusion layouts (MakeCudaShardAttention
  // runs those).
  virtual absl::StatusOr<std::unique_ptr<CudaShardBatch>> Describe(
      const worker::CpRankLayout& plan) = 0;
  // As CudaShardAttention's, on `batch` (whose tables are on the device).
  virtual absl::Status Forward(const CudaShardBatch& batch, const CudaShardBuffers& b,
                               uintptr_t stream, uint32_t groups, CudaWorkspaceFn workspace) = 0;
  virtual absl::Status Backward(const CudaShardBatch& batch, const CudaShardBuffers& b,
                                uintptr_t stream, uint32_t groups, CudaWorkspaceFn workspace) = 0;
  virtual std::string fallback_reason() const = 0;
  virtual worker::GraphCacheStats graph_stats() const = 0;
};

// Whether this build has the CUDA path.
bool CudaBackendBuilt();

// On the current CUDA device; Unimplemented in a build without the CUDA
// backend, else ShardAttention::Create's errors.
absl::StatusOr<std::unique_ptr<CudaShardAttention>> MakeCudaShardAttention(
    const worker::CpRankLayout& plan, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
    float scale, uintptr_t stream);

// On the current CUDA device; Unimplemented in a build without the CUDA
// backend, else InvalidArgument for a bad shape, FailedPrecondition without
// a device or cuDNN handle.
absl::StatusOr<std::unique_ptr<CudaAttentionCache>> MakeCudaAttentionCache(
    int32_t heads_q, int32_t heads_kv, int32_t head_dim, float scale, int64_t max_graphs);

}  // namespace flashcp::python

#endif  // FLASHCP_CLIENT_PYTHON_NATIVE_CUDA_BACKEND_H_
