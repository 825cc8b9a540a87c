// Kernels, then launchers (STYLE 13). No oracle of their own: the
// all-to-all step that uses them is checked against the CPU reference
// (gpu_cp_step_test.cc's all_to_all test, through cp_check.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/a2a_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/grid_stride.h"

namespace flashcp::worker::cuda {
namespace {

using grid_stride::Blocks;
using grid_stride::kThreads;

__global__ void GatherRowsKernel(const __nv_bfloat16* __restrict__ src,
                                 const int64_t* __restrict__ index, int64_t rows, int64_t width,
                                 __nv_bfloat16* __restrict__ dst) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    dst[i] = src[index[r] * width + c];
  }
}

__global__ void AccumulateStridedKernel(const __nv_bfloat16* __restrict__ x, int64_t x_pitch,
                                        int64_t rows, int64_t width, float* __restrict__ acc,
                                        int64_t acc_pitch) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    acc[r * acc_pitch + c] += __bfloat162float(x[r * x_pitch + c]);
  }
}

}  // namespace

absl::Status LaunchGatherRowsBf16(const __nv_bfloat16* src, const int64_t* index, int64_t rows,
                                  int64_t width, __nv_bfloat16* dst, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return absl::OkStatus();
  GatherRowsKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(src, index, rows, width, dst);
  return CudaLaunchStatus("GatherRowsKernel");
}

absl::Status LaunchAccumulateBf16Strided(const __nv_bfloat16* x, int64_t x_pitch, int64_t rows,
                                         int64_t width, float* acc, int64_t acc_pitch,
                                         cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return absl::OkStatus();
  AccumulateStridedKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(x, x_pitch, rows, width,
                                                                        acc, acc_pitch);
  return CudaLaunchStatus("AccumulateStridedKernel");
}

}  // namespace flashcp::worker::cuda
