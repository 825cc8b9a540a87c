// The binding's CUDA hook: one rank's shard attention on the project's cuDNN
// path (worker/cuda/shard_attention.h), over device buffers the Python side
// takes from CUDA torch tensors (data_ptr()) and the caller's stream
// (torch.cuda.current_stream().cuda_stream). CMake compiles
// cuda_backend_cuda.cc where the CUDA backend is built and
// cuda_backend_none.cc (Unimplemented) elsewhere: no CUDA header or #ifdef
// here. Counts are checked by the caller (flashcp_native.cc).
#ifndef FLASHCP_CLIENT_PYTHON_NATIVE_CUDA_BACKEND_H_
#define FLASHCP_CLIENT_PYTHON_NATIVE_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/cp_layout.h"

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

// Whether this build has the CUDA path.
bool CudaBackendBuilt();

// On the current CUDA device; Unimplemented in a build without the CUDA
// backend, else ShardAttention::Create's errors.
absl::StatusOr<std::unique_ptr<CudaShardAttention>> MakeCudaShardAttention(
    const worker::CpRankLayout& plan, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
    float scale, uintptr_t stream);

}  // namespace flashcp::python

#endif  // FLASHCP_CLIENT_PYTHON_NATIVE_CUDA_BACKEND_H_
