// Kernels, then launchers (STYLE 13). Oracle: the obvious host loop; checked
// exactly (the sums are in a fixed order) through the communicators and the
// GPU step that use them (communicator_test.cc, gpu_cp_step_test.cc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/comm_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/grid_stride.h"

namespace flashcp::worker::cuda {
namespace {

using grid_stride::Blocks;
using grid_stride::kThreads;

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

__global__ void PackKvKernel(const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                             const int64_t* __restrict__ src, int64_t rows, int64_t width,
                             __nv_bfloat16* __restrict__ dst) {
  const int64_t total = rows * 2 * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / (2 * width), c = i % (2 * width);
    const int64_t s = src[r];
    __nv_bfloat16 x = __float2bfloat16(0.f);
    if (s != INT64_MIN) x = c < width ? k[s * width + c] : v[s * width + c - width];
    dst[i] = x;
  }
}

__global__ void StageKvKernel(const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                              const __nv_bfloat16* __restrict__ recv, const int64_t* __restrict__ src,
                              int64_t rows, int64_t width, __nv_bfloat16* __restrict__ out_k,
                              __nv_bfloat16* __restrict__ out_v) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    const int64_t s = src[r];
    if (s >= 0) {
      out_k[i] = k[s * width + c];
      out_v[i] = v[s * width + c];
    } else {
      const __nv_bfloat16* row = recv + (-1 - s) * 2 * width;
      out_k[i] = row[c];
      out_v[i] = row[width + c];
    }
  }
}

__global__ void ScatterAddKvKernel(const __nv_bfloat16* __restrict__ gk,
                                   const __nv_bfloat16* __restrict__ gv,
                                   const int64_t* __restrict__ rows, int64_t count,
                                   const int64_t* __restrict__ dst, int64_t width,
                                   float* __restrict__ acc_k, float* __restrict__ acc_v,
                                   float* __restrict__ ret) {
  const int64_t total = count * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i / width, c = i % width;
    const int64_t r = rows[j], d = dst[r];
    const float xk = __bfloat162float(gk[r * width + c]);
    const float xv = __bfloat162float(gv[r * width + c]);
    if (d >= 0) {
      acc_k[d * width + c] += xk;
      acc_v[d * width + c] += xv;
    } else {
      float* row = ret + (-1 - d) * 2 * width;
      row[c] += xk;
      row[width + c] += xv;
    }
  }
}

__global__ void AccumulateBackKvKernel(const __nv_bfloat16* __restrict__ back,
                                       const int64_t* __restrict__ dst, int64_t rows, int64_t width,
                                       float* __restrict__ acc_k, float* __restrict__ acc_v) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    const int64_t d = dst[r];
    if (d == INT64_MIN) continue;
    acc_k[d * width + c] += __bfloat162float(back[r * 2 * width + c]);
    acc_v[d * width + c] += __bfloat162float(back[r * 2 * width + width + c]);
  }
}

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  // splitmix64 finalizer, upper half.
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((x ^ (x >> 31)) >> 32);
}

__global__ void FillRandomBf16Kernel(__nv_bfloat16* __restrict__ x, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t base = seed * 0x100000001B3ull + static_cast<uint64_t>(i) * 4;
    float s = 0.f;
    for (int j = 0; j < 4; ++j) s += Hash(base + j) * (1.0f / 4294967296.0f);
    // Sum of 4 U(0,1): mean 2, variance 1/3; rescale to unit variance.
    x[i] = __float2bfloat16((s - 2.f) * 1.7320508f);
  }
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

absl::Status LaunchFillRandomBf16(__nv_bfloat16* x, int64_t count, uint64_t seed,
                                  cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  FillRandomBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, seed);
  return CudaLaunchStatus("FillRandomBf16Kernel");
}

absl::Status LaunchPackKv(const __nv_bfloat16* k, const __nv_bfloat16* v, const int64_t* src,
                          int64_t rows, int64_t width, __nv_bfloat16* dst, cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  PackKvKernel<<<Blocks(rows * 2 * width), kThreads, 0, stream>>>(k, v, src, rows, width, dst);
  return CudaLaunchStatus("PackKvKernel");
}

absl::Status LaunchStageKv(const __nv_bfloat16* k, const __nv_bfloat16* v,
                           const __nv_bfloat16* recv, const int64_t* src, int64_t rows,
                           int64_t width, __nv_bfloat16* out_k, __nv_bfloat16* out_v,
                           cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  StageKvKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(k, v, recv, src, rows, width, out_k,
                                                              out_v);
  return CudaLaunchStatus("StageKvKernel");
}

absl::Status LaunchScatterAddKv(const __nv_bfloat16* gk, const __nv_bfloat16* gv,
                                const int64_t* rows, int64_t count, const int64_t* dst,
                                int64_t width, float* acc_k, float* acc_v, float* ret,
                                cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  ScatterAddKvKernel<<<Blocks(count * width), kThreads, 0, stream>>>(gk, gv, rows, count, dst, width,
                                                                    acc_k, acc_v, ret);
  return CudaLaunchStatus("ScatterAddKvKernel");
}

absl::Status LaunchAccumulateBackKv(const __nv_bfloat16* back, const int64_t* dst, int64_t rows,
                                    int64_t width, float* acc_k, float* acc_v,
                                    cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  AccumulateBackKvKernel<<<Blocks(rows * width), kThreads, 0, stream>>>(back, dst, rows, width,
                                                                        acc_k, acc_v);
  return CudaLaunchStatus("AccumulateBackKvKernel");
}

}  // namespace flashcp::worker::cuda
