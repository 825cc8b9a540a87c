// The pipeline planner's chunkings (core/internal/pipeline_chunking.h;
// docs/pipeline.md, "Planner"): Algorithm 1 over a work-balanced mesh, or a
// token cap; short documents and tails fill buckets, one chunk each.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "core/internal/pipeline_chunking.h"
#include "core/internal/pipeline_internal.h"

namespace flashcp::core::internal {
namespace {

// A bucket becomes one chunk: an optional tail slice plus whole documents.
struct Bucket {
  std::optional<PipelineSlice> tail;
  std::vector<int32_t> docs;
  double time = 0;
  int64_t tokens = 0;
};

// Builds the chunks: every document's non-tail slices as split chunks, then
// the buckets; units sorted by key, longest first (ties: first document).
Chunking Assemble(const PipelineRequest& r, const std::vector<std::vector<PipelineSlice>>& cut,
                  const std::vector<Bucket>& buckets) {
  Chunking out;
  std::vector<int32_t> tail_bucket(r.doc_lens.size(), -1);
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b].tail) tail_bucket[buckets[b].tail->doc] = static_cast<int32_t>(b);
  }
  std::vector<int32_t> bucket_chunk(buckets.size(), -1);
  auto add_bucket = [&](size_t b) {
    const Bucket& bk = buckets[b];
    PipelineChunk c;
    if (bk.tail) c.slices.push_back(*bk.tail);
    for (int32_t d : bk.docs) c.slices.push_back(PipelineSlice{d, 0, r.doc_lens[d]});
    c.kind = !bk.tail ? ChunkKind::kPacked : bk.docs.empty() ? ChunkKind::kSplit : ChunkKind::kHybrid;
    out.chunks.push_back(std::move(c));
    bucket_chunk[b] = static_cast<int32_t>(out.chunks.size()) - 1;
    return bucket_chunk[b];
  };
  std::vector<std::pair<int64_t, size_t>> keyed;  // (key, unit)
  for (size_t d = 0; d < cut.size(); ++d) {
    if (cut[d].size() < 2) continue;
    std::vector<int32_t> unit;
    for (size_t i = 0; i + 1 < cut[d].size(); ++i) {
      out.chunks.push_back(PipelineChunk{ChunkKind::kSplit, {cut[d][i]}});
      unit.push_back(static_cast<int32_t>(out.chunks.size()) - 1);
    }
    unit.push_back(add_bucket(tail_bucket[d]));
    out.units.push_back(std::move(unit));
    out.unit_key.push_back(r.doc_lens[d]);
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b].tail) continue;
    int64_t key = 0;
    for (int32_t d : buckets[b].docs) key = std::max(key, r.doc_lens[d]);
    out.units.push_back({add_bucket(b)});
    out.unit_key.push_back(key);
  }
  std::vector<size_t> order(out.units.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return out.unit_key[a] > out.unit_key[b]; });
  Chunking sorted;
  sorted.chunks = std::move(out.chunks);
  for (size_t u : order) {
    sorted.units.push_back(std::move(out.units[u]));
    sorted.unit_key.push_back(out.unit_key[u]);
  }
  return sorted;
}

// Boundaries [0, ..., len] cutting `len` tokens into `k` slices of equal
// forward + backward work (later slices are shorter: more context), each at
// most `capacity` tokens after the previous one (0: no cap; more slices
// follow while the rest exceeds it). Empty when k leaves a slice empty.
std::optional<std::vector<int64_t>> WorkMesh(const PipelineRequest& r, int64_t len, int32_t k,
                                             int64_t capacity) {
  const double total = SliceWork(r, 0, len);
  std::vector<int64_t> mesh{0};
  for (int32_t i = 1; i < k; ++i) {
    const double target = total * i / k;
    int64_t lo = mesh.back() + 1, hi = len;  // smallest x with work(0, x) >= target
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (SliceWork(r, 0, mid) >= target) hi = mid; else lo = mid + 1;
    }
    if (capacity > 0) lo = std::min(lo, mesh.back() + capacity);
    if (lo >= len) return std::nullopt;
    mesh.push_back(lo);
  }
  while (capacity > 0 && len - mesh.back() > capacity) mesh.push_back(mesh.back() + capacity);
  mesh.push_back(len);
  return mesh;
}
}  // namespace

// Algorithm 1 (workload-balanced chunking) for slice count K of the longest
// document, with token capacity C (the algorithm's "token capacity" input;
// 0: none). The mesh gives the longest document's slices equal forward +
// backward work (WorkMesh). Under causal attention the work-balanced first
// slice is long (about lmax / sqrt(K) tokens when pairs dominate), and its
// activations with it; C = lmax / K makes the mesh equal-token (the
// work-balanced boundaries all lie at or beyond i lmax / K). Longer
// documents are cut along that mesh; with `per_doc_mesh` each instead gets
// its own work-balanced mesh of ceil(len / T_m) slices under the same cap
// T_m (the longest slice of the longest document's mesh), so a document
// just over T_m becomes two similar slices instead of a full one and a
// short tail. Empty when K leaves a mesh slice empty.
std::optional<Chunking> ChunkBalanced(const PipelineRequest& r, int32_t k, int64_t capacity,
                                      bool per_doc_mesh) {
  const int64_t lmax = *std::max_element(r.doc_lens.begin(), r.doc_lens.end());
  const std::optional<std::vector<int64_t>> lmax_mesh = WorkMesh(r, lmax, k, capacity);
  if (!lmax_mesh) return std::nullopt;
  const std::vector<int64_t>& mesh = *lmax_mesh;
  double t_target = 0;
  int64_t t_cap = 0;
  for (size_t i = 0; i + 1 < mesh.size(); ++i) {
    t_target = std::max(t_target, SliceWork(r, mesh[i], mesh[i + 1] - mesh[i]));
    t_cap = std::max(t_cap, mesh[i + 1] - mesh[i]);
  }
  // Documents longer than the cap are cut; each leaves a tail.
  std::vector<std::vector<PipelineSlice>> cut(r.doc_lens.size());
  std::vector<Bucket> buckets;
  std::vector<int32_t> shorts;
  for (size_t d = 0; d < r.doc_lens.size(); ++d) {
    const int64_t len = r.doc_lens[d];
    if (len <= t_cap) {
      shorts.push_back(static_cast<int32_t>(d));
      continue;
    }
    std::optional<std::vector<int64_t>> own;
    if (per_doc_mesh && len < lmax) {
      own = WorkMesh(r, len, static_cast<int32_t>((len + t_cap - 1) / t_cap), t_cap);
    }
    const std::vector<int64_t>& m = own ? *own : mesh;
    for (size_t i = 0; i + 1 < m.size() && m[i] < len; ++i) {
      const int64_t end = std::min(m[i + 1], len);
      cut[d].push_back(PipelineSlice{static_cast<int32_t>(d), m[i], end - m[i]});
    }
    const PipelineSlice tail = cut[d].back();
    buckets.push_back(Bucket{tail, {}, SliceWork(r, tail.start, tail.len), tail.len});
  }
  // Short documents, most work first, best-fit by long-material share.
  std::stable_sort(shorts.begin(), shorts.end(),
                   [&](int32_t a, int32_t b) { return r.doc_lens[a] > r.doc_lens[b]; });
  std::vector<size_t> order;
  for (int32_t d : shorts) {
    const int64_t s = r.doc_lens[d];
    const double t = SliceWork(r, 0, s);
    int64_t min_tokens = std::numeric_limits<int64_t>::max();
    for (const Bucket& b : buckets) min_tokens = std::min(min_tokens, b.tokens);
    if (buckets.empty() || min_tokens + s > t_cap) {
      buckets.push_back(Bucket{std::nullopt, {d}, t, s});
      continue;
    }
    order.resize(buckets.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return buckets[a].time * buckets[b].tokens < buckets[b].time * buckets[a].tokens;
    });
    std::optional<size_t> pick;
    for (size_t b : order) {
      if (buckets[b].time + t <= t_target && buckets[b].tokens + s <= t_cap) {
        pick = b;
        break;
      }
    }
    if (!pick) {
      // Loosen the time target to the least-loaded bucket that fits by tokens.
      for (size_t b : order) {
        if (buckets[b].tokens + s <= t_cap && (!pick || buckets[b].time < buckets[*pick].time)) pick = b;
      }
      t_target = buckets[*pick].time + t;
    }
    Bucket& b = buckets[*pick];
    b.docs.push_back(d);
    b.time += t;
    b.tokens += s;
  }
  return Assemble(r, cut, buckets);
}

// DPP without balanced chunking: slices of ceil(lmax / K) tokens, short
// documents and tails first-fit by tokens (one tail per chunk).
std::optional<Chunking> ChunkTokenCap(const PipelineRequest& r, int32_t k) {
  const int64_t lmax = *std::max_element(r.doc_lens.begin(), r.doc_lens.end());
  if (k > lmax) return std::nullopt;
  const int64_t cap = (lmax + k - 1) / k;
  std::vector<std::vector<PipelineSlice>> cut(r.doc_lens.size());
  std::vector<Bucket> buckets;
  std::vector<int32_t> shorts;
  for (size_t d = 0; d < r.doc_lens.size(); ++d) {
    const int64_t len = r.doc_lens[d];
    if (len <= cap) {
      shorts.push_back(static_cast<int32_t>(d));
      continue;
    }
    for (int64_t a = 0; a < len; a += cap) {
      cut[d].push_back(PipelineSlice{static_cast<int32_t>(d), a, std::min(cap, len - a)});
    }
    const PipelineSlice tail = cut[d].back();
    buckets.push_back(Bucket{tail, {}, 0, tail.len});
  }
  std::stable_sort(shorts.begin(), shorts.end(),
                   [&](int32_t a, int32_t b) { return r.doc_lens[a] > r.doc_lens[b]; });
  for (int32_t d : shorts) {
    bool placed = false;
    for (Bucket& b : buckets) {
      if (b.tokens + r.doc_lens[d] <= cap) {
        b.docs.push_back(d);
        b.tokens += r.doc_lens[d];
        placed = true;
        break;
      }
    }
    if (!placed) buckets.push_back(Bucket{std::nullopt, {d}, 0, r.doc_lens[d]});
  }
  return Assemble(r, cut, buckets);
}

}  // namespace flashcp::core::internal
