// Kernels, then the batch upload and the launchers (STYLE 13). Oracle: the
// CPU kernel (worker/attention_masked_cpu.cc) and the fp64 block-diffusion
// reference (worker/mask_reference.h), through the GPU step
// (gpu_cp_step_test.cc, MatchesReferenceUnderBlockDiffusion).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "core/mask_rule.h"
#include "core/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/masked_attention_kernels.h"

namespace flashcp::worker::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHeadDim = 256;  // ValidateAttentionShape's bound

unsigned Blocks(int64_t count) { return static_cast<unsigned>((count + kThreads - 1) / kThreads); }

__device__ __forceinline__ float Dot(const bf16* a, const bf16* b, int d) {
  float s = 0.f;
  for (int x = 0; x < d; ++x) s += __bfloat162float(a[x]) * __bfloat162float(b[x]);
  return s;
}

// Thread (i, h): query i of all shards, query head h. Online softmax in fp32.
__global__ void MaskedForwardKernel(MaskedTables m, int64_t q_count, int hq, int hkv, int d,
                                    float scale,
                                    const bf16* __restrict__ q, const bf16* __restrict__ sk,
                                    const bf16* __restrict__ sv, bf16* __restrict__ o,
                                    float* __restrict__ lse) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= q_count * hq) return;
  const int64_t i = t / hq;
  const int h = static_cast<int>(t % hq), hk = h / (hq / hkv);
  const int32_t s = m.q_shard[i];
  const int64_t local = i - m.shard_q_first[s];
  const int64_t row = m.shard_q_row[s] + local, pos = m.shard_q_pos[s] + local;
  const bool noisy = m.shard_noisy[s] != 0;
  const bf16* qi = q + (row * hq + h) * d;
  float acc[kMaxHeadDim];
  for (int x = 0; x < d; ++x) acc[x] = 0.f;
  float mx = -INFINITY, l = 0.f;
  const int64_t first = m.shard_kv_first[s], len = m.shard_kv_len[s];
  for (int64_t j = first; j < first + len; ++j) {
    if (!core::BlockDiffusionSees(m.block_size, noisy, pos, m.stage_noisy[j] != 0,
                                  m.stage_pos[j]))
      continue;
    const float sc = scale * Dot(qi, sk + (j * hkv + hk) * d, d);
    const float nm = fmaxf(mx, sc);
    const float corr = expf(mx - nm), p = expf(sc - nm);
    l = l * corr + p;
    const bf16* vj = sv + (j * hkv + hk) * d;
    for (int x = 0; x < d; ++x) acc[x] = acc[x] * corr + p * __bfloat162float(vj[x]);
    mx = nm;
  }
  bf16* oi = o + (row * hq + h) * d;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int x = 0; x < d; ++x) oi[x] = __float2bfloat16(acc[x] * inv);
  lse[row * hq + h] = l > 0.f ? mx + logf(l) : -INFINITY;
}

// Thread (i, h): dQ of query i, head h; also writes delta = dO . O (from
// the stored bf16 O) for the dK/dV kernel.
__global__ void MaskedDqKernel(MaskedTables m, int64_t q_count, int hq, int hkv, int d,
                               float scale,
                               const bf16* __restrict__ q, const bf16* __restrict__ sk,
                               const bf16* __restrict__ sv, const bf16* __restrict__ o,
                               const float* __restrict__ lse, const bf16* __restrict__ dout,
                               float* __restrict__ delta, bf16* __restrict__ dq) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= q_count * hq) return;
  const int64_t i = t / hq;
  const int h = static_cast<int>(t % hq), hk = h / (hq / hkv);
  const int32_t s = m.q_shard[i];
  const int64_t local = i - m.shard_q_first[s];
  const int64_t row = m.shard_q_row[s] + local, pos = m.shard_q_pos[s] + local;
  const bool noisy = m.shard_noisy[s] != 0;
  const bf16* qi = q + (row * hq + h) * d;
  const bf16* doi = dout + (row * hq + h) * d;
  const float dl = Dot(doi, o + (row * hq + h) * d, d);
  delta[row * hq + h] = dl;
  const float l = lse[row * hq + h];
  float acc[kMaxHeadDim];
  for (int x = 0; x < d; ++x) acc[x] = 0.f;
  const int64_t first = m.shard_kv_first[s], len = m.shard_kv_len[s];
  for (int64_t j = first; j < first + len; ++j) {
    if (!core::BlockDiffusionSees(m.block_size, noisy, pos, m.stage_noisy[j] != 0,
                                  m.stage_pos[j]))
      continue;
    const bf16* kj = sk + (j * hkv + hk) * d;
    const float p = expf(scale * Dot(qi, kj, d) - l);
    const float ds = p * (Dot(doi, sv + (j * hkv + hk) * d, d) - dl);
    for (int x = 0; x < d; ++x) acc[x] += scale * ds * __bfloat162float(kj[x]);
  }
  bf16* dqi = dq + (row * hq + h) * d;
  for (int x = 0; x < d; ++x) dqi[x] = __float2bfloat16(acc[x]);
}

// Thread (r, hk): dK, dV of staged row r, KV head hk, summed over the query
// heads of its group and every query of its shard that sees it. Staged rows
// are per shard, so each is written by exactly one thread (no atomics).
__global__ void MaskedDkvKernel(MaskedTables m, int64_t stage_rows, int hq, int hkv, int d,
                                float scale,
                                const bf16* __restrict__ q, const bf16* __restrict__ sk,
                                const bf16* __restrict__ sv, const float* __restrict__ lse,
                                const bf16* __restrict__ dout, const float* __restrict__ delta,
                                bf16* __restrict__ gk, bf16* __restrict__ gv) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= stage_rows * hkv) return;
  const int64_t r = t / hkv;
  const int hk = static_cast<int>(t % hkv), group = hq / hkv;
  const int32_t s = m.stage_shard[r];
  const bool key_noisy = m.stage_noisy[r] != 0, noisy = m.shard_noisy[s] != 0;
  const int64_t key_pos = m.stage_pos[r];
  const bf16* kr = sk + (r * hkv + hk) * d;
  const bf16* vr = sv + (r * hkv + hk) * d;
  float ak[kMaxHeadDim], av[kMaxHeadDim];
  for (int x = 0; x < d; ++x) ak[x] = av[x] = 0.f;
  const int64_t q_row = m.shard_q_row[s], q_len = m.shard_q_len[s], q_pos = m.shard_q_pos[s];
  for (int64_t i = 0; i < q_len; ++i) {
    if (!core::BlockDiffusionSees(m.block_size, noisy, q_pos + i, key_noisy, key_pos)) continue;
    const int64_t row = q_row + i;
    for (int g = 0; g < group; ++g) {
      const int h = hk * group + g;
      const bf16* qi = q + (row * hq + h) * d;
      const bf16* doi = dout + (row * hq + h) * d;
      const float p = expf(scale * Dot(qi, kr, d) - lse[row * hq + h]);
      const float ds = p * (Dot(doi, vr, d) - delta[row * hq + h]);
      for (int x = 0; x < d; ++x) {
        av[x] += p * __bfloat162float(doi[x]);
        ak[x] += scale * ds * __bfloat162float(qi[x]);
      }
    }
  }
  bf16* gkr = gk + (r * hkv + hk) * d;
  bf16* gvr = gv + (r * hkv + hk) * d;
  for (int x = 0; x < d; ++x) {
    gkr[x] = __float2bfloat16(ak[x]);
    gvr[x] = __float2bfloat16(av[x]);
  }
}

}  // namespace

absl::Status LaunchMaskedAttentionForward(const AttentionShape& shape, const MaskedTables& batch,
                                          const bf16* q, const bf16* stage_k,
                                          const bf16* stage_v, bf16* o, float* lse,
                                          cudaStream_t stream) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  const int64_t threads = batch.q_count * shape.heads_q;
  if (threads == 0) return absl::OkStatus();
  MaskedForwardKernel<<<Blocks(threads), kThreads, 0, stream>>>(
      batch, batch.q_count, shape.heads_q, shape.heads_kv, shape.head_dim,
      shape.EffectiveScale(), q, stage_k, stage_v, o, lse);
  return CudaLaunchStatus("MaskedForwardKernel");
}

absl::Status LaunchMaskedAttentionBackward(const AttentionShape& shape, const MaskedTables& batch,
                                           const bf16* q, const bf16* stage_k,
                                           const bf16* stage_v, const bf16* o, const float* lse,
                                           const bf16* dout, float* delta, bf16* dq, bf16* gk,
                                           bf16* gv, cudaStream_t stream) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  const MaskedTables& m = batch;
  const int hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  const float scale = shape.EffectiveScale();
  if (const int64_t threads = batch.q_count * hq; threads > 0) {
    MaskedDqKernel<<<Blocks(threads), kThreads, 0, stream>>>(m, batch.q_count, hq, hkv, d, scale,
                                                            q, stage_k, stage_v, o, lse, dout,
                                                            delta, dq);
    FLASHCP_RETURN_IF_ERROR(CudaLaunchStatus("MaskedDqKernel"));
  }
  // Same stream: delta is complete before dK/dV read it.
  if (const int64_t threads = batch.stage_rows * hkv; threads > 0) {
    MaskedDkvKernel<<<Blocks(threads), kThreads, 0, stream>>>(m, batch.stage_rows, hq, hkv, d,
                                                             scale, q, stage_k, stage_v, lse, dout,
                                                             delta, gk, gv);
    FLASHCP_RETURN_IF_ERROR(CudaLaunchStatus("MaskedDkvKernel"));
  }
  return absl::OkStatus();
}

}  // namespace flashcp::worker::cuda
