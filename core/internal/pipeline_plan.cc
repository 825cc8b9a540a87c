// The pipeline planner and its baselines (core/pipeline.h; docs/pipeline.md,
// "Planner"): chunking (Algorithm 1 or a token cap), grouping into pipelines
// by a dynamic programme over cut points, checkpointing (greedy, none, full,
// uniform, or the injected ILP), scored by the event replay.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/internal/pipeline_internal.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

using internal::SliceWork;
using internal::StageLayers;

// A chunking: its chunks and the units the DP groups (a split document's
// chunks in forward order, or one packed chunk), with each unit's longest
// document (the 1F1B order puts longer first).
struct Chunking {
  std::vector<PipelineChunk> chunks;
  std::vector<std::vector<int32_t>> units;
  std::vector<int64_t> unit_key;
};

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

// First-fit decreasing bins of `cap` tokens (every document fits: cap >= lmax).
std::vector<std::vector<int32_t>> PackBins(const PipelineRequest& r, int64_t cap) {
  std::vector<int32_t> docs(r.doc_lens.size());
  std::iota(docs.begin(), docs.end(), 0);
  std::stable_sort(docs.begin(), docs.end(),
                   [&](int32_t a, int32_t b) { return r.doc_lens[a] > r.doc_lens[b]; });
  std::vector<std::vector<int32_t>> bins;
  std::vector<int64_t> fill;
  for (int32_t d : docs) {
    size_t b = 0;
    while (b < bins.size() && fill[b] + r.doc_lens[d] > cap) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      fill.push_back(0);
    }
    bins[b].push_back(d);
    fill[b] += r.doc_lens[d];
  }
  return bins;
}

enum class CkptMode { kGreedy, kNone, kFull, kUniform };

// One evaluated pipeline (or whole plan): its replay, or by how many bytes
// its tightest stage misses the budget.
struct Scored {
  bool fits = false;
  double time = std::numeric_limits<double>::infinity();
  double over_bytes = std::numeric_limits<double>::infinity();
  PipelinePlan plan;  // chunks, pipelines and ckpt as evaluated (own numbering)
  int32_t uniform = -1;
};

// Checkpoints and replays `plan` (pipelines and chunks set).
absl::StatusOr<Scored> Checkpoint(const PipelineRequest& r, PipelinePlan plan, CkptMode mode) {
  Scored s;
  const int32_t lp = StageLayers(r);
  const size_t nc = plan.chunks.size();
  auto uniform = [&](int32_t c) {
    plan.ckpt.assign(r.pp_size, std::vector<int32_t>(nc, c));
  };
  if (mode == CkptMode::kGreedy) {
    const internal::CkptModel m = internal::BuildCkptModel(r, plan);
    if (m.worst_over_bytes > 0) {
      s.over_bytes = m.worst_over_bytes;
      return s;
    }
    FLASHCP_ASSIGN_OR_RETURN(const CkptSolution sol, SolveCkptGreedy(m.problem));
    plan.ckpt = internal::CkptFromValues(r, plan, m, sol.values);
  } else if (mode == CkptMode::kNone) {
    uniform(0);
  } else if (mode == CkptMode::kFull) {
    uniform(lp);
  } else {
    // Smallest uniform count that fits: peak memory falls as it grows.
    int32_t lo = 0, hi = lp;
    uniform(lp);
    FLASHCP_ASSIGN_OR_RETURN(PipelineSim full, internal::ReplayPipeline(r, plan));
    if (PipelineOverBudget(r, full) > 0) {
      s.over_bytes = PipelineOverBudget(r, full);
      return s;
    }
    while (lo < hi) {
      const int32_t mid = (lo + hi) / 2;
      uniform(mid);
      FLASHCP_ASSIGN_OR_RETURN(PipelineSim sim, internal::ReplayPipeline(r, plan));
      if (PipelineOverBudget(r, sim) > 0) lo = mid + 1; else hi = mid;
    }
    uniform(lo);
    s.uniform = lo;
  }
  FLASHCP_ASSIGN_OR_RETURN(plan.prediction, internal::ReplayPipeline(r, plan));
  s.over_bytes = PipelineOverBudget(r, plan.prediction);
  s.fits = s.over_bytes <= 0;
  s.time = s.fits ? plan.prediction.iteration_s : std::numeric_limits<double>::infinity();
  s.plan = std::move(plan);
  return s;
}

// A plan of the given units as one pipeline, chunks renumbered.
PipelinePlan SubPlan(const Chunking& ch, size_t from, size_t to) {
  PipelinePlan p;
  PipelineGroup g;
  for (size_t u = from; u < to; ++u) {
    for (int32_t k : ch.units[u]) {
      g.forward.push_back(static_cast<int32_t>(p.chunks.size()));
      p.chunks.push_back(ch.chunks[k]);
    }
  }
  g.backward = internal::BackwardOrder(p.chunks, g.forward);
  p.pipelines.push_back(std::move(g));
  return p;
}

// Groups the units into back-to-back pipelines (Eq. 14): dp over at most
// kMaxCuts + 1 evenly spaced cut points (every pipeline boundary falls on
// one: the paper's solver rarely schedules more than 2 pipelines); a pipeline's cost is its replayed time under
// `mode` (pipelines do not overlap, so times add). Returns the whole plan.
absl::StatusOr<Scored> Group(const PipelineRequest& r, const Chunking& ch, CkptMode mode,
                             int32_t max_pipelines) {
  constexpr size_t kMaxCuts = 6;
  const size_t nu = ch.units.size();
  std::vector<size_t> cuts;
  const size_t q = std::min<size_t>({nu, kMaxCuts, static_cast<size_t>(max_pipelines) * 2});
  for (size_t i = 0; i <= q; ++i) cuts.push_back(i * nu / q);
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const size_t m = cuts.size();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // dp[i][g]: best time of units [0, cuts[i]) in g pipelines.
  const size_t gmax = static_cast<size_t>(max_pipelines);
  std::vector<std::vector<double>> dp(m, std::vector<double>(gmax + 1, kInf));
  std::vector<std::vector<size_t>> from(m, std::vector<size_t>(gmax + 1, 0));
  std::vector<std::vector<std::optional<Scored>>> memo(m, std::vector<std::optional<Scored>>(m));
  double least_over = kInf;
  dp[0][0] = 0;
  for (size_t i = 1; i < m; ++i) {
    for (size_t j = 0; j < i; ++j) {
      bool any = false;
      for (size_t g = 0; g < gmax; ++g) any |= dp[j][g] < kInf;
      if (!any) continue;
      FLASHCP_ASSIGN_OR_RETURN(Scored s, Checkpoint(r, SubPlan(ch, cuts[j], cuts[i]), mode));
      least_over = std::min(least_over, s.over_bytes);
      if (!s.fits) continue;
      for (size_t g = 0; g < gmax; ++g) {
        if (dp[j][g] + s.time < dp[i][g + 1]) {
          dp[i][g + 1] = dp[j][g] + s.time;
          from[i][g + 1] = j;
        }
      }
      memo[j][i] = std::move(s);
    }
  }
  size_t best_g = 0;
  for (size_t g = 1; g <= gmax; ++g) {
    if (dp[m - 1][g] < dp[m - 1][best_g]) best_g = g;
  }
  Scored out;
  if (dp[m - 1][best_g] == kInf) {
    out.over_bytes = least_over;
    return out;
  }
  // Stitch the chosen pipelines into one plan, in order.
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = m - 1, g = best_g; i > 0; --g) {
    spans.emplace_back(from[i][g], i);
    i = from[i][g];
  }
  std::reverse(spans.begin(), spans.end());
  PipelinePlan& plan = out.plan;
  plan.ckpt.assign(r.pp_size, {});
  for (const auto& [j, i] : spans) {
    const PipelinePlan& sub = memo[j][i]->plan;
    const int32_t base = static_cast<int32_t>(plan.chunks.size());
    PipelineGroup g = sub.pipelines[0];
    for (int32_t& k : g.forward) k += base;
    for (int32_t& k : g.backward) k += base;
    plan.pipelines.push_back(std::move(g));
    plan.chunks.insert(plan.chunks.end(), sub.chunks.begin(), sub.chunks.end());
    for (int32_t p = 0; p < r.pp_size; ++p) {
      plan.ckpt[p].insert(plan.ckpt[p].end(), sub.ckpt[p].begin(), sub.ckpt[p].end());
    }
  }
  FLASHCP_ASSIGN_OR_RETURN(plan.prediction, internal::ReplayPipeline(r, plan));
  out.over_bytes = PipelineOverBudget(r, plan.prediction);
  out.fits = out.over_bytes <= 0;
  out.time = plan.prediction.iteration_s;
  return out;
}

absl::Status NoFit(const PipelineRequest& r, PipelineStrategy s, double over) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "pipeline strategy %s: no plan fits memory_budget_bytes = %.0f: the closest one needs "
      "%.0f bytes (%.3f GiB) more on its tightest stage",
      PipelineStrategyName(s), r.memory_budget_bytes, over, over / (1 << 30)));
}

// The K candidates: every K to 8, then steps of about a quarter (10, 12,
// 15, 18, 22, ...) to 256, while lmax / K >= min_slice.
std::vector<int32_t> SliceCounts(int64_t lmax, int64_t min_slice) {
  std::vector<int32_t> ks{1};
  for (int32_t k = 2; k <= 256 && lmax / k >= std::max<int64_t>(min_slice, 1);
       k = std::max(k + 1, k + k / 4)) {
    ks.push_back(k);
  }
  return ks;
}

bool SameChunks(const Chunking& a, const Chunking& b) {
  if (a.units != b.units || a.chunks.size() != b.chunks.size()) return false;
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    if (a.chunks[i].kind != b.chunks[i].kind || a.chunks[i].slices != b.chunks[i].slices) return false;
  }
  return true;
}

// A lower bound on the replayed time of any grouping of `ch` (pipelines
// back to back, any checkpointing): every stage runs every chunk's forward
// and backward; the last stage starts no earlier than the first chunk's
// forward has crossed the other stages; and every stage's last op is the
// backward of the last unit's first chunk (the last pipeline's backward
// order ends with it), which then crosses the other stages again.
double LowerBound(const PipelineRequest& r, const Chunking& ch) {
  double busy = 0;
  for (const PipelineChunk& c : ch.chunks) {
    const internal::ChunkCost cost = internal::ChunkCosts(r, c);
    busy += cost.fwd_s + cost.bwd_s;
  }
  if (ch.units.empty()) return busy;
  const internal::ChunkCost first = internal::ChunkCosts(r, ch.chunks[ch.units.front().front()]);
  const internal::ChunkCost last = internal::ChunkCosts(r, ch.chunks[ch.units.back().front()]);
  return busy + (r.pp_size - 1) * (first.fwd_s + first.p2p_s + last.bwd_s + last.p2p_s);
}

absl::StatusOr<PipelinePlan> PlanSearch(const PipelineRequest& r, const PipelineOptions& o) {
  const PipelineStrategy st = o.strategy;
  const CkptMode mode = st == PipelineStrategy::kDppNoCkpt     ? CkptMode::kNone
                        : st == PipelineStrategy::kDppFullCkpt ? CkptMode::kFull
                                                               : CkptMode::kGreedy;
  const int64_t lmax = *std::max_element(r.doc_lens.begin(), r.doc_lens.end());
  Scored best;
  int32_t best_k = 0;
  double least_over = std::numeric_limits<double>::infinity();
  const std::vector<int32_t> ks =
      o.slice_count > 0 ? std::vector<int32_t>{o.slice_count} : SliceCounts(lmax, o.min_slice_tokens);
  // Chunkings per K: Algorithm 1 with no token capacity and with lmax / K,
  // and (kDpp) with no capacity and every cut document on its own mesh;
  // and the token-capped chunking (ChunkTokenCap), the only one of kDppNoWbc
  // and also a candidate of kDpp, whose search keeps whichever chunking
  // replays fastest (docs/pipeline.md, "Planner").
  struct Candidate {
    int32_t k;
    Chunking chunking;
    double bound;  // LowerBound of its plan's replayed time
  };
  std::vector<Candidate> candidates;
  auto add = [&](int32_t k, std::optional<Chunking> ch) {
    if (!ch) return;
    // Chunkings of one K often coincide (no document but the longest cut).
    for (size_t i = candidates.size(); i > 0 && candidates[i - 1].k == k; --i) {
      if (SameChunks(candidates[i - 1].chunking, *ch)) return;
    }
    candidates.push_back({k, std::move(*ch), 0});
  };
  for (int32_t k : ks) {
    FLASHCP_RETURN_IF_ERROR(o.stop.Check());
    if (st == PipelineStrategy::kDppNoWbc) {
      add(k, ChunkTokenCap(r, k));
      continue;
    }
    add(k, ChunkBalanced(r, k, 0, false));
    if (k > 1) add(k, ChunkBalanced(r, k, (lmax + k - 1) / k, false));
    if (st == PipelineStrategy::kDpp) {
      add(k, ChunkTokenCap(r, k));
      if (k > 1) add(k, ChunkBalanced(r, k, 0, true));
    }
  }
  // Best bound first; a candidate whose bound is not below the best replay
  // so far cannot win (ties keep the earlier candidate), so the search stops
  // there. The bound ignores recompute, so it prunes most without memory
  // pressure.
  for (Candidate& c : candidates) c.bound = LowerBound(r, c.chunking);
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return candidates[a].bound < candidates[b].bound; });
  size_t best_index = 0;
  for (size_t i : order) {
    FLASHCP_RETURN_IF_ERROR(o.stop.Check());
    const Candidate& c = candidates[i];
    if (o.prune_by_bound && best.fits && c.bound * (1 - 1e-9) >= best.time) break;
    FLASHCP_ASSIGN_OR_RETURN(Scored s, Group(r, c.chunking, mode, o.max_pipelines));
    least_over = std::min(least_over, s.over_bytes);
    if (s.fits && (s.time < best.time || (s.time == best.time && i < best_index))) {
      best = std::move(s);
      best_k = c.k;
      best_index = i;
    }
  }
  if (!best.fits) return NoFit(r, st, least_over);
  PipelinePlan plan = std::move(best.plan);
  plan.strategy = st;
  plan.slice_count = best_k;
  plan.ckpt_solver = mode == CkptMode::kNone ? "none" : mode == CkptMode::kFull ? "full" : "greedy";
  if (mode == CkptMode::kGreedy && o.ckpt_solver != nullptr) {
    // The exact programme over the chosen chunks and pipelines, from the
    // greedy checkpointing as its incumbent.
    const internal::CkptModel m = internal::BuildCkptModel(r, plan);
    std::vector<int32_t> start(m.problem.vars, 0);
    for (int32_t p = 0; p < r.pp_size; ++p) {
      for (size_t k = 0; k < plan.chunks.size(); ++k) {
        start[m.VarOf(r.pp_size, p, static_cast<int32_t>(k))] = plan.ckpt[p][k];
      }
    }
    // Diagonal variables are shared, so `start` holds each one's value.
    FLASHCP_ASSIGN_OR_RETURN(const CkptSolution sol, o.ckpt_solver(m.problem, start, o.ckpt, o.stop));
    PipelinePlan exact = plan;
    exact.ckpt = internal::CkptFromValues(r, plan, m, sol.values);
    FLASHCP_ASSIGN_OR_RETURN(exact.prediction, internal::ReplayPipeline(r, exact));
    // The programme minimizes its recompute estimate, not the replayed time:
    // its checkpointing is kept unless the greedy one replays faster (the
    // gap is reported either way).
    plan.ckpt_gap = sol.gap;
    plan.ckpt_optimal = sol.optimal;
    if (exact.prediction.iteration_s <= plan.prediction.iteration_s) {
      plan.ckpt = std::move(exact.ckpt);
      plan.prediction = std::move(exact.prediction);
      plan.ckpt_solver = "ilp";
    }
  }
  return plan;
}

// Batch-level and token-level PP: bins of lmax tokens, uniform checkpointing.
absl::StatusOr<PipelinePlan> PlanFixed(const PipelineRequest& r, const PipelineOptions& o) {
  const int64_t lmax = *std::max_element(r.doc_lens.begin(), r.doc_lens.end());
  const auto bins = PackBins(r, lmax);
  std::vector<int32_t> splits{1};
  if (o.strategy == PipelineStrategy::kTokenLevel) splits = {2, 4, 8, 16};
  Scored best;
  double least_over = std::numeric_limits<double>::infinity();
  for (int32_t sp : splits) {
    FLASHCP_RETURN_IF_ERROR(o.stop.Check());
    const int64_t size = (lmax + sp - 1) / sp;  // fixed slice tokens
    if (sp > 1 && size < 1) continue;
    PipelinePlan plan;
    PipelineGroup g;
    for (const auto& bin : bins) {
      if (sp == 1) {
        PipelineChunk c{ChunkKind::kPacked, {}};
        for (int32_t d : bin) c.slices.push_back(PipelineSlice{d, 0, r.doc_lens[d]});
        g.forward.push_back(static_cast<int32_t>(plan.chunks.size()));
        plan.chunks.push_back(std::move(c));
        continue;
      }
      // The packed sequence cut every `size` tokens, across documents.
      PipelineChunk c{ChunkKind::kMixed, {}};
      int64_t in_chunk = 0;
      for (int32_t d : bin) {
        for (int64_t a = 0; a < r.doc_lens[d];) {
          const int64_t len = std::min(r.doc_lens[d] - a, size - in_chunk);
          c.slices.push_back(PipelineSlice{d, a, len});
          a += len;
          in_chunk += len;
          if (in_chunk == size) {
            g.forward.push_back(static_cast<int32_t>(plan.chunks.size()));
            plan.chunks.push_back(std::move(c));
            c = PipelineChunk{ChunkKind::kMixed, {}};
            in_chunk = 0;
          }
        }
      }
      if (!c.slices.empty()) {
        g.forward.push_back(static_cast<int32_t>(plan.chunks.size()));
        plan.chunks.push_back(std::move(c));
      }
    }
    g.backward = internal::BackwardOrder(plan.chunks, g.forward);
    plan.pipelines.push_back(std::move(g));
    FLASHCP_ASSIGN_OR_RETURN(Scored s, Checkpoint(r, std::move(plan), CkptMode::kUniform));
    least_over = std::min(least_over, s.over_bytes);
    if (s.fits && s.time < best.time) {
      best = std::move(s);
      best.plan.slice_count = sp;
    }
  }
  if (!best.fits) return NoFit(r, o.strategy, least_over);
  best.plan.strategy = o.strategy;
  best.plan.ckpt_solver = "uniform";
  return std::move(best.plan);
}

}  // namespace

absl::StatusOr<PipelinePlan> PlanPipeline(const PipelineRequest& request,
                                          const PipelineOptions& options) {
  FLASHCP_ASSIGN_OR_RETURN(const PipelineRequest r, CompletePipelineRequest(request));
  if (options.min_slice_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("min_slice_tokens: must be >= 1, got ",
                                                   options.min_slice_tokens));
  }
  if (options.slice_count < 0 || options.slice_count > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("slice_count: must be in [0, 2^20], got ",
                                                   options.slice_count));
  }
  if (options.max_pipelines < 1 || options.max_pipelines > 64) {
    return absl::InvalidArgumentError(absl::StrCat("max_pipelines: must be in [1, 64], got ",
                                                   options.max_pipelines));
  }
  if (!std::isfinite(options.ckpt.time_limit_seconds) || options.ckpt.time_limit_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ckpt.time_limit_seconds: must be a finite number >= 0, got ", options.ckpt.time_limit_seconds));
  }
  if (!(options.ckpt.relative_gap >= 0 && options.ckpt.relative_gap <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt.relative_gap: must be in [0, 1], got ", options.ckpt.relative_gap));
  }
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  absl::StatusOr<PipelinePlan> plan;
  switch (options.strategy) {
    case PipelineStrategy::kBatchLevel:
    case PipelineStrategy::kTokenLevel:
      plan = PlanFixed(r, options);
      break;
    default:
      plan = PlanSearch(r, options);
  }
  if (!plan.ok()) return plan.status();
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  FLASHCP_RETURN_IF_ERROR(ValidatePipelinePlan(r, *plan));
  return plan;
}

}  // namespace flashcp::core
