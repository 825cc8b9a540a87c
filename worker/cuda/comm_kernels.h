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

// x[i] = a pseudo-random value, roughly N(0, 1) (sum of four uniforms,
// rescaled), from a counter hash of (seed, i): fills benchmark inputs on the
// device without a host round trip. Never zeros (zeros hide bugs and run
// faster than real data).
absl::Status LaunchFillRandomBf16(__nv_bfloat16* x, int64_t count, uint64_t seed,
                                  cudaStream_t stream);

// Row kernels of the CP step (cp_layout.h encodes the row indices). Width W
// is heads_kv * head_dim elements; exchange rows are [K | V], 2W wide.

// dst[r] = [k[src[r]] | v[src[r]]], or zeros where src[r] == kNoRow.
absl::Status LaunchPackKv(const __nv_bfloat16* k, const __nv_bfloat16* v, const int64_t* src,
                          int64_t rows, int64_t width, __nv_bfloat16* dst, cudaStream_t stream);

// out_k[r], out_v[r] = the K and V halves of row src[r]: local row src[r] of
// k, v when src[r] >= 0, else row (-1 - src[r]) of recv ([*][2W]).
absl::Status LaunchStageKv(const __nv_bfloat16* k, const __nv_bfloat16* v,
                           const __nv_bfloat16* recv, const int64_t* src, int64_t rows,
                           int64_t width, __nv_bfloat16* out_k, __nv_bfloat16* out_v,
                           cudaStream_t stream);

// For j < count, with r = rows[j] and d = dst[r]: adds staged gradients
// gk[r], gv[r] to acc_k[d], acc_v[d] (d >= 0) or to ret[-1 - d] ([*][2W]).
// Destinations must be distinct within one launch (one round).
absl::Status LaunchScatterAddKv(const __nv_bfloat16* gk, const __nv_bfloat16* gv,
                                const int64_t* rows, int64_t count, const int64_t* dst,
                                int64_t width, float* acc_k, float* acc_v, float* ret,
                                cudaStream_t stream);

// acc_k[dst[r]] += back[r][0:W], acc_v[dst[r]] += back[r][W:2W], skipping
// dst[r] == kNoRow. Destinations distinct within one launch.
absl::Status LaunchAccumulateBackKv(const __nv_bfloat16* back, const int64_t* dst, int64_t rows,
                                    int64_t width, float* acc_k, float* acc_v,
                                    cudaStream_t stream);

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_COMM_KERNELS_H_
