#include "core/mask.h"

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/echo.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

// Sum over queries i in [start, start + len) of f(i / b), where f(j) is the
// keys of a query of block j and, for every block but the range's first and
// last, f(j) = b (j + 1) (a full interior block: own block b plus prefix jb
// for a noisy query, (j + 1) b for a clean one). Exact in 128 bits.
template <typename F>
double BlockRangeSum(int64_t b, int64_t start, int64_t len, F f) {
  if (len <= 0) return 0.0;
  const int64_t end = start + len;
  const int64_t j0 = start / b, j1 = (end - 1) / b;
  if (j0 == j1) return static_cast<double>(absl::int128(len) * f(j0));
  absl::int128 sum = absl::int128(b * (j0 + 1) - start) * f(j0) +
                     absl::int128(end - j1 * b) * f(j1);
  // Interior blocks j0+1 .. j1-1: b * b (j + 1) each; sum of (j + 1) over
  // them is T(j1) - T(j0 + 1) with T(k) = k (k + 1) / 2.
  const auto tri = [](int64_t k) { return absl::int128(k) * (k + 1) / 2; };
  sum += absl::int128(b) * b * (tri(j1) - tri(j0 + 1));
  return static_cast<double>(sum);
}

}  // namespace

absl::string_view MaskKindName(MaskKind kind) {
  switch (kind) {
    case MaskKind::kCausalDocument:
      return "causal_document";
    case MaskKind::kBlockDiffusion:
      return "block_diffusion";
  }
  return "unknown";
}

absl::StatusOr<MaskKind> ParseMaskKind(absl::string_view name) {
  if (name.empty() || name == MaskKindName(MaskKind::kCausalDocument)) {
    return MaskKind::kCausalDocument;
  }
  if (name == MaskKindName(MaskKind::kBlockDiffusion)) return MaskKind::kBlockDiffusion;
  return absl::InvalidArgumentError(absl::StrCat("attention_mask: unknown mask ", Echo(name),
                                                 " (causal_document, block_diffusion)"));
}

absl::Status ValidateAttentionMask(const AttentionMask& mask) {
  switch (mask.kind) {
    case MaskKind::kCausalDocument:
      if (mask.block_size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("block_size: only with attention_mask block_diffusion, got ",
                         mask.block_size, " with causal_document"));
      }
      return absl::OkStatus();
    case MaskKind::kBlockDiffusion:
      if (mask.block_size < 1 || mask.block_size > kMaxBlockSize) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block_size: must be in [1, 2^40] with attention_mask block_diffusion, got ",
            mask.block_size));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("attention_mask: unknown mask id ", static_cast<int>(mask.kind)));
}

Batch PlanBatch(const Batch& batch, const AttentionMask& mask) {
  if (!IsBlockDiffusion(mask)) return batch;
  Batch out;
  out.cp_size = batch.cp_size;
  out.doc_lens.reserve(2 * batch.doc_lens.size());
  out.doc_lens = batch.doc_lens;
  out.doc_lens.insert(out.doc_lens.end(), batch.doc_lens.begin(), batch.doc_lens.end());
  return out;
}

double NoisyRangeWorkload(int64_t doc_len, int64_t b, int64_t start, int64_t len) {
  return BlockRangeSum(b, start, len, [&](int64_t j) {
    return absl::int128(std::min(b, doc_len - j * b)) + absl::int128(j) * b;
  });
}

double CleanRangeWorkload(int64_t doc_len, int64_t b, int64_t start, int64_t len) {
  return BlockRangeSum(b, start, len,
                       [&](int64_t j) { return absl::int128(std::min((j + 1) * b, doc_len)); });
}

double BlockDiffusionDocWorkload(int64_t doc_len, int64_t b) {
  return NoisyRangeWorkload(doc_len, b, 0, doc_len) + CleanRangeWorkload(doc_len, b, 0, doc_len);
}

double MaskedShardWorkload(const Plan& plan, const Shard& s) {
  if (!IsBlockDiffusion(plan.mask)) return ShardWorkload(s.start, s.len);
  const int64_t len = plan.doc_lens[s.doc];
  const int64_t b = plan.mask.block_size;
  return IsNoisyDoc(plan, s.doc) ? NoisyRangeWorkload(len, b, s.start, s.len)
                                 : CleanRangeWorkload(len, b, s.start, s.len);
}

void AppendNeededKv(const Plan& plan, const Shard& s, std::vector<DocRange>& out) {
  const int64_t end = s.start + s.len;
  if (!IsBlockDiffusion(plan.mask)) {
    out.push_back(DocRange{s.doc, 0, end});
    return;
  }
  const int64_t b = plan.mask.block_size;
  const int64_t len = plan.doc_lens[s.doc];
  const int64_t block_end = std::min((end + b - 1) / b * b, len);
  const int32_t n = static_cast<int32_t>(plan.doc_lens.size() / 2);
  if (IsNoisyDoc(plan, s.doc)) {
    out.push_back(DocRange{s.doc, s.start / b * b, block_end});
    const int64_t last_block = (end - 1) / b;
    if (last_block > 0) out.push_back(DocRange{s.doc + n, 0, last_block * b});
  } else {
    out.push_back(DocRange{s.doc, 0, block_end});
  }
}

void ForEachNeededRemote(const Plan& plan,
                         const std::function<void(int32_t dest, int32_t shard, int64_t begin,
                                                  int64_t end)>& f) {
  const int32_t n = plan.cp_size;
  const size_t docs = plan.doc_lens.size();
  // Pieces of each plan document by start (CSR).
  std::vector<int32_t> begin(docs + 1, 0), pieces(plan.shards.size());
  for (const Shard& s : plan.shards) ++begin[s.doc + 1];
  std::partial_sum(begin.begin(), begin.end(), begin.begin());
  {
    std::vector<int32_t> fill(begin.begin(), begin.end() - 1);
    for (size_t i = 0; i < plan.shards.size(); ++i) {
      pieces[fill[plan.shards[i].doc]++] = static_cast<int32_t>(i);
    }
  }
  for (size_t d = 0; d < docs; ++d) {
    std::sort(pieces.begin() + begin[d], pieces.begin() + begin[d + 1],
              [&](int32_t a, int32_t b) { return plan.shards[a].start < plan.shards[b].start; });
  }
  std::vector<DocRange> need;
  size_t i = 0;
  for (int32_t r = 0; r < n; ++r) {
    need.clear();
    for (; i < plan.shards.size() && plan.shards[i].rank == r; ++i) {
      AppendNeededKv(plan, plan.shards[i], need);
    }
    std::sort(need.begin(), need.end(), [](const DocRange& a, const DocRange& b) {
      return std::tie(a.doc, a.begin) < std::tie(b.doc, b.begin);
    });
    size_t k = 0;
    while (k < need.size()) {
      // Merge the ranges of one document that overlap or touch.
      const int32_t doc = need[k].doc;
      const int64_t lo = need[k].begin;
      int64_t hi = need[k].end;
      for (++k; k < need.size() && need[k].doc == doc && need[k].begin <= hi; ++k) {
        hi = std::max(hi, need[k].end);
      }
      // First piece ending after lo.
      auto first = std::partition_point(
          pieces.begin() + begin[doc], pieces.begin() + begin[doc + 1], [&](int32_t p) {
            return plan.shards[p].start + plan.shards[p].len <= lo;
          });
      for (auto it = first; it != pieces.begin() + begin[doc + 1]; ++it) {
        const Shard& s = plan.shards[*it];
        if (s.start >= hi) break;
        if (s.rank == r) continue;
        f(r, *it, std::max(lo, s.start), std::min(hi, s.start + s.len));
      }
    }
  }
}

MaskTraffic ComputeMaskTraffic(const Plan& plan) {
  const int32_t n = plan.cp_size;
  const bool bd = IsBlockDiffusion(plan.mask);
  MaskTraffic t;
  t.sent_tokens.assign(n, 0);
  t.received_tokens.assign(n, 0);
  t.clean_sent_tokens.assign(n, 0);
  t.clean_received_tokens.assign(n, 0);
  t.needed_elsewhere_tokens.assign(n, 0);
  t.clean_needed_elsewhere_tokens.assign(n, 0);
  t.pair_tokens.assign(static_cast<size_t>(n) * n, 0);
  t.shard_dests.assign(plan.shards.size(), {});
  const auto is_clean = [&](int32_t doc) { return bd && !IsNoisyDoc(plan, doc); };
  // Per shard, the parts of it other ranks need (for the compacted buffer).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> covered(plan.shards.size());
  ForEachNeededRemote(plan, [&](int32_t r, int32_t p, int64_t a, int64_t e) {
    const Shard& s = plan.shards[p];
    const int64_t tokens = e - a;
    t.received_tokens[r] += tokens;
    t.sent_tokens[s.rank] += tokens;
    t.pair_tokens[static_cast<size_t>(s.rank) * n + r] += tokens;
    if (is_clean(s.doc)) {
      t.clean_received_tokens[r] += tokens;
      t.clean_sent_tokens[s.rank] += tokens;
    }
    covered[p].emplace_back(a, e);
    std::vector<int32_t>& dests = t.shard_dests[p];
    if (dests.empty() || dests.back() != r) dests.push_back(r);  // r ascending
  });
  for (size_t p = 0; p < plan.shards.size(); ++p) {
    std::vector<std::pair<int64_t, int64_t>>& c = covered[p];
    if (c.empty()) continue;
    std::sort(c.begin(), c.end());
    int64_t tokens = 0, lo = c[0].first, hi = c[0].second;
    for (size_t k = 1; k < c.size(); ++k) {
      if (c[k].first > hi) {
        tokens += hi - lo;
        lo = c[k].first;
      }
      hi = std::max(hi, c[k].second);
    }
    tokens += hi - lo;
    const Shard& s = plan.shards[p];
    t.needed_elsewhere_tokens[s.rank] += tokens;
    if (is_clean(s.doc)) t.clean_needed_elsewhere_tokens[s.rank] += tokens;
  }
  return t;
}

absl::Status ValidatePlanMask(const Plan& plan) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionMask(plan.mask));
  if (!IsBlockDiffusion(plan.mask)) return absl::OkStatus();
  const size_t total = plan.doc_lens.size();
  if (total % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "doc_lens: a block_diffusion plan lists 2n documents (n noisy copies, then their n "
        "clean copies), got ",
        total));
  }
  const size_t n = total / 2;
  for (size_t d = 0; d < n; ++d) {
    if (plan.doc_lens[d] != plan.doc_lens[n + d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "doc_lens[", n + d, "]: the clean copy of document ", d, " has ", plan.doc_lens[n + d],
          " tokens, its noisy copy ", plan.doc_lens[d]));
    }
  }
  return absl::OkStatus();
}

int64_t CutNoisyBlocks(const Plan& plan) {
  if (!IsBlockDiffusion(plan.mask)) return 0;
  const int64_t b = plan.mask.block_size;
  int64_t cut = 0;
  // A cut at token x (x > 0, the start of a shard) splits a block iff b does
  // not divide x; adjacent shards of a valid plan sit on different ranks.
  for (const Shard& s : plan.shards) {
    if (IsNoisyDoc(plan, s.doc) && s.start > 0 && s.start % b != 0) ++cut;
  }
  return cut;
}

}  // namespace flashcp::core
