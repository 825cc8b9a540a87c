#include "worker/mask_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace flashcp::worker {
namespace {

absl::Status CheckSizes(const AttentionShape& shape, absl::Span<const int64_t> doc_lens,
                        int64_t block_size,
                        std::initializer_list<std::pair<const char*, size_t>> tokens,
                        std::initializer_list<std::pair<const char*, size_t>> per_head) {
  if (shape.heads < 1 || shape.head_dim < 1) {
    return absl::InvalidArgumentError("shape: heads and head_dim must be >= 1");
  }
  if (block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block_size: must be >= 1, got ", block_size));
  }
  int64_t total = 0;
  for (int64_t len : doc_lens) {
    if (len < 1) return absl::InvalidArgumentError(absl::StrCat("doc_lens: length ", len, " < 1"));
    total += len;
  }
  const size_t rows = 2 * static_cast<size_t>(total);
  const size_t hd = static_cast<size_t>(shape.heads) * shape.head_dim;
  for (const auto& [name, size] : tokens) {
    if (size != rows * hd) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", size, " floats, expected ", rows * hd, " (2C = ", rows, " rows)"));
    }
  }
  for (const auto& [name, size] : per_head) {
    if (size != rows * shape.heads) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", size, " floats, expected ",
                                                     rows * shape.heads, " (2C = ", rows,
                                                     " rows)"));
    }
  }
  return absl::OkStatus();
}

double Dot(const float* a, const float* b, int64_t d) {
  double s = 0.0;
  for (int64_t x = 0; x < d; ++x) s += static_cast<double>(a[x]) * b[x];
  return s;
}

// Softmax probabilities of query row t over `keys` for head h.
void Probabilities(const AttentionShape& shape, const float* q, const float* k,
                   const std::vector<int64_t>& keys, int64_t t, int64_t h, std::vector<double>& p,
                   double* lse) {
  const int64_t hd = int64_t{shape.heads} * shape.head_dim, d = shape.head_dim;
  p.assign(keys.size(), 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < keys.size(); ++i) {
    p[i] = shape.scale * Dot(q + t * hd + h * d, k + keys[i] * hd + h * d, d);
    mx = std::max(mx, p[i]);
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

std::vector<int64_t> BlockDiffusionKeys(absl::Span<const int64_t> doc_lens, int64_t block_size,
                                        int64_t row) {
  int64_t total = 0;
  for (int64_t len : doc_lens) total += len;
  const bool noisy = row < total;
  const int64_t pos_in_stream = noisy ? row : row - total;
  int64_t off = 0;  // the document's first row within its copy
  size_t d = 0;
  while (pos_in_stream >= off + doc_lens[d]) off += doc_lens[d++];
  const int64_t len = doc_lens[d], pos = pos_in_stream - off, j = pos / block_size;
  std::vector<int64_t> keys;
  const int64_t clean_end = noisy ? j * block_size : std::min((j + 1) * block_size, len);
  if (noisy) {
    for (int64_t p = j * block_size; p < std::min((j + 1) * block_size, len); ++p) {
      keys.push_back(off + p);
    }
  }
  for (int64_t p = 0; p < clean_end; ++p) keys.push_back(total + off + p);
  return keys;
}

absl::Status BlockDiffusionReferenceForward(const AttentionShape& shape,
                                            absl::Span<const int64_t> doc_lens,
                                            int64_t block_size, absl::Span<const float> q,
                                            absl::Span<const float> k, absl::Span<const float> v,
                                            absl::Span<float> o, absl::Span<float> lse) {
  if (absl::Status s = CheckSizes(shape, doc_lens, block_size,
                                  {{"q", q.size()}, {"k", k.size()}, {"v", v.size()},
                                   {"o", o.size()}},
                                  {{"lse", lse.size()}});
      !s.ok()) {
    return s;
  }
  const int64_t hd = int64_t{shape.heads} * shape.head_dim, d = shape.head_dim;
  const int64_t rows = static_cast<int64_t>(q.size()) / hd;
  std::vector<double> p, acc(d);
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<int64_t> keys = BlockDiffusionKeys(doc_lens, block_size, t);
    for (int64_t h = 0; h < shape.heads; ++h) {
      double l = 0.0;
      Probabilities(shape, q.data(), k.data(), keys, t, h, p, &l);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t i = 0; i < keys.size(); ++i) {
        for (int64_t x = 0; x < d; ++x) acc[x] += p[i] * v[keys[i] * hd + h * d + x];
      }
      for (int64_t x = 0; x < d; ++x) o[t * hd + h * d + x] = static_cast<float>(acc[x]);
      lse[t * shape.heads + h] = static_cast<float>(l);
    }
  }
  return absl::OkStatus();
}

absl::Status BlockDiffusionReferenceBackward(
    const AttentionShape& shape, absl::Span<const int64_t> doc_lens, int64_t block_size,
    absl::Span<const float> q, absl::Span<const float> k, absl::Span<const float> v,
    absl::Span<const float> dout, absl::Span<float> dq, absl::Span<float> dk,
    absl::Span<float> dv) {
  if (absl::Status s = CheckSizes(shape, doc_lens, block_size,
                                  {{"q", q.size()},
                                   {"k", k.size()},
                                   {"v", v.size()},
                                   {"dout", dout.size()},
                                   {"dq", dq.size()},
                                   {"dk", dk.size()},
                                   {"dv", dv.size()}},
                                  {});
      !s.ok()) {
    return s;
  }
  const int64_t hd = int64_t{shape.heads} * shape.head_dim, d = shape.head_dim;
  const int64_t rows = static_cast<int64_t>(q.size()) / hd;
  std::vector<double> gq(q.size(), 0.0), gk(q.size(), 0.0), gv(q.size(), 0.0);
  std::vector<double> p, dp;
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<int64_t> keys = BlockDiffusionKeys(doc_lens, block_size, t);
    for (int64_t h = 0; h < shape.heads; ++h) {
      double l = 0.0;
      Probabilities(shape, q.data(), k.data(), keys, t, h, p, &l);
      const float* g = dout.data() + t * hd + h * d;
      dp.assign(p.size(), 0.0);
      double row = 0.0;
      for (size_t i = 0; i < keys.size(); ++i) {
        dp[i] = Dot(g, v.data() + keys[i] * hd + h * d, d);
        row += p[i] * dp[i];
      }
      for (size_t i = 0; i < keys.size(); ++i) {
        const int64_t j = keys[i];
        const double ds = p[i] * (dp[i] - row) * shape.scale;
        for (int64_t x = 0; x < d; ++x) {
          gv[j * hd + h * d + x] += p[i] * g[x];
          gq[t * hd + h * d + x] += ds * k[j * hd + h * d + x];
          gk[j * hd + h * d + x] += ds * q[t * hd + h * d + x];
        }
      }
    }
  }
  for (size_t i = 0; i < gq.size(); ++i) {
    dq[i] = static_cast<float>(gq[i]);
    dk[i] = static_cast<float>(gk[i]);
    dv[i] = static_cast<float>(gv[i]);
  }
  return absl::OkStatus();
}

}  // namespace flashcp::worker
