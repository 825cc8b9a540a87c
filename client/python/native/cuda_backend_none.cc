// The CUDA hook of a build without the CUDA backend (no nvcc, FLASHCP_CUDA=OFF
// or no cuDNN frontend): every call says so.
#include "client/python/native/cuda_backend.h"

namespace flashcp::python {

bool CudaBackendBuilt() { return false; }

namespace {

absl::Status NoCuda() {
  return absl::UnimplementedError(
      "this flashcp build has no CUDA backend (CMake found no nvcc or cuDNN frontend, or "
      "FLASHCP_CUDA=OFF): rebuild with CUDA, or pass CPU tensors");
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaShardAttention>> MakeCudaShardAttention(
    const worker::CpRankLayout&, int32_t, int32_t, int32_t, float, uintptr_t) {
  return NoCuda();
}

absl::StatusOr<std::unique_ptr<CudaAttentionCache>> MakeCudaAttentionCache(int32_t, int32_t,
                                                                           int32_t, float,
                                                                           int64_t) {
  return NoCuda();
}

}  // namespace flashcp::python
