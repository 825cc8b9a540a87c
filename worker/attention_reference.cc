#include "worker/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace flashcp::worker {
namespace {

absl::Status CheckSizes(const AttentionShape& shape, absl::Span<const int64_t> doc_lens,
                        std::initializer_list<std::pair<const char*, size_t>> tokens,
                        std::initializer_list<std::pair<const char*, size_t>> per_head,
                        int64_t* total) {
  if (shape.heads < 1 || shape.head_dim < 1) {
    return absl::InvalidArgumentError("shape: heads and head_dim must be >= 1");
  }
  *total = 0;
  for (int64_t len : doc_lens) {
    if (len < 1) return absl::InvalidArgumentError(absl::StrCat("doc_lens: length ", len, " < 1"));
    *total += len;
  }
  const size_t hd = static_cast<size_t>(shape.heads) * shape.head_dim;
  for (const auto& [name, size] : tokens) {
    if (size != static_cast<size_t>(*total) * hd) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", size, " floats, expected ",
                                                     *total * hd));
    }
  }
  for (const auto& [name, size] : per_head) {
    if (size != static_cast<size_t>(*total) * shape.heads) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", size, " floats, expected ", *total * shape.heads));
    }
  }
  return absl::OkStatus();
}

double Dot(const float* a, const float* b, int64_t d) {
  double s = 0.0;
  for (int64_t x = 0; x < d; ++x) s += static_cast<double>(a[x]) * b[x];
  return s;
}

// Softmax probabilities of query row t (document positions [base, t]) for head h.
void Probabilities(const AttentionShape& shape, const float* q, const float* k, int64_t base,
                   int64_t t, int64_t h, std::vector<double>& p, double* lse) {
  const int64_t hd = int64_t{shape.heads} * shape.head_dim, d = shape.head_dim;
  p.assign(t - base + 1, 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = base; j <= t; ++j) {
    p[j - base] = shape.scale * Dot(q + t * hd + h * d, k + j * hd + h * d, d);
    mx = std::max(mx, p[j - base]);
  }
  double sum = 0.0;
  for (double& x : p) {
    x = std::exp(x - mx);
    sum += x;
  }
  for (double& x : p) x /= sum;
  *lse = mx + std::log(sum);
}

}  // namespace

absl::Status ReferenceForward(const AttentionShape& shape, absl::Span<const int64_t> doc_lens,
                              absl::Span<const float> q, absl::Span<const float> k,
                              absl::Span<const float> v, absl::Span<float> o,
                              absl::Span<float> lse) {
  int64_t total = 0;
  if (absl::Status s = CheckSizes(shape, doc_lens,
                                  {{"q", q.size()}, {"k", k.size()}, {"v", v.size()}, {"o", o.size()}},
                                  {{"lse", lse.size()}}, &total);
      !s.ok()) {
    return s;
  }
  const int64_t hd = int64_t{shape.heads} * shape.head_dim, d = shape.head_dim;
  std::vector<double> p, acc(d);
  int64_t base = 0;
  for (int64_t len : doc_lens) {
    for (int64_t t = base; t < base + len; ++t) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        double l = 0.0;
        Probabilities(shape, q.data(), k.data(), base, t, h, p, &l);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = base; j <= t; ++j) {
          for (int64_t x = 0; x < d; ++x) acc[x] += p[j - base] * v[j * hd + h * d + x];
        }
        for (int64_t x = 0; x < d; ++x) o[t * hd + h * d + x] = static_cast<float>(acc[x]);
        lse[t * shape.heads + h] = static_cast<float>(l);
      }
    }
    base += len;
  }
  return absl::OkStatus();
}

absl::Status ReferenceBackward(const AttentionShape& shape, absl::Span<const int64_t> doc_lens,
                               absl::Span<const float> q, absl::Span<const float> k,
                               absl::Span<const float> v, absl::Span<const float> dout,
                               absl::Span<float> dq, absl::Span<float> dk, absl::Span<float> dv,
                               absl::Span<const float> o_stored) {
  int64_t total = 0;
  if (absl::Status s = CheckSizes(shape, doc_lens,
                                  {{"q", q.size()},
                                   {"k", k.size()},
                                   {"v", v.size()},
                                   {"dout", dout.size()},
                                   {"dq", dq.size()},
                                   {"dk", dk.size()},
                                   {"dv", dv.size()},
                                   {"o_stored", o_stored.empty() ? q.size() : o_stored.size()}},
                                  {}, &total);
      !s.ok()) {
    return s;
  }
  const int64_t hd = int64_t{shape.heads} * shape.head_dim, d = shape.head_dim;
  std::vector<double> gq(total * hd, 0.0), gk(total * hd, 0.0), gv(total * hd, 0.0);
  std::vector<double> p, dp;
  int64_t base = 0;
  for (int64_t len : doc_lens) {
    for (int64_t t = base; t < base + len; ++t) {
      for (int64_t h = 0; h < shape.heads; ++h) {
        double l = 0.0;
        Probabilities(shape, q.data(), k.data(), base, t, h, p, &l);
        const float* g = dout.data() + t * hd + h * d;
        // dP_j = dout . v_j; dS_j = P_j (dP_j - D), D = sum_i P_i dP_i (or
        // dout . o_stored).
        dp.assign(p.size(), 0.0);
        double row = 0.0;
        for (int64_t j = base; j <= t; ++j) {
          dp[j - base] = Dot(g, v.data() + j * hd + h * d, d);
          row += p[j - base] * dp[j - base];
        }
        if (!o_stored.empty()) row = Dot(g, o_stored.data() + t * hd + h * d, d);
        for (int64_t j = base; j <= t; ++j) {
          const double pj = p[j - base];
          const double ds = pj * (dp[j - base] - row) * shape.scale;
          for (int64_t x = 0; x < d; ++x) {
            gv[j * hd + h * d + x] += pj * g[x];
            gq[t * hd + h * d + x] += ds * k[j * hd + h * d + x];
            gk[j * hd + h * d + x] += ds * q[t * hd + h * d + x];
          }
        }
      }
    }
    base += len;
  }
  for (size_t i = 0; i < gq.size(); ++i) {
    dq[i] = static_cast<float>(gq[i]);
    dk[i] = static_cast<float>(gk[i]);
    dv[i] = static_cast<float>(gv[i]);
  }
  return absl::OkStatus();
}

double MaxRelError(absl::Span<const float> got, absl::Span<const float> want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0, mag = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(a - b));
    mag = std::max(mag, std::abs(b));
  }
  return diff / std::max(mag, kRelErrFloor);
}

}  // namespace flashcp::worker
