// Small device kernels the communicators and the CP step share: sums in fp32
// and bf16 <-> fp32 conversion. Each launcher is asynchronous on `stream`.
#ifndef FLASHCP_WORKER_CUDA_COMM_KERNELS_H_
#define FLASHCP_WORKER_CUDA_COMM_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace flashcp::worker::cuda {

// out[i] = blocks[0][i] + blocks[1][i] + ... + blocks[n-1][i], added in that
// order (bitwise deterministic); blocks is [n][count] contiguous fp32.
absl::Status LaunchSumBlocks(const float* blocks, int32_t n, int64_t count, float* out,
                             cudaStream_t stream);

// acc[i] += float(x[i]) for i < count.
absl::Status LaunchAccumulateBf16(const __nv_bfloat16* x, int64_t count, float* acc,
                                  cudaStream_t stream);

// out[i] = bf16(x[i]) (round to nearest even).
absl::Status LaunchFloatToBf16(const float* x, int64_t count, __nv_bfloat16* out,
                               cudaStream_t stream);

// out[i] = float(x[i]).
absl::Status LaunchBf16ToFloat(const __nv_bfloat16* x, int64_t count, float* out,
                               cudaStream_t stream);

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_COMM_KERNELS_H_
