// Row and head copies of the all-to-all (Ulysses) GPU step (gpu_a2a_step.h).
// Each launcher is asynchronous on `stream`; bf16 storage, fp32 sums.
#ifndef FLASHCP_WORKER_CUDA_A2A_KERNELS_H_
#define FLASHCP_WORKER_CUDA_A2A_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace flashcp::worker::cuda {

// dst[r] = src[index[r]] for r < rows, rows of `width` elements (a row
// permutation: the gathered <-> head-parallel order of a2a_layout.h).
absl::Status LaunchGatherRowsBf16(const __nv_bfloat16* src, const int64_t* index, int64_t rows,
                                  int64_t width, __nv_bfloat16* dst, cudaStream_t stream);

// acc[r * acc_pitch + c] += float(x[r * x_pitch + c]) for r < rows, c < width
// (a block of heads of one row-major tensor onto a block of another).
absl::Status LaunchAccumulateBf16Strided(const __nv_bfloat16* x, int64_t x_pitch, int64_t rows,
                                         int64_t width, float* acc, int64_t acc_pitch,
                                         cudaStream_t stream);

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_A2A_KERNELS_H_
