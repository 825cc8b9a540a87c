// Kernels, then launchers (STYLE 13). Oracle: the obvious host loop; checked
// exactly (the sums are in a fixed order) by comm_kernels_test.cc.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/comm_kernels.h"
#include "worker/cuda/cuda_status.h"

namespace flashcp::worker::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t count) {
  // Grid-stride loops below, so a capped grid covers any count.
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 * 4 ? b : 65536 * 4);
}

__global__ void SumBlocksKernel(const float* __restrict__ blocks, int32_t n, int64_t count,
                                float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.f;
    for (int32_t r = 0; r < n; ++r) s += blocks[r * count + i];
    out[i] = s;
  }
}

__global__ void AccumulateBf16Kernel(const __nv_bfloat16* __restrict__ x, int64_t count,
                                     float* __restrict__ acc) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x)
    acc[i] += __bfloat162float(x[i]);
}

__global__ void FloatToBf16Kernel(const float* __restrict__ x, int64_t count,
                                  __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __float2bfloat16(x[i]);
}

__global__ void Bf16ToFloatKernel(const __nv_bfloat16* __restrict__ x, int64_t count,
                                  float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __bfloat162float(x[i]);
}

}  // namespace

absl::Status LaunchSumBlocks(const float* blocks, int32_t n, int64_t count, float* out,
                             cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  SumBlocksKernel<<<Blocks(count), kThreads, 0, stream>>>(blocks, n, count, out);
  return CudaLaunchStatus("SumBlocksKernel");
}

absl::Status LaunchAccumulateBf16(const __nv_bfloat16* x, int64_t count, float* acc,
                                  cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  AccumulateBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, acc);
  return CudaLaunchStatus("AccumulateBf16Kernel");
}

absl::Status LaunchFloatToBf16(const float* x, int64_t count, __nv_bfloat16* out,
                               cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  FloatToBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, out);
  return CudaLaunchStatus("FloatToBf16Kernel");
}

absl::Status LaunchBf16ToFloat(const __nv_bfloat16* x, int64_t count, float* out,
                               cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  Bf16ToFloatKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, out);
  return CudaLaunchStatus("Bf16ToFloatKernel");
}

}  // namespace flashcp::worker::cuda
