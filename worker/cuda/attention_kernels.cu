// Plain CUDA attention, forward and backward (see attention_kernels.h).
// Shape of the file (STYLE 13): kernels, then launchers that take a stream and
// return absl::Status. The CPU oracle is worker/attention_reference.h; the
// tolerance is stated in attention_kernels.h and checked by attention_test.cc.
//
// Scores are kept in the log2 domain: q is pre-multiplied by scale * log2(e),
// so exp(scale * q.k - m) becomes exp2(s2 - m2) (one FMUL fewer per score)
// and the natural-log LSE is (m2 + log2(l)) * ln(2).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "worker/cuda/attention_kernels.h"
#include "worker/cuda/cuda_status.h"

namespace flashcp::worker::cuda {
namespace {

constexpr int kWarps = 8;      // rows (queries or keys) per block, one warp each
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 32;      // rows per shared-memory tile: one per lane
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Rows of a tile are padded by one bf16 pair so that lane j reading word w of
// row j hits bank (j * (D/2 + 1) + w) % 32: conflict-free.
template <int D>
struct Padded {
  static constexpr int kRow = D + 2;  // bf16 elements per padded row
};

// Dot of an fp32 row (shared, broadcast to the warp) with a padded bf16 row.
template <int D>
__device__ __forceinline__ float DotRow(const float* a, const bf16* row) {
  const __nv_bfloat162* r2 = reinterpret_cast<const __nv_bfloat162*>(row);
  float acc = 0.f;
#pragma unroll 8
  for (int w = 0; w < D / 2; ++w) {
    const float2 f = __bfloat1622float2(r2[w]);
    acc = fmaf(a[2 * w], f.x, acc);
    acc = fmaf(a[2 * w + 1], f.y, acc);
  }
  return acc;
}

// Copies rows [first, first + kTile) of a [*, heads, D] bf16 tensor at head
// `head` into a padded tile; rows at or past `end` are zero (never garbage:
// 0 * NaN would poison the P.V sums).
template <int D>
__device__ __forceinline__ void LoadTile(bf16* tile, const bf16* base, int64_t row_stride,
                                         int first, int end) {
  constexpr int kPairs = D / 2;
  for (int idx = threadIdx.x; idx < kTile * kPairs; idx += kThreads) {
    const int r = idx / kPairs, w = idx % kPairs;
    __nv_bfloat162 val = __floats2bfloat162_rn(0.f, 0.f);
    if (first + r < end)
      val = reinterpret_cast<const __nv_bfloat162*>(base + (first + r) * row_stride)[w];
    reinterpret_cast<__nv_bfloat162*>(tile + r * Padded<D>::kRow)[w] = val;
  }
}

// ---- Forward ---------------------------------------------------------------
// Grid (ceil(max_q / kWarps), heads_q, num_seqs); warp w of block x owns query
// row x * kWarps + w of head blockIdx.y of sequence blockIdx.z.
template <int D>
__global__ void __launch_bounds__(kThreads)
    AttentionForwardKernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                           const bf16* __restrict__ v, bf16* __restrict__ out,
                           float* __restrict__ lse, const int32_t* __restrict__ q_start,
                           const int32_t* __restrict__ kv_start, const int32_t* __restrict__ seq_q,
                           const int32_t* __restrict__ seq_kv, int heads_q, int heads_kv,
                           float scale_log2) {
  constexpr int E = D / 32;  // output dims per lane
  __shared__ float qs[kWarps][D];
  __shared__ __align__(16) bf16 ks[kTile * Padded<D>::kRow];
  __shared__ __align__(16) bf16 vs[kTile * Padded<D>::kRow];

  const int seq = blockIdx.z, h = blockIdx.y;
  const int q0 = q_start[seq], qn = seq_q[seq];
  const int kv0 = kv_start[seq], kvn = seq_kv[seq];
  const int row_begin = blockIdx.x * kWarps;
  if (row_begin >= qn) return;  // whole block idle: uniform exit before any barrier
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = row_begin + warp;
  const bool valid = row < qn;
  const int delta = kvn - qn;                 // prefix keys every query sees
  const int limit = row + delta;              // last key this row sees (inclusive)
  const int block_limit = min(row_begin + kWarps, qn) - 1 + delta;
  const int hk = h / (heads_q / heads_kv);
  const int64_t q_stride = int64_t{heads_q} * D, kv_stride = int64_t{heads_kv} * D;

  if (valid) {
    const bf16* qrow = q + (q0 + row) * q_stride + h * D;
    for (int d = lane; d < D; d += 32) qs[warp][d] = __bfloat162float(qrow[d]) * scale_log2;
  }
  float m = -INFINITY, l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;

  const bf16* kbase = k + kv0 * kv_stride + hk * D;
  const bf16* vbase = v + kv0 * kv_stride + hk * D;
  for (int t0 = 0; t0 <= block_limit; t0 += kTile) {
    __syncthreads();  // previous tile fully consumed (and qs written, first time)
    LoadTile<D>(ks, kbase, kv_stride, t0, kvn);
    LoadTile<D>(vs, vbase, kv_stride, t0, kvn);
    __syncthreads();
    if (!valid) continue;
    const int j = t0 + lane;
    const bool seen = j <= limit;
    const float s = seen ? DotRow<D>(qs[warp], ks + lane * Padded<D>::kRow) : -INFINITY;
    // Key 0 is in the first tile and every row sees it, so m is finite from
    // the first tile on and m_new never is -inf.
    const float m_new = fmaxf(m, WarpMax(s));
    const float p = seen ? exp2f(s - m_new) : 0.f;
    const float corr = exp2f(m - m_new);
    l = l * corr + WarpSum(p);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= corr;
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const bf16* vr = vs + jj * Padded<D>::kRow + lane * E;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(pj, __bfloat162float(vr[e]), acc[e]);
    }
    m = m_new;
  }
  if (!valid) return;
  const float inv_l = 1.f / l;
  bf16* orow = out + (q0 + row) * q_stride + h * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) orow[e] = __float2bfloat16(acc[e] * inv_l);
  if (lane == 0) lse[(int64_t{q0} + row) * heads_q + h] = (m + log2f(l)) * kLn2;
}

// ---- Backward --------------------------------------------------------------
// delta[t, h] = sum_d dO[t, h, d] * O[t, h, d]; one warp per (token, head).
template <int D>
__global__ void __launch_bounds__(kThreads)
    AttentionBackwardDeltaKernel(const bf16* __restrict__ out, const bf16* __restrict__ dout,
                                 float* __restrict__ delta, int64_t rows) {
  const int64_t r = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32)
    acc = fmaf(__bfloat162float(out[r * D + d]), __bfloat162float(dout[r * D + d]), acc);
  acc = WarpSum(acc);
  if (lane == 0) delta[r] = acc;
}

// dQ: grid and row ownership as the forward kernel.
//   s2 = scale log2e q.k, p = exp2(s2 - lse log2e), dp = dO.v,
//   ds = p (dp - delta), dQ = scale * sum_j ds_j k_j.
template <int D>
__global__ void __launch_bounds__(kThreads)
    AttentionBackwardDqKernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                              const bf16* __restrict__ v, const bf16* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              bf16* __restrict__ dq, const int32_t* __restrict__ q_start,
                              const int32_t* __restrict__ kv_start, const int32_t* __restrict__ seq_q,
                              const int32_t* __restrict__ seq_kv, int heads_q, int heads_kv,
                              float scale) {
  constexpr int E = D / 32;
  __shared__ float qs[kWarps][D];
  __shared__ float dos[kWarps][D];
  __shared__ __align__(16) bf16 ks[kTile * Padded<D>::kRow];
  __shared__ __align__(16) bf16 vs[kTile * Padded<D>::kRow];

  const int seq = blockIdx.z, h = blockIdx.y;
  const int q0 = q_start[seq], qn = seq_q[seq];
  const int kv0 = kv_start[seq], kvn = seq_kv[seq];
  const int row_begin = blockIdx.x * kWarps;
  if (row_begin >= qn) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = row_begin + warp;
  const bool valid = row < qn;
  const int dlt = kvn - qn;
  const int limit = row + dlt;
  const int block_limit = min(row_begin + kWarps, qn) - 1 + dlt;
  const int hk = h / (heads_q / heads_kv);
  const int64_t q_stride = int64_t{heads_q} * D, kv_stride = int64_t{heads_kv} * D;
  const float scale_log2 = scale * kLog2e;

  float lse2 = 0.f, row_delta = 0.f;
  if (valid) {
    const int64_t t = q0 + row;
    for (int d = lane; d < D; d += 32) {
      qs[warp][d] = __bfloat162float(q[t * q_stride + h * D + d]) * scale_log2;
      dos[warp][d] = __bfloat162float(dout[t * q_stride + h * D + d]);
    }
    lse2 = lse[t * heads_q + h] * kLog2e;
    row_delta = delta[t * heads_q + h];
  }
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  const bf16* kbase = k + kv0 * kv_stride + hk * D;
  const bf16* vbase = v + kv0 * kv_stride + hk * D;
  for (int t0 = 0; t0 <= block_limit; t0 += kTile) {
    __syncthreads();
    LoadTile<D>(ks, kbase, kv_stride, t0, kvn);
    LoadTile<D>(vs, vbase, kv_stride, t0, kvn);
    __syncthreads();
    if (!valid) continue;
    const int j = t0 + lane;
    float ds = 0.f;
    if (j <= limit) {
      const float s2 = DotRow<D>(qs[warp], ks + lane * Padded<D>::kRow);
      const float p = exp2f(s2 - lse2);
      const float dp = DotRow<D>(dos[warp], vs + lane * Padded<D>::kRow);
      ds = p * (dp - row_delta);
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      const bf16* kr = ks + jj * Padded<D>::kRow + lane * E;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(dsj, __bfloat162float(kr[e]), acc[e]);
    }
  }
  if (!valid) return;
  bf16* dqrow = dq + (q0 + row) * q_stride + h * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) dqrow[e] = __float2bfloat16(acc[e] * scale);
}

// dK, dV: grid (ceil(max_kv / kWarps), heads_kv, num_seqs); warp w owns key
// row x * kWarps + w of KV head blockIdx.y, summing over the query heads of
// its group and over every query that sees it (t >= j - (kvn - qn)).
// No atomics: each key row has exactly one writer, so results are deterministic.
template <int D>
__global__ void __launch_bounds__(kThreads)
    AttentionBackwardDkvKernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                               const bf16* __restrict__ v, const bf16* __restrict__ dout,
                               const float* __restrict__ lse, const float* __restrict__ delta,
                               bf16* __restrict__ dk, bf16* __restrict__ dv,
                               const int32_t* __restrict__ q_start,
                               const int32_t* __restrict__ kv_start,
                               const int32_t* __restrict__ seq_q,
                               const int32_t* __restrict__ seq_kv, int heads_q, int heads_kv,
                               float scale) {
  constexpr int E = D / 32;
  __shared__ float kf[kWarps][D];
  __shared__ float vf[kWarps][D];
  __shared__ __align__(16) bf16 qt[kTile * Padded<D>::kRow];
  __shared__ __align__(16) bf16 dot[kTile * Padded<D>::kRow];
  __shared__ float lse2_s[kTile];
  __shared__ float delta_s[kTile];

  const int seq = blockIdx.z, hk = blockIdx.y;
  const int q0 = q_start[seq], qn = seq_q[seq];
  const int kv0 = kv_start[seq], kvn = seq_kv[seq];
  const int key_begin = blockIdx.x * kWarps;
  if (key_begin >= kvn) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key = key_begin + warp;
  const bool valid = key < kvn;
  const int dlt = kvn - qn;
  const int group = heads_q / heads_kv;
  const int64_t q_stride = int64_t{heads_q} * D, kv_stride = int64_t{heads_kv} * D;
  const float scale_log2 = scale * kLog2e;

  if (valid) {
    const int64_t t = kv0 + key;
    for (int d = lane; d < D; d += 32) {
      kf[warp][d] = __bfloat162float(k[t * kv_stride + hk * D + d]) * scale_log2;
      vf[warp][d] = __bfloat162float(v[t * kv_stride + hk * D + d]);
    }
  }
  float dk_acc[E], dv_acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) dk_acc[e] = dv_acc[e] = 0.f;
  // The first query that sees any key of this block: key_begin - dlt.
  const int first_q = max(0, key_begin - dlt);
  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    const bf16* qbase = q + q0 * q_stride + h * D;
    const bf16* dobase = dout + q0 * q_stride + h * D;
    for (int t0 = first_q; t0 < qn; t0 += kTile) {
      __syncthreads();
      LoadTile<D>(qt, qbase, q_stride, t0, qn);
      LoadTile<D>(dot, dobase, q_stride, t0, qn);
      if (threadIdx.x < kTile) {
        const int t = t0 + threadIdx.x;
        lse2_s[threadIdx.x] = t < qn ? lse[(int64_t{q0} + t) * heads_q + h] * kLog2e : 0.f;
        delta_s[threadIdx.x] = t < qn ? delta[(int64_t{q0} + t) * heads_q + h] : 0.f;
      }
      __syncthreads();
      if (!valid) continue;
      const int t = t0 + lane;
      float p = 0.f, ds = 0.f;
      if (t < qn && t + dlt >= key) {
        const float s2 = DotRow<D>(kf[warp], qt + lane * Padded<D>::kRow);
        p = exp2f(s2 - lse2_s[lane]);
        const float dp = DotRow<D>(vf[warp], dot + lane * Padded<D>::kRow);
        ds = p * (dp - delta_s[lane]);
      }
      for (int ii = 0; ii < kTile; ++ii) {
        const float pi = __shfl_sync(0xffffffffu, p, ii);
        const float dsi = __shfl_sync(0xffffffffu, ds, ii);
        const bf16* qr = qt + ii * Padded<D>::kRow + lane * E;
        const bf16* dr = dot + ii * Padded<D>::kRow + lane * E;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          dv_acc[e] = fmaf(pi, __bfloat162float(dr[e]), dv_acc[e]);
          dk_acc[e] = fmaf(dsi, __bfloat162float(qr[e]), dk_acc[e]);
        }
      }
    }
  }
  if (!valid) return;
  const int64_t off = (kv0 + key) * kv_stride + hk * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    dk[off + e] = __float2bfloat16(dk_acc[e] * scale);
    dv[off + e] = __float2bfloat16(dv_acc[e]);
  }
}

absl::Status CheckArgs(const AttentionShape& shape, const VarlenBatch& batch) {
  if (absl::Status s = ValidateAttentionShape(shape); !s.ok()) return s;
  if (shape.head_dim != 64 && shape.head_dim != 128)
    return absl::UnimplementedError(absl::StrCat(
        "plain attention kernels are built for head_dim 64 and 128, not ", shape.head_dim));
  if (batch.num_seqs() > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("plain attention: ", batch.num_seqs(), " sequences exceed gridDim.z 65535"));
  return absl::OkStatus();
}

dim3 RowGrid(int32_t max_rows, int32_t heads, int32_t seqs) {
  return dim3(static_cast<unsigned>((max_rows + kWarps - 1) / kWarps),
              static_cast<unsigned>(heads), static_cast<unsigned>(seqs));
}

}  // namespace

// ---- Launchers -------------------------------------------------------------
absl::Status LaunchPlainAttentionForward(const AttentionShape& shape, const VarlenBatch& batch,
                                         const AttentionForwardArgs& a, cudaStream_t stream) {
  if (absl::Status s = CheckArgs(shape, batch); !s.ok()) return s;
  if (batch.total_q() == 0) return absl::OkStatus();
  const dim3 grid = RowGrid(batch.max_q(), shape.heads_q, batch.num_seqs());
  const float sl2 = shape.EffectiveScale() * kLog2e;
  if (shape.head_dim == 128)
    AttentionForwardKernel<128><<<grid, kThreads, 0, stream>>>(
        a.q, a.k, a.v, a.out, a.lse, batch.d_q_start(), batch.d_kv_start(), batch.d_seq_q(), batch.d_seq_kv(), shape.heads_q,
        shape.heads_kv, sl2);
  else
    AttentionForwardKernel<64><<<grid, kThreads, 0, stream>>>(
        a.q, a.k, a.v, a.out, a.lse, batch.d_q_start(), batch.d_kv_start(), batch.d_seq_q(), batch.d_seq_kv(), shape.heads_q,
        shape.heads_kv, sl2);
  return CudaLaunchStatus(absl::StrCat("AttentionForwardKernel<", shape.head_dim, "> grid (",
                                       grid.x, ", ", grid.y, ", ", grid.z, ")"));
}

absl::Status LaunchPlainAttentionBackward(const AttentionShape& shape, const VarlenBatch& batch,
                                          const AttentionBackwardArgs& a, float* delta,
                                          cudaStream_t stream) {
  if (absl::Status s = CheckArgs(shape, batch); !s.ok()) return s;
  const float scale = shape.EffectiveScale();
  // delta is indexed by absolute Q row: cover every row up to the last
  // sequence's end, gaps included (their values are never read).
  const int64_t rows = batch.q_rows() * shape.heads_q;
  if (batch.total_q() > 0) {
    const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    if (shape.head_dim == 128)
      AttentionBackwardDeltaKernel<128><<<blocks, kThreads, 0, stream>>>(a.out, a.dout, delta, rows);
    else
      AttentionBackwardDeltaKernel<64><<<blocks, kThreads, 0, stream>>>(a.out, a.dout, delta, rows);
    if (absl::Status s = CudaLaunchStatus("AttentionBackwardDeltaKernel"); !s.ok()) return s;
    const dim3 grid = RowGrid(batch.max_q(), shape.heads_q, batch.num_seqs());
    if (shape.head_dim == 128)
      AttentionBackwardDqKernel<128><<<grid, kThreads, 0, stream>>>(
          a.q, a.k, a.v, a.dout, a.lse, delta, a.dq, batch.d_q_start(), batch.d_kv_start(), batch.d_seq_q(), batch.d_seq_kv(),
          shape.heads_q, shape.heads_kv, scale);
    else
      AttentionBackwardDqKernel<64><<<grid, kThreads, 0, stream>>>(
          a.q, a.k, a.v, a.dout, a.lse, delta, a.dq, batch.d_q_start(), batch.d_kv_start(), batch.d_seq_q(), batch.d_seq_kv(),
          shape.heads_q, shape.heads_kv, scale);
    if (absl::Status s = CudaLaunchStatus("AttentionBackwardDqKernel"); !s.ok()) return s;
  }
  if (batch.total_kv() == 0) return absl::OkStatus();
  // Keys of a sequence with no queries get dK = dV = 0 from this kernel too.
  const dim3 grid = RowGrid(batch.max_kv(), shape.heads_kv, batch.num_seqs());
  if (shape.head_dim == 128)
    AttentionBackwardDkvKernel<128><<<grid, kThreads, 0, stream>>>(
        a.q, a.k, a.v, a.dout, a.lse, delta, a.dk, a.dv, batch.d_q_start(), batch.d_kv_start(), batch.d_seq_q(), batch.d_seq_kv(),
        shape.heads_q, shape.heads_kv, scale);
  else
    AttentionBackwardDkvKernel<64><<<grid, kThreads, 0, stream>>>(
        a.q, a.k, a.v, a.dout, a.lse, delta, a.dk, a.dv, batch.d_q_start(), batch.d_kv_start(), batch.d_seq_q(), batch.d_seq_kv(),
        shape.heads_q, shape.heads_kv, scale);
  return CudaLaunchStatus("AttentionBackwardDkvKernel");
}

absl::StatusOr<std::unique_ptr<PlainAttention>> PlainAttention::Create(
    const AttentionShape& shape) {
  if (absl::Status s = ValidateAttentionShape(shape); !s.ok()) return s;
  if (shape.head_dim != 64 && shape.head_dim != 128)
    return absl::UnimplementedError(absl::StrCat(
        "plain attention kernels are built for head_dim 64 and 128, not ", shape.head_dim));
  return std::unique_ptr<PlainAttention>(new PlainAttention(shape));
}

absl::Status PlainAttention::Forward(const VarlenBatch& batch, const AttentionForwardArgs& args,
                                     cudaStream_t stream) {
  return LaunchPlainAttentionForward(shape_, batch, args, stream);
}

absl::Status PlainAttention::Backward(const VarlenBatch& batch, const AttentionBackwardArgs& args,
                                      cudaStream_t stream) {
  if (absl::Status s = delta_.Reserve(static_cast<size_t>(batch.q_rows()) * shape_.heads_q);
      !s.ok())
    return s;
  return LaunchPlainAttentionBackward(shape_, batch, args, delta_.data(), stream);
}

}  // namespace flashcp::worker::cuda
