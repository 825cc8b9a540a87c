#include "worker/attention_masked_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/mask.h"

namespace flashcp::worker {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Sums in double: this kernel is the CPU reference path of the
// block-diffusion mask (the engine and flashcp.torch on CPU), held to an fp32
// error no larger than torch's own fp32 SDPA, so every sum and accumulator is
// double and only results are rounded to fp32.
double Dot(const float* a, const float* b, int64_t d) {
  double s = 0.0;
  for (int64_t x = 0; x < d; ++x) s += double{a[x]} * b[x];
  return s;
}

struct Ctx {
  int64_t h_count, d, hd;
  double scale;
  int64_t b;
};

// Scaled scores of query i of shard `s` (head h) against keys [j0, j1)
// (out[j - j0]); masked keys get -inf. Returns the row maximum.
double Scores(const Ctx& c, const MaskedShardAttention& s, const float* q, int64_t i, int64_t h,
              int64_t j0, int64_t j1, std::vector<double>& out) {
  out.resize(j1 - j0);
  const float* qi = q + (s.q_row + i) * c.hd + h * c.d;
  const int64_t qpos = s.q_pos + i;
  double mx = kNegInf;
  for (int64_t j = j0; j < j1; ++j) {
    double& x = out[j - j0];
    if (!core::BlockDiffusionSees(c.b, s.q_noisy, qpos, s.key_noisy[j] != 0, s.key_pos[j])) {
      x = kNegInf;
      continue;
    }
    x = c.scale * Dot(qi, s.k + j * c.hd + h * c.d, c.d);
    mx = std::max(mx, x);
  }
  return mx;
}

// Keys per tile of the backward: its double dK, dV accumulators are
// kKeyTile x D per task, whatever the shard's length.
constexpr int64_t kKeyTile = 256;

absl::Status Validate(const AttentionShape& shape, int64_t block_size,
                      absl::Span<const MaskedShardAttention> shards, int64_t q_rows,
                      bool backward) {
  if (shape.heads < 1 || shape.head_dim < 1)
    return absl::InvalidArgumentError(absl::StrCat("shape: heads ", shape.heads, " and head_dim ",
                                                   shape.head_dim, " must be >= 1"));
  if (block_size < 1)
    return absl::InvalidArgumentError(absl::StrCat("block_size: must be >= 1, got ", block_size));
  for (size_t i = 0; i < shards.size(); ++i) {
    const MaskedShardAttention& s = shards[i];
    if (s.kv_len < 0 || s.q_len < 0 || s.q_row < 0 || s.q_row + s.q_len > q_rows || s.q_pos < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("shards[", i, "]: queries at rows [", s.q_row, ", ", s.q_row + s.q_len,
                       ") of ", q_rows, ", positions from ", s.q_pos, ", ", s.kv_len, " keys"));
    if (s.kv_len > 0 && (s.k == nullptr || s.v == nullptr || s.key_noisy == nullptr ||
                         s.key_pos == nullptr))
      return absl::InvalidArgumentError(absl::StrCat("shards[", i, "]: null k, v or key info"));
    if (backward && s.kv_len > 0 && (s.dk == nullptr || s.dv == nullptr))
      return absl::InvalidArgumentError(absl::StrCat("shards[", i, "]: null dk or dv in backward"));
    for (int64_t q = 0; q < s.q_len; ++q) {
      bool any = false;
      for (int64_t j = 0; j < s.kv_len && !any; ++j)
        any = core::BlockDiffusionSees(block_size, s.q_noisy, s.q_pos + q, s.key_noisy[j] != 0,
                                       s.key_pos[j]);
      if (!any)
        return absl::InvalidArgumentError(absl::StrCat("shards[", i, "]: query at position ",
                                                       s.q_pos + q, " sees none of its ",
                                                       s.kv_len, " staged keys"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<MaskedShardAttention> MaskedStagedShards(const CpRankLayout& p, const float* stage_k,
                                                     const float* stage_v, float* gk, float* gv,
                                                     int64_t row_floats) {
  std::vector<MaskedShardAttention> out;
  out.reserve(p.prefix_q_start.size());
  int64_t at = 0;
  for (size_t i = 0; i < p.prefix_q_start.size(); ++i) {
    MaskedShardAttention s;
    s.k = stage_k + at * row_floats;
    s.v = stage_v + at * row_floats;
    s.key_noisy = p.stage_noisy.data() + at;
    s.key_pos = p.stage_pos.data() + at;
    s.kv_len = p.prefix_kv_len[i];
    s.q_row = p.prefix_q_start[i];
    s.q_len = p.prefix_q_len[i];
    s.q_pos = p.prefix_q_pos[i];
    s.q_noisy = p.prefix_q_noisy[i] != 0;
    if (gk != nullptr) {
      s.dk = gk + at * row_floats;
      s.dv = gv + at * row_floats;
    }
    out.push_back(s);
    at += s.kv_len;
  }
  return out;
}

absl::Status MaskedAttentionForwardCpu(const AttentionShape& shape, int64_t block_size,
                                       absl::Span<const MaskedShardAttention> shards,
                                       int64_t q_rows, const float* q, float* o, float* lse,
                                       ThreadPool& pool) {
  if (absl::Status s = Validate(shape, block_size, shards, q_rows, false); !s.ok()) return s;
  const Ctx c{shape.heads, shape.head_dim, int64_t{shape.heads} * shape.head_dim, shape.scale,
              block_size};
  pool.ParallelFor(static_cast<int64_t>(shards.size()) * c.h_count, [&](int64_t task) {
    const MaskedShardAttention& s = shards[task / c.h_count];
    const int64_t h = task % c.h_count;
    std::vector<double> p, acc(c.d);
    for (int64_t i = 0; i < s.q_len; ++i) {
      const double mx = Scores(c, s, q, i, h, 0, s.kv_len, p);
      double sum = 0.0;
      for (double& x : p) {
        x = x == kNegInf ? 0.0 : std::exp(x - mx);
        sum += x;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < s.kv_len; ++j) {
        if (p[j] == 0.0) continue;
        const double w = p[j] / sum;
        const float* vj = s.v + j * c.hd + h * c.d;
        for (int64_t x = 0; x < c.d; ++x) acc[x] += w * vj[x];
      }
      float* out = o + (s.q_row + i) * c.hd + h * c.d;
      for (int64_t x = 0; x < c.d; ++x) out[x] = static_cast<float>(acc[x]);
      lse[(s.q_row + i) * c.h_count + h] = static_cast<float>(mx + std::log(sum));
    }
  });
  return absl::OkStatus();
}

absl::Status MaskedAttentionBackwardCpu(const AttentionShape& shape, int64_t block_size,
                                        absl::Span<const MaskedShardAttention> shards,
                                        int64_t q_rows, const float* q, const float* o,
                                        const float* lse, const float* dout, float* dq,
                                        ThreadPool& pool) {
  if (absl::Status s = Validate(shape, block_size, shards, q_rows, true); !s.ok()) return s;
  const Ctx c{shape.heads, shape.head_dim, int64_t{shape.heads} * shape.head_dim, shape.scale,
              block_size};
  // A shard's dk, dv and its queries' dq are its own (staged rows are per
  // shard), so one task per (shard, head) writes disjoint memory.
  pool.ParallelFor(static_cast<int64_t>(shards.size()) * c.h_count, [&](int64_t task) {
    const MaskedShardAttention& s = shards[task / c.h_count];
    const int64_t h = task % c.h_count;
    // Keys in tiles: each tile's dK, dV accumulate in double over every
    // query and are rounded once; a query's dQ accumulates in double over
    // a tile and is added to its fp32 row per tile (one rounding where the
    // shard has at most kKeyTile keys).
    std::vector<double> p, delta(s.q_len), dk(kKeyTile * c.d), dv(kKeyTile * c.d), dq_acc(c.d);
    for (int64_t i = 0; i < s.q_len; ++i) {
      const int64_t row = s.q_row + i;
      delta[i] = Dot(dout + row * c.hd + h * c.d, o + row * c.hd + h * c.d, c.d);
      float* dqi = dq + row * c.hd + h * c.d;
      std::fill(dqi, dqi + c.d, 0.0f);
    }
    for (int64_t j0 = 0; j0 < s.kv_len; j0 += kKeyTile) {
      const int64_t j1 = std::min(s.kv_len, j0 + kKeyTile);
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t row = s.q_row + i;
        const float* qi = q + row * c.hd + h * c.d;
        const float* doi = dout + row * c.hd + h * c.d;
        const double l = lse[row * c.h_count + h];
        Scores(c, s, q, i, h, j0, j1, p);
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t j = j0; j < j1; ++j) {
          if (p[j - j0] == kNegInf) continue;
          const double pj = std::exp(p[j - j0] - l);
          const float* kj = s.k + j * c.hd + h * c.d;
          const float* vj = s.v + j * c.hd + h * c.d;
          const double ds = pj * (Dot(doi, vj, c.d) - delta[i]);
          double* dkj = dk.data() + (j - j0) * c.d;
          double* dvj = dv.data() + (j - j0) * c.d;
          for (int64_t x = 0; x < c.d; ++x) {
            dvj[x] += pj * doi[x];
            dkj[x] += c.scale * ds * qi[x];
            dq_acc[x] += c.scale * ds * kj[x];
          }
        }
        float* dqi = dq + row * c.hd + h * c.d;
        for (int64_t x = 0; x < c.d; ++x) dqi[x] += static_cast<float>(dq_acc[x]);
      }
      for (int64_t j = j0; j < j1; ++j) {
        float* dkj = s.dk + j * c.hd + h * c.d;
        float* dvj = s.dv + j * c.hd + h * c.d;
        for (int64_t x = 0; x < c.d; ++x) {
          dkj[x] = static_cast<float>(dk[(j - j0) * c.d + x]);
          dvj[x] = static_cast<float>(dv[(j - j0) * c.d + x]);
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace flashcp::worker
