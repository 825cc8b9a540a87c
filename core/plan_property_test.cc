// Property test: on 10,000+ seeded random batches, every plan of every
// strategy but `ilp` validates, and AnalyzePlan's metrics and
// BuildCommLayout's per-rank totals equal an independent recomputation
// written here from SPEC.md alone (exact integer workloads, last shards found
// by the shard that ends its document, targeted traffic from explicit sets of
// needing ranks).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "core/analysis.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;

// The project's splitmix64 stream, with a log-uniform draw.
class Rng {
 public:
  explicit Rng(uint64_t seed) : rng_(seed) {}
  uint64_t Next() { return rng_.Next(); }
  double Uniform() { return rng_.Uniform(); }  // [0, 1)
  // Log-uniform integer in [lo, hi]: small values common, large ones present.
  int64_t LogUniform(int64_t lo, int64_t hi) {
    const double x = std::exp(std::log(static_cast<double>(lo)) +
                              Uniform() * (std::log(static_cast<double>(hi) + 1) -
                                           std::log(static_cast<double>(lo))));
    return std::clamp<int64_t>(static_cast<int64_t>(x), lo, hi);
  }

 private:
  SplitMix64Rng rng_;
};

constexpr ModelShape kShape{8, 128, 2};  // 2048 bytes per token of K (or V)

double RelErr(double a, double b) {
  return std::abs(a - b) / std::max({1.0, std::abs(a), std::abs(b)});
}

// Checks `plan` and its metrics against a recomputation from SPEC.md.
void CheckPlan(const Plan& plan, const std::string& where) {
  ASSERT_THAT(ValidatePlan(plan), IsOk()) << where;
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, kShape);
  ASSERT_THAT(m, IsOk()) << where;
  const int32_t n = plan.cp_size;
  int64_t total = 0;
  for (int64_t len : plan.doc_lens) total += len;
  const int64_t per_rank = (total + n - 1) / n;
  EXPECT_EQ(m->tokens_per_rank, per_rank) << where;
  EXPECT_EQ(m->padding, per_rank * n - total) << where;

  // Shards per document, in document order; the last shard of a document is
  // the one that ends at its length.
  std::vector<std::vector<const Shard*>> by_doc(plan.doc_lens.size());
  for (const Shard& s : plan.shards) by_doc[s.doc].push_back(&s);
  std::vector<int64_t> tokens(n, 0), nonlast(n, 0), segments(n, 0);
  std::vector<absl::int128> work(n, 0);
  std::vector<int64_t> fwd_sent(n, 0), fwd_recv(n, 0);
  int64_t cut_docs = 0, min_cut = 0;
  for (size_t d = 0; d < by_doc.size(); ++d) {
    std::vector<const Shard*>& pieces = by_doc[d];
    std::sort(pieces.begin(), pieces.end(),
              [](const Shard* a, const Shard* b) { return a->start < b->start; });
    if (pieces.size() > 1) ++cut_docs;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const Shard& s = *pieces[k];
      tokens[s.rank] += s.len;
      ++segments[s.rank];
      // Eq. 3 by summing (i + 1) over the shard's tokens, in closed form.
      work[s.rank] += absl::int128(2 * s.start + s.len + 1) * s.len / 2;
      if (pieces.size() > 1 && (min_cut == 0 || s.len < min_cut)) min_cut = s.len;
      if (s.start + s.len == plan.doc_lens[d]) continue;  // the last shard
      nonlast[s.rank] += s.len;
      // Targeted: this shard's KV goes to every other rank owning a later shard.
      std::set<int32_t> needing;
      for (size_t j = k + 1; j < pieces.size(); ++j) needing.insert(pieces[j]->rank);
      needing.erase(s.rank);
      fwd_sent[s.rank] += s.len * static_cast<int64_t>(needing.size());
      for (int32_t r : needing) fwd_recv[r] += s.len;
    }
  }
  EXPECT_EQ(m->rank_tokens, tokens) << where;
  EXPECT_EQ(m->rank_nonlast_tokens, nonlast) << where;
  EXPECT_EQ(m->rank_segments, std::vector<int32_t>(segments.begin(), segments.end())) << where;
  EXPECT_EQ(m->cut_docs, cut_docs) << where;
  EXPECT_EQ(m->min_cut_shard_len, min_cut) << where;
  absl::int128 sum = 0, max_w = 0;
  for (int32_t r = 0; r < n; ++r) {
    EXPECT_LT(RelErr(m->rank_workload[r], static_cast<double>(work[r])), 1e-12) << where;
    sum += work[r];
    max_w = std::max(max_w, work[r]);
  }
  EXPECT_LT(RelErr(m->imbalance,
                   static_cast<double>(max_w) * n / static_cast<double>(sum)),
            1e-9)
      << where;
  const int64_t max_nonlast = *std::max_element(nonlast.begin(), nonlast.end());
  EXPECT_EQ(m->max_nonlast_tokens, max_nonlast) << where;
  EXPECT_DOUBLE_EQ(m->comm_saving, 1.0 - static_cast<double>(max_nonlast) / per_rank) << where;

  // Bytes: 4 (K, V, dK, dV) * tokens * H * D * dtype * (N - 1) for the
  // all-gathers; targeted moves 2 * H * D * dtype per token sent or received.
  const int64_t per_token = int64_t{kShape.heads} * kShape.head_dim * kShape.dtype_bytes;
  const int64_t full = 4 * per_rank * per_token * (n - 1);
  const int64_t gather = 4 * max_nonlast * per_token * (n - 1);
  const SchemeBytes& fb = m->bytes[static_cast<int>(CommScheme::kFullKv)];
  const SchemeBytes& gb = m->bytes[static_cast<int>(CommScheme::kAllGather)];
  const SchemeBytes& tb = m->bytes[static_cast<int>(CommScheme::kTargeted)];
  EXPECT_EQ(fb.bottleneck, full) << where;
  EXPECT_EQ(fb.sent, std::vector<int64_t>(n, full)) << where;
  EXPECT_EQ(gb.bottleneck, gather) << where;
  EXPECT_EQ(gb.received, std::vector<int64_t>(n, gather)) << where;
  int64_t phase_bottleneck = 0;  // tokens: max over ranks of max(sent, received) in one phase
  for (int32_t r = 0; r < n; ++r) {
    const int64_t moved = 2 * per_token * (fwd_sent[r] + fwd_recv[r]);
    EXPECT_EQ(tb.sent[r], moved) << where << " rank " << r;
    EXPECT_EQ(tb.received[r], moved) << where << " rank " << r;
    phase_bottleneck = std::max({phase_bottleneck, fwd_sent[r], fwd_recv[r]});
  }
  EXPECT_EQ(tb.phase.sent_tokens, fwd_sent) << where;
  EXPECT_EQ(tb.phase.received_tokens, fwd_recv) << where;
  EXPECT_EQ(tb.phase.bottleneck_tokens, phase_bottleneck) << where;
  EXPECT_EQ(tb.phase.bottleneck_bytes, 2 * per_token * phase_bottleneck) << where;
  EXPECT_EQ(tb.bottleneck, 4 * per_token * phase_bottleneck) << where;
  EXPECT_EQ(fb.phase.bottleneck_tokens, per_rank * (n - 1)) << where;
  EXPECT_EQ(gb.phase.bottleneck_tokens, max_nonlast * (n - 1)) << where;
  EXPECT_DOUBLE_EQ(m->targeted_saving,
                   full == 0 ? 1.0
                             : 1.0 - static_cast<double>(phase_bottleneck) /
                                         static_cast<double>(per_rank * (n - 1)))
      << where;

  // The layout the workers use agrees: compacted send buffers hold exactly
  // the non-last tokens, and targeted sends sum to what each rank sends.
  absl::StatusOr<CommLayout> layout = BuildCommLayout(plan);
  ASSERT_THAT(layout, IsOk()) << where;
  for (int32_t r = 0; r < n; ++r) {
    EXPECT_EQ(layout->ranks[r].send_tokens, nonlast[r]) << where << " rank " << r;
    int64_t sent = 0;
    for (const TargetedSend& t : layout->ranks[r].targeted) sent += t.tokens;
    EXPECT_EQ(sent, fwd_sent[r]) << where << " rank " << r;
  }
}

// flashcp's minimum-shard rule (PlanOptions::min_shard_tokens = m). A cut
// shard (a shard of a document cut into several) shorter than m is a
// sliver. docs/planner.md, "When a sliver is needed", defines when one
// is needed:
//  - needed: C/N < m. Every shard lies within one rank's C/N (or fewer)
//    tokens, so every shard of a cut document is shorter than m (provable);
//  - needed by the workload bound: the plan meets R, and no plan free of
//    slivers can (LastPieceBoundExceedsR, provable);
//  - excused: the plan misses the imbalance target R. The rule yields to R:
//    flashcp keeps the least imbalanced plan it found, slivers and all (not
//    a proof that no plan meeting R without them exists);
//  - unneeded (not shown needed): every other sliver. Some are needed all
//    the same (docs [476] at N = 2, m = 128: each rank's 238 tokens hold at
//    most one shard of >= m, so a plan free of slivers is Ring's, imbalance
//    1.5); the two bounds are sufficient conditions only. Reported apart:
//    those of documents shorter than 2m (any cut of such a document leaves a
//    sliver, but that the document must be cut is not shown) and those of
//    longer documents.
// The test bounds the counts on these 10,000 batches (splitmix64 seed
// 20260608) by their values when the bounds were written, so a change that
// loses ground is seen. They rest on floating-point workload sums compared
// with bounds: exact for x86-64 builds without FMA (the project's targets);
// a compiler that fuses multiply-adds (GCC on aarch64 by default) may move a
// few.
struct MinShardStats {
  int64_t needed_plans = 0;          // plans with a sliver, C/N < m
  int64_t excused_plans = 0;         // plans with a sliver, missing R
  int64_t bound_plans = 0;           // plans meeting R with a sliver, workload bound > R
  int64_t unneeded_plans = 0;        // plans meeting R with a sliver, neither bound
  int64_t unneeded_short_docs = 0;   // their slivers of documents < 2m tokens
  int64_t unneeded_long_docs = 0;    // their slivers of documents >= 2m tokens
  int64_t missing_r = 0;             // all flashcp plans missing R, sliver or not
};
MinShardStats g_min_shard;

// True when no plan free of slivers meets R: in such a plan the rank holding
// document d's last token holds its last min(L_d, m) tokens (a last shard of
// a cut document has >= m; an uncut one is whole) plus at least
// floor(total / N) - min(L_d, m) other tokens of workload >= 1 each, so its
// workload is at least W(L_d - s, s) + floor(total / N) - s, s = min(L_d, m);
// if that exceeds R times the mean workload (plan-independent), every plan
// meeting R has a sliver. R = 1.02 compared exactly as 102 / 100.
bool LastPieceBoundExceedsR(const Batch& batch, int64_t m) {
  absl::int128 sum = 0, bound = 0;
  int64_t total = 0;
  for (int64_t len : batch.doc_lens) total += len;
  const int64_t floor_tokens = total / batch.cp_size;
  for (int64_t len : batch.doc_lens) {
    sum += absl::int128(len) * (len + 1) / 2;
    const int64_t s = std::min(len, m);
    const absl::int128 last = absl::int128(2 * (len - s) + s + 1) * s / 2;
    bound = std::max(bound, last + std::max<int64_t>(0, floor_tokens - s));
  }
  return bound * batch.cp_size * 100 > sum * 102;
}

void CheckMinShard(const Batch& batch, const Plan& plan, int64_t m) {
  std::vector<int32_t> pieces(plan.doc_lens.size(), 0);
  for (const Shard& s : plan.shards) ++pieces[s.doc];
  absl::StatusOr<PlanMetrics> metrics = AnalyzePlan(plan, kShape);
  ASSERT_THAT(metrics, IsOk());
  const bool meets_r = metrics->imbalance <= PlanOptions{}.target_imbalance;
  if (!meets_r) ++g_min_shard.missing_r;
  int64_t short_docs = 0, long_docs = 0;
  for (const Shard& s : plan.shards) {
    if (pieces[s.doc] > 1 && s.len < m) ++(batch.doc_lens[s.doc] < 2 * m ? short_docs : long_docs);
  }
  if (short_docs + long_docs == 0) return;
  int64_t total = 0;
  for (int64_t len : batch.doc_lens) total += len;
  const int64_t per_rank = (total + batch.cp_size - 1) / batch.cp_size;
  if (per_rank < m) {
    ++g_min_shard.needed_plans;
    return;
  }
  if (!meets_r) {
    ++g_min_shard.excused_plans;
    return;
  }
  if (LastPieceBoundExceedsR(batch, m)) {
    ++g_min_shard.bound_plans;
    return;
  }
  ++g_min_shard.unneeded_plans;
  g_min_shard.unneeded_short_docs += short_docs;
  g_min_shard.unneeded_long_docs += long_docs;
}

void CheckAllStrategies(const Batch& batch, const std::string& where) {
  for (Strategy s : AllStrategies()) {
    if (s == Strategy::kIlp) continue;
    absl::StatusOr<Plan> plan = MakePlan(s, batch);
    // basp plans only B equal documents with B | N (basp_test); where it
    // does, its plan meets every invariant here too.
    if (s == Strategy::kBasp && plan.status().code() == absl::StatusCode::kInvalidArgument) continue;
    ASSERT_THAT(plan, IsOk()) << where << " " << StrategyName(s);
    CheckPlan(*plan, where + " " + std::string(StrategyName(s)));
    if (s == Strategy::kFlashCp) {
      CheckMinShard(batch, *plan, PlanOptions{}.min_shard_tokens);
    }
  }
}

TEST(PlanPropertyTest, RandomBatches) {
  Rng rng(20260608);
  constexpr int kBatches = 10'000;
  for (int i = 0; i < kBatches; ++i) {
    // Skewed so the whole test stays fast: checking the targeted scheme costs
    // O(docs * (2N)^2) on Per-Doc plans, so the document count shrinks as N
    // grows, except every 500th batch, which may take the full 2,000
    // documents at up to 64 ranks. Lengths are log-uniform up to a
    // log-uniform maximum (1 to 10^6).
    const int64_t n = rng.LogUniform(1, 64);
    const int64_t max_docs =
        i % 500 == 0 ? 2000 : std::clamp<int64_t>(32'000 / (n * n), 8, 2000);
    const int64_t docs = rng.LogUniform(1, max_docs);
    const int64_t max_len = rng.LogUniform(1, 1'000'000);
    Batch batch;
    int64_t total = 0;
    for (int64_t d = 0; d < docs; ++d) {
      batch.doc_lens.push_back(rng.LogUniform(1, max_len));
      total += batch.doc_lens.back();
    }
    batch.cp_size = static_cast<int32_t>(std::min(n, total));
    CheckAllStrategies(batch, "batch " + std::to_string(i));
    if (::testing::Test::HasFailure()) break;  // one readable failure, not thousands
  }
  // Slivers of flashcp's plans by kind (see CheckMinShard).
  std::printf("min shard: plans with a sliver: %lld needed (C/N < m), %lld needed (workload "
              "bound), %lld missing R, %lld meeting R not shown needed (slivers: %lld of "
              "documents < 2m, %lld of longer ones); %lld plans missing R in all\n",
              static_cast<long long>(g_min_shard.needed_plans),
              static_cast<long long>(g_min_shard.bound_plans),
              static_cast<long long>(g_min_shard.excused_plans),
              static_cast<long long>(g_min_shard.unneeded_plans),
              static_cast<long long>(g_min_shard.unneeded_short_docs),
              static_cast<long long>(g_min_shard.unneeded_long_docs),
              static_cast<long long>(g_min_shard.missing_r));
  // Invariants: an excused plan misses R, and the kinds do not overlap.
  EXPECT_LE(g_min_shard.excused_plans, g_min_shard.missing_r);
  EXPECT_LE(g_min_shard.needed_plans + g_min_shard.excused_plans + g_min_shard.bound_plans +
                g_min_shard.unneeded_plans,
            int64_t{kBatches});
  // Bounds: flashcp's plans of these batches are no worse than when this was
  // written (plans missing R; plans and slivers not shown needed). A change
  // that improves them passes; one that loses ground fails here, and the
  // printed counts say by how much. Which kind a sliver counts under moves
  // as plans improve (a plan brought to R leaves "excused"), so the kinds
  // are printed, not bounded.
  EXPECT_LE(g_min_shard.missing_r, 2819);
  EXPECT_LE(g_min_shard.unneeded_plans, 393);
  EXPECT_LE(g_min_shard.unneeded_short_docs, 4100);
  EXPECT_LE(g_min_shard.unneeded_long_docs, 29463);
}

TEST(PlanPropertyTest, EdgeShapes) {
  CheckAllStrategies(Batch{std::vector<int64_t>(64, 1), 8}, "one-token docs");
  CheckAllStrategies(Batch{std::vector<int64_t>(7, 1), 3}, "one-token docs, padding");
  CheckAllStrategies(Batch{{131072}, 8}, "one doc filling the context");
  CheckAllStrategies(Batch{{131071}, 8}, "one doc, padding");
  CheckAllStrategies(Batch{{5, 1, 300, 2}, 1}, "N = 1");
  CheckAllStrategies(Batch{{3, 1, 4, 1, 5}, 14}, "N = total tokens");
  CheckAllStrategies(Batch{{1}, 1}, "one token");
  CheckAllStrategies(Batch{{1'000'000, 1, 1, 1}, 64}, "one huge doc and slivers");
}

}  // namespace
}  // namespace flashcp::core
