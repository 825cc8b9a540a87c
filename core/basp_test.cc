// basp (core/internal/basp.cc): its plans, its refusals, and its analyzer
// figures against the formulas of ../shared/paper/related-systems-notes.md
// section 2.2, exactly, on equal-length batches.
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/rank_groups.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int kA2a = static_cast<int>(CommScheme::kAllToAll);
constexpr int kFull = static_cast<int>(CommScheme::kFullKv);

TEST(BaspTest, ZigzagsDocumentIInsideGroupI) {
  // B = 2 documents of 8 tokens, N = 4: K = 2, T = 4; chunks of 2 tokens,
  // chunks 0 and 3 to the group's first rank, 1 and 2 to its second.
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kBasp, Batch{{8, 8}, 4});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 6, 2, 0}, Shard{0, 2, 4, 1},
                                        Shard{1, 0, 2, 2}, Shard{1, 6, 2, 2}, Shard{1, 2, 4, 3}));
  EXPECT_THAT(PlanRankGroups(*plan), ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
  // Odd T: the front chunk takes the larger half (T = 3: 2 + 1).
  plan = MakePlan(Strategy::kBasp, Batch{{6}, 2});
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 5, 1, 0}, Shard{0, 2, 3, 1}));
  EXPECT_EQ(MakePlan(Strategy::kBasp, Batch{{6}, 2})->shards, plan->shards);
  EXPECT_EQ(ParseStrategy("basp").value(), Strategy::kBasp);
  EXPECT_EQ(static_cast<int>(Strategy::kBasp), 10);
}

TEST(BaspTest, RefusesEveryOtherBatchNamingTheField) {
  EXPECT_THAT(MakePlan(Strategy::kBasp, Batch{{8, 8, 8}, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cp_size: basp gives each of the batch's B = 3 documents a "
                                 "group of N / B ranks, so B must divide N = 4")));
  EXPECT_THAT(MakePlan(Strategy::kBasp, Batch{{8, 9}, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("doc_lens: basp needs documents of equal length; doc 1 has 9 "
                                 "tokens, doc 0 has 8")));
  EXPECT_THAT(MakePlan(Strategy::kBasp, Batch{{9, 9}, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("doc_lens: basp splits each document of 9 tokens evenly over "
                                 "its group of K = 2 ranks")));
  // The batch's own checks come first.
  EXPECT_THAT(MakePlan(Strategy::kBasp, Batch{{1}, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cp_size")));
}

// Section 2.2's volumes, per rank and phase, in bytes.
int64_t Ulysses(int64_t e, int64_t d, int64_t hq, int64_t hkv, int64_t t, int64_t k) {
  return e * d * (2 * hq + 2 * hkv) * t * (k - 1) / k;
}

TEST(BaspTest, AnalyzerFiguresEqualTheFormulasExactly) {
  for (const auto& [n, b] : std::vector<std::pair<int32_t, int32_t>>{
           {8, 2}, {8, 4}, {16, 2}, {16, 4}, {32, 4}, {64, 8}, {8, 8}, {8, 1}}) {
    const int32_t k = n / b;
    const int64_t t = 64;  // tokens per rank, even
    const std::vector<int64_t> docs(b, t * k);
    const ModelShape shape{64, 128, 2, 64};  // Hkv = Hq = 64 (K, N | both), bf16
    absl::StatusOr<Plan> basp = MakePlan(Strategy::kBasp, Batch{docs, n});
    absl::StatusOr<Plan> per_doc = MakePlan(Strategy::kPerDoc, Batch{docs, n});
    ASSERT_THAT(basp, IsOk());
    ASSERT_THAT(per_doc, IsOk());
    absl::StatusOr<PlanMetrics> m = AnalyzePlan(*basp, shape, /*ranks_per_node=*/k);
    absl::StatusOr<PlanMetrics> pm = AnalyzePlan(*per_doc, shape, /*ranks_per_node=*/k);
    ASSERT_THAT(m, IsOk());
    ASSERT_THAT(pm, IsOk());
    const std::string where = absl::StrCat("N = ", n, ", B = ", b);
    // Ulysses over each group of K, and over one group of N.
    const SchemeBytes& a2a = m->bytes[kA2a];
    const int64_t want_k = Ulysses(2, 128, 64, 64, t, k);
    for (int32_t r = 0; r < n; ++r) EXPECT_EQ(a2a.phase.sent_tokens[r] * 256, want_k) << where;
    EXPECT_EQ(a2a.phase.bottleneck_bytes, want_k) << where;
    absl::StatusOr<AllToAllPhase> one =
        AllToAllTraffic(m->rank_tokens, {PlanRankGroups(*per_doc)}, shape, k);
    ASSERT_THAT(one, IsOk());
    ASSERT_EQ(PlanRankGroups(*per_doc).size(), 1u) << where;
    const int64_t want_n = Ulysses(2, 128, 64, 64, t, n);
    EXPECT_THAT(one->sent, Each(want_n / 256)) << where;
    // BASP / Ulysses = ((K-1)/K) / ((N-1)/N), as integers.
    EXPECT_EQ(want_k * (n - 1) * k, want_n * (k - 1) * n) << where;
    // Inter-node: 0 with K ranks a node; one N-group sends (N - K)/N of it.
    EXPECT_EQ(a2a.phase.inter_node_bytes, 0) << where;
    EXPECT_EQ(a2a.phase.max_inter_node_bytes, 0) << where;
    EXPECT_THAT(one->inter_sent,
                Each(2 * 128 * (2 * 64 + 2 * 64) * t * (n - k) / n / 256)) << where;
    // Per-document all-gather (full KV): per_doc over N receives T (N - 1),
    // basp within its group T (K - 1): ratio (K - 1) / (N - 1).
    std::vector<RankGroup> groups;
    for (const std::vector<int32_t>& g : PlanRankGroups(*basp)) groups.push_back({g, CommScheme::kFullKv});
    absl::StatusOr<SchemeBytes> grouped = GroupedSchemeBytes(*basp, *m, groups, shape, k);
    ASSERT_THAT(grouped, IsOk());
    const int64_t kv_row = 2 * 64 * 128 * 2;
    EXPECT_EQ(pm->bytes[kFull].phase.bottleneck_bytes, kv_row * t * (n - 1)) << where;
    EXPECT_EQ(grouped->phase.bottleneck_bytes, kv_row * t * (k - 1)) << where;
    EXPECT_EQ(grouped->phase.bottleneck_bytes * (n - 1),
              pm->bytes[kFull].phase.bottleneck_bytes * (k - 1)) << where;
    EXPECT_EQ(grouped->phase.inter_node_bytes, 0) << where;
    // Targeted stays in the group too.
    EXPECT_EQ(m->bytes[static_cast<int>(CommScheme::kTargeted)].phase.inter_node_bytes, 0) << where;
    EXPECT_LT(m->imbalance, 1.0 + 1e-9) << where;
    EXPECT_LE(static_cast<int64_t>(basp->shards.size()),
              MaxPlanShards(Strategy::kBasp, Batch{docs, n})) << where;
  }
}

TEST(BaspTest, PaperExampleRatios) {
  // N = 8, B = 2, K = 4: Ulysses ratio (3/4)/(7/8) = 6/7 = 0.857; KV 3/7.
  absl::StatusOr<Plan> basp = MakePlan(Strategy::kBasp, Batch{{4096, 4096}, 8});
  absl::StatusOr<Plan> per_doc = MakePlan(Strategy::kPerDoc, Batch{{4096, 4096}, 8});
  ASSERT_THAT(basp, IsOk());
  ASSERT_THAT(per_doc, IsOk());
  const ModelShape shape{32, 128, 2};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*basp, shape, 4);
  absl::StatusOr<PlanMetrics> pm = AnalyzePlan(*per_doc, shape, 4);
  ASSERT_THAT(m, IsOk());
  ASSERT_THAT(pm, IsOk());
  EXPECT_EQ(m->bytes[kA2a].phase.bottleneck_bytes * 7, pm->bytes[kA2a].phase.bottleneck_bytes * 6);
  // Ulysses over N with G = 4 a node: (N - G)/N = 4/8 of it crosses the NIC.
  EXPECT_EQ(pm->bytes[kA2a].phase.max_inter_node_bytes * 7,
            pm->bytes[kA2a].phase.bottleneck_bytes * 4);
  EXPECT_EQ(m->bytes[kA2a].phase.max_inter_node_bytes, 0);
}

}  // namespace
}  // namespace flashcp::core
