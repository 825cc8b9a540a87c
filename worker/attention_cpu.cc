#include "worker/attention_cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"

namespace flashcp::worker {
namespace {

// Tile sizes: kBq queries x kBk keys. 64 x 64 fp32 score tiles (16 KiB) and
// the D-wide rows they touch stay in L1/L2 for D <= 256.
constexpr int64_t kBq = 64;
constexpr int64_t kBk = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for x in [-87, 88], written so that loops over it vectorise (no
// libm call, no branches): x = n ln2 + r with |r| <= ln2/2, exp(r) by its
// degree-6 Taylor polynomial (relative error below 2e-7), 2^n by exponent
// bits. The rounding to n uses the 1.5 * 2^23 trick (round-to-nearest mode).
inline float FastExp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 split in two for exact n * ln2_hi
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMagic = 12582912.0f;   // 1.5 * 2^23
  const float t = x * kLog2e + kMagic;
  const float n = t - kMagic;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kMagic);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

// Per-thread scratch, grown on demand, so tasks do not allocate.
struct Scratch {
  std::vector<float> qs, dos, acc, kt, vt, s, dp, m, l, lse, delta, dk, dv;
};
Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}
void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

struct Ctx {
  int64_t h_count, d, hd;
  float scale;
};

// Loads rows [row0, row0 + n) of head h of `src` into dst[n][D], times `mul`.
inline void LoadRows(const Ctx& c, const float* src, int64_t row0, int64_t n, int64_t h,
                     float mul, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const float* s = src + (row0 + i) * c.hd + h * c.d;
    float* t = dst + i * c.d;
    for (int64_t x = 0; x < c.d; ++x) t[x] = s[x] * mul;
  }
}

// Loads rows [row0, row0 + n) of head h of `src` transposed into dst[D][kBk];
// columns n..kBk-1 are zeroed so that full-width loops stay finite.
inline void LoadTransposed(const Ctx& c, const float* src, int64_t row0, int64_t n, int64_t h,
                           float* dst) {
  if (n < kBk) {
    for (int64_t x = 0; x < c.d; ++x) std::fill(dst + x * kBk + n, dst + (x + 1) * kBk, 0.0f);
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* s = src + (row0 + j) * c.hd + h * c.d;
    for (int64_t x = 0; x < c.d; ++x) dst[x * kBk + j] = s[x];
  }
}

// out[i][0..kBk) = a[i][:] . bt[:][0..kBk) for i < rows: an outer-product
// formulation (axpy over kBk contiguous columns) so the loop vectorises.
inline void TileMatmul(const float* __restrict a, const float* __restrict bt, int64_t rows,
                       int64_t d, float* __restrict out) {
  for (int64_t i = 0; i < rows; ++i) {
    float row[kBk] = {};
    const float* ai = a + i * d;
    for (int64_t x = 0; x < d; ++x) {
      const float av = ai[x];
      const float* b = bt + x * kBk;
#pragma omp simd
      for (int64_t j = 0; j < kBk; ++j) row[j] += av * b[j];
    }
    std::memcpy(out + i * kBk, row, sizeof(row));
  }
}

// y[0..d) += a * x[0..d)
inline void Axpy(float a, const float* __restrict x, float* __restrict y, int64_t d) {
#pragma omp simd
  for (int64_t t = 0; t < d; ++t) y[t] += a * x[t];
}

struct FwdTask {
  int32_t doc, range;
  int64_t q0;  // first query of the block, relative to the range
  int32_t head;
  double cost;
};

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void ForwardTask(const Ctx& c, const DocAttention& doc, const FwdTask& t, const float* q,
                 float* o, float* lse) {
  Scratch& sc = ThreadScratch();
  const QueryRange& r = doc.queries[t.range];
  const int64_t h = t.head, d = c.d;
  const int64_t bq = std::min(kBq, r.len - t.q0);
  const int64_t row0 = r.row + t.q0, qpos0 = r.pos + t.q0;
  Grow(sc.qs, kBq * d);
  Grow(sc.acc, kBq * d);
  Grow(sc.kt, d * kBk);
  Grow(sc.s, kBq * kBk);
  Grow(sc.m, kBq);
  Grow(sc.l, kBq);
  float* qs = sc.qs.data();
  float* acc = sc.acc.data();
  float* kt = sc.kt.data();
  float* s = sc.s.data();
  float* m = sc.m.data();
  float* l = sc.l.data();
  LoadRows(c, q, row0, bq, h, c.scale, qs);
  std::fill(acc, acc + bq * d, 0.0f);
  std::fill(m, m + bq, kNegInf);
  std::fill(l, l + bq, 0.0f);
  const int64_t kv_end = qpos0 + bq;  // keys [0, kv_end) are seen by some query
  for (int64_t kb = 0; kb < kv_end; kb += kBk) {
    const int64_t bk = std::min(kBk, kv_end - kb);
    LoadTransposed(c, doc.k, kb, bk, h, kt);
    TileMatmul(qs, kt, bq, d, s);
    for (int64_t i = 0; i < bq; ++i) {
      const int64_t nj = std::min(bk, qpos0 + i - kb + 1);  // keys this query sees here
      if (nj <= 0) continue;
      float* si = s + i * kBk;
      float mx = kNegInf;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < nj; ++j) mx = std::max(mx, si[j]);
      const float m_new = std::max(m[i], mx);
      const float alpha = m[i] == kNegInf ? 0.0f : std::exp(m[i] - m_new);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < nj; ++j) {
        const float p = FastExp(si[j] - m_new);
        si[j] = p;
        sum += p;
      }
      l[i] = l[i] * alpha + sum;
      m[i] = m_new;
      float* ai = acc + i * d;
      if (alpha != 1.0f) {
#pragma omp simd
        for (int64_t x = 0; x < d; ++x) ai[x] *= alpha;
      }
      for (int64_t j = 0; j < nj; ++j) Axpy(si[j], doc.v + (kb + j) * c.hd + h * d, ai, d);
    }
  }
  for (int64_t i = 0; i < bq; ++i) {
    // Every query sees at least its own key, so l[i] >= 1.
    const float inv = 1.0f / l[i];
    float* out = o + (row0 + i) * c.hd + h * d;
    const float* ai = acc + i * d;
    for (int64_t x = 0; x < d; ++x) out[x] = ai[x] * inv;
    lse[(row0 + i) * c.h_count + h] = m[i] + std::log(l[i]);
  }
}

// Loads a query block's shared backward inputs: scaled q, dout, lse, delta.
inline void LoadQueryBlock(const Ctx& c, const float* q, const float* dout, const float* lse,
                           const float* delta, int64_t row0, int64_t bq, int64_t h, Scratch& sc) {
  Grow(sc.qs, kBq * c.d);
  Grow(sc.dos, kBq * c.d);
  Grow(sc.lse, kBq);
  Grow(sc.delta, kBq);
  LoadRows(c, q, row0, bq, h, c.scale, sc.qs.data());
  LoadRows(c, dout, row0, bq, h, 1.0f, sc.dos.data());
  for (int64_t i = 0; i < bq; ++i) {
    sc.lse[i] = lse[(row0 + i) * c.h_count + h];
    sc.delta[i] = delta[(row0 + i) * c.h_count + h];
  }
}

// s[i][j] <- dS = P * (dP - delta) where P = exp(s - lse), on the visible
// keys j < nj; p_out (may be null) gets P.
inline void SoftmaxGrad(float* __restrict si, const float* __restrict dpi, float lse_i,
                        float delta_i, int64_t nj, float* __restrict p_out) {
#pragma omp simd
  for (int64_t j = 0; j < nj; ++j) {
    const float p = FastExp(si[j] - lse_i);
    if (p_out != nullptr) p_out[j] = p;
    si[j] = p * (dpi[j] - delta_i);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void BackwardDqTask(const Ctx& c, const DocAttention& doc, const FwdTask& t, const float* q,
                    const float* lse, const float* dout, const float* delta, float* dq) {
  Scratch& sc = ThreadScratch();
  const QueryRange& r = doc.queries[t.range];
  const int64_t h = t.head, d = c.d;
  const int64_t bq = std::min(kBq, r.len - t.q0);
  const int64_t row0 = r.row + t.q0, qpos0 = r.pos + t.q0;
  LoadQueryBlock(c, q, dout, lse, delta, row0, bq, h, sc);
  Grow(sc.acc, kBq * d);
  Grow(sc.kt, d * kBk);
  Grow(sc.vt, d * kBk);
  Grow(sc.s, kBq * kBk);
  Grow(sc.dp, kBq * kBk);
  float* acc = sc.acc.data();
  std::fill(acc, acc + bq * d, 0.0f);
  const int64_t kv_end = qpos0 + bq;
  for (int64_t kb = 0; kb < kv_end; kb += kBk) {
    const int64_t bk = std::min(kBk, kv_end - kb);
    LoadTransposed(c, doc.k, kb, bk, h, sc.kt.data());
    LoadTransposed(c, doc.v, kb, bk, h, sc.vt.data());
    TileMatmul(sc.qs.data(), sc.kt.data(), bq, d, sc.s.data());
    TileMatmul(sc.dos.data(), sc.vt.data(), bq, d, sc.dp.data());
    for (int64_t i = 0; i < bq; ++i) {
      const int64_t nj = std::min(bk, qpos0 + i - kb + 1);
      if (nj <= 0) continue;
      float* si = sc.s.data() + i * kBk;
      SoftmaxGrad(si, sc.dp.data() + i * kBk, sc.lse[i], sc.delta[i], nj, nullptr);
      float* ai = acc + i * d;
      for (int64_t j = 0; j < nj; ++j) Axpy(si[j], doc.k + (kb + j) * c.hd + h * d, ai, d);
    }
  }
  for (int64_t i = 0; i < bq; ++i) {
    float* out = dq + (row0 + i) * c.hd + h * d;
    const float* ai = acc + i * d;
    for (int64_t x = 0; x < d; ++x) out[x] = ai[x] * c.scale;
  }
}

struct KvTask {
  int32_t doc;
  int64_t k0;  // first key of the block
  int32_t head;
  double cost;
};

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void BackwardDkvTask(const Ctx& c, const DocAttention& doc, const KvTask& t, const float* q,
                     const float* lse, const float* dout, const float* delta) {
  Scratch& sc = ThreadScratch();
  const int64_t h = t.head, d = c.d, kb = t.k0;
  const int64_t bk = std::min(kBk, doc.kv_len - kb);
  Grow(sc.kt, d * kBk);
  Grow(sc.vt, d * kBk);
  Grow(sc.s, kBq * kBk);
  Grow(sc.dp, kBq * kBk);
  Grow(sc.dk, kBk * d);
  Grow(sc.dv, kBk * d);
  Grow(sc.m, kBk);  // holds P of one query row
  float* dk = sc.dk.data();
  float* dv = sc.dv.data();
  std::fill(dk, dk + bk * d, 0.0f);
  std::fill(dv, dv + bk * d, 0.0f);
  LoadTransposed(c, doc.k, kb, bk, h, sc.kt.data());
  LoadTransposed(c, doc.v, kb, bk, h, sc.vt.data());
  for (const QueryRange& r : doc.queries) {
    // Queries at positions >= kb see at least key kb of this block.
    for (int64_t q0 = std::max<int64_t>(0, kb - r.pos); q0 < r.len; q0 += kBq) {
      const int64_t bq = std::min(kBq, r.len - q0);
      const int64_t row0 = r.row + q0, qpos0 = r.pos + q0;
      LoadQueryBlock(c, q, dout, lse, delta, row0, bq, h, sc);
      TileMatmul(sc.qs.data(), sc.kt.data(), bq, d, sc.s.data());
      TileMatmul(sc.dos.data(), sc.vt.data(), bq, d, sc.dp.data());
      for (int64_t i = 0; i < bq; ++i) {
        const int64_t nj = std::min(bk, qpos0 + i - kb + 1);
        if (nj <= 0) continue;
        float* si = sc.s.data() + i * kBk;
        float* p = sc.m.data();
        SoftmaxGrad(si, sc.dp.data() + i * kBk, sc.lse[i], sc.delta[i], nj, p);
        const float* qi = sc.qs.data() + i * d;  // scale * q: dK = scale * dS^T q
        const float* doi = sc.dos.data() + i * d;
        for (int64_t j = 0; j < nj; ++j) {
          Axpy(p[j], doi, dv + j * d, d);
          Axpy(si[j], qi, dk + j * d, d);
        }
      }
    }
  }
  for (int64_t j = 0; j < bk; ++j) {
    std::memcpy(doc.dk + (kb + j) * c.hd + h * d, dk + j * d, d * sizeof(float));
    std::memcpy(doc.dv + (kb + j) * c.hd + h * d, dv + j * d, d * sizeof(float));
  }
}

std::vector<FwdTask> QueryTasks(absl::Span<const DocAttention> docs, int32_t heads) {
  std::vector<FwdTask> tasks;
  for (size_t di = 0; di < docs.size(); ++di) {
    for (size_t ri = 0; ri < docs[di].queries.size(); ++ri) {
      const QueryRange& r = docs[di].queries[ri];
      for (int64_t q0 = 0; q0 < r.len; q0 += kBq) {
        const int64_t bq = std::min(kBq, r.len - q0);
        const double cost = static_cast<double>(bq) * static_cast<double>(r.pos + q0 + bq);
        for (int32_t h = 0; h < heads; ++h) {
          tasks.push_back(FwdTask{static_cast<int32_t>(di), static_cast<int32_t>(ri), q0, h, cost});
        }
      }
    }
  }
  // Longest first, so that dynamic scheduling balances the tail.
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const FwdTask& a, const FwdTask& b) { return a.cost > b.cost; });
  return tasks;
}

}  // namespace

absl::Status ValidateDocs(const AttentionShape& shape, absl::Span<const DocAttention> docs,
                          int64_t q_rows, bool backward) {
  if (shape.heads < 1 || shape.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shape: heads ", shape.heads, " and head_dim ",
                                                   shape.head_dim, " must be >= 1"));
  }
  if (q_rows < 0) return absl::InvalidArgumentError(absl::StrCat("q_rows: ", q_rows, " < 0"));
  for (size_t i = 0; i < docs.size(); ++i) {
    const DocAttention& doc = docs[i];
    if (doc.kv_len < 0) {
      return absl::InvalidArgumentError(absl::StrCat("docs[", i, "].kv_len: ", doc.kv_len, " < 0"));
    }
    if (doc.kv_len > 0 && (doc.k == nullptr || doc.v == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("docs[", i, "]: null k or v"));
    }
    if (backward && doc.kv_len > 0 && (doc.dk == nullptr || doc.dv == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("docs[", i, "]: null dk or dv in backward"));
    }
    for (size_t j = 0; j < doc.queries.size(); ++j) {
      const QueryRange& r = doc.queries[j];
      if (r.len < 0 || r.pos < 0 || r.pos + r.len > doc.kv_len || r.row < 0 ||
          r.row + r.len > q_rows) {
        return absl::InvalidArgumentError(absl::StrCat(
            "docs[", i, "].queries[", j, "]: rows [", r.row, ", ", r.row + r.len,
            ") at positions [", r.pos, ", ", r.pos + r.len, ") fall outside ", q_rows,
            " query rows or ", doc.kv_len, " keys"));
      }
    }
  }
  return absl::OkStatus();
}

double AttentionPairs(absl::Span<const DocAttention> docs) {
  double pairs = 0.0;
  for (const DocAttention& doc : docs) {
    for (const QueryRange& r : doc.queries) {
      pairs += core::ShardWorkload(r.pos, r.len);
    }
  }
  return pairs;
}

absl::Status AttentionForwardCpu(const AttentionShape& shape, absl::Span<const DocAttention> docs,
                                 int64_t q_rows, const float* q, float* o, float* lse,
                                 ThreadPool& pool) {
  if (absl::Status s = ValidateDocs(shape, docs, q_rows, false); !s.ok()) return s;
  const Ctx c{shape.heads, shape.head_dim, int64_t{shape.heads} * shape.head_dim, shape.scale};
  const std::vector<FwdTask> tasks = QueryTasks(docs, shape.heads);
  pool.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    ForwardTask(c, docs[tasks[i].doc], tasks[i], q, o, lse);
  });
  return absl::OkStatus();
}

absl::Status AttentionBackwardCpu(const AttentionShape& shape,
                                  absl::Span<const DocAttention> docs, int64_t q_rows,
                                  const float* q, const float* o, const float* lse,
                                  const float* dout, float* dq, ThreadPool& pool) {
  if (absl::Status s = ValidateDocs(shape, docs, q_rows, true); !s.ok()) return s;
  const Ctx c{shape.heads, shape.head_dim, int64_t{shape.heads} * shape.head_dim, shape.scale};
  // delta[row][h] = dout . o: the softmax backward's row term, once per query.
  std::vector<float> delta(static_cast<size_t>(q_rows) * shape.heads, 0.0f);
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (row, len)
  for (const DocAttention& doc : docs) {
    for (const QueryRange& r : doc.queries) ranges.emplace_back(r.row, r.len);
  }
  pool.ParallelFor(static_cast<int64_t>(ranges.size()), [&](int64_t ri) {
    for (int64_t row = ranges[ri].first; row < ranges[ri].first + ranges[ri].second; ++row) {
      for (int64_t h = 0; h < c.h_count; ++h) {
        const float* a = dout + row * c.hd + h * c.d;
        const float* b = o + row * c.hd + h * c.d;
        float sum = 0.0f;
        for (int64_t x = 0; x < c.d; ++x) sum += a[x] * b[x];
        delta[row * c.h_count + h] = sum;
      }
    }
  });
  std::vector<KvTask> kv_tasks;
  for (size_t di = 0; di < docs.size(); ++di) {
    const DocAttention& doc = docs[di];
    for (int64_t k0 = 0; k0 < doc.kv_len; k0 += kBk) {
      double cost = 0.0;
      for (const QueryRange& r : doc.queries) {
        cost += static_cast<double>(std::max<int64_t>(0, r.pos + r.len - std::max(k0, r.pos)));
      }
      for (int32_t h = 0; h < shape.heads; ++h) {
        kv_tasks.push_back(KvTask{static_cast<int32_t>(di), k0, h, cost});
      }
    }
  }
  std::stable_sort(kv_tasks.begin(), kv_tasks.end(),
                   [](const KvTask& a, const KvTask& b) { return a.cost > b.cost; });
  pool.ParallelFor(static_cast<int64_t>(kv_tasks.size()), [&](int64_t i) {
    BackwardDkvTask(c, docs[kv_tasks[i].doc], kv_tasks[i], q, lse, dout, delta.data());
  });
  const std::vector<FwdTask> tasks = QueryTasks(docs, shape.heads);
  pool.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
    BackwardDqTask(c, docs[tasks[i].doc], tasks[i], q, lse, dout, delta.data(), dq);
  });
  return absl::OkStatus();
}

}  // namespace flashcp::worker
