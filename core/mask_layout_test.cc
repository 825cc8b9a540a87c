// The block-diffusion exchange layout (core/mask_layout.h): each rank is sent
// exactly the remote K/V its queries attend to, as ComputeMaskTraffic counts.
#include "core/mask_layout.h"

#include <set>
#include <tuple>
#include <vector>

#include "core/analysis.h"
#include "core/mask.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::testing::ElementsAre;

Plan MustPlan(Strategy strategy, const Batch& batch, int64_t b) {
  PlanOptions options;
  options.attention_mask = {MaskKind::kBlockDiffusion, b};
  absl::StatusOr<Plan> plan = MakePlan(strategy, batch, options);
  EXPECT_THAT(plan, IsOk());
  return *plan;
}

// Checks the layout of `plan` against a token-by-token recomputation of
// what every rank's shards need (AppendNeededKv) and against
// ComputeMaskTraffic. Returns the number of checked tokens.
int64_t CheckLayout(const Plan& plan) {
  absl::StatusOr<CommLayout> layout = BuildCommLayout(plan);
  EXPECT_THAT(layout, IsOk());
  if (!layout.ok()) return 0;
  const int32_t n = plan.cp_size;
  const MaskTraffic traffic = ComputeMaskTraffic(plan);
  // (doc, pos) -> owner.
  std::vector<std::vector<int32_t>> owner(plan.doc_lens.size());
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) owner[d].assign(plan.doc_lens[d], -1);
  for (const Shard& s : plan.shards)
    for (int64_t t = s.start; t < s.start + s.len; ++t) owner[s.doc][t] = s.rank;
  int64_t checked = 0;
  for (int32_t dest = 0; dest < n; ++dest) {
    std::set<std::pair<int32_t, int64_t>> want;
    for (const Shard& s : plan.shards) {
      if (s.rank != dest) continue;
      std::vector<DocRange> need;
      AppendNeededKv(plan, s, need);
      for (const DocRange& r : need)
        for (int64_t t = r.begin; t < r.end; ++t)
          if (owner[r.doc][t] != dest) want.emplace(r.doc, t);
    }
    std::set<std::pair<int32_t, int64_t>> got;
    for (int32_t src = 0; src < n; ++src) {
      const RankLayout& rl = layout->ranks[src];
      int64_t pair = 0;
      for (const TargetedSend& t : rl.targeted) {
        if (t.dest != dest) continue;
        EXPECT_NE(src, dest);
        int64_t tokens = 0;
        for (int32_t si : t.send_indices) {
          const SendRange& r = rl.send[si];
          const Shard& s = plan.shards[r.shard];
          EXPECT_EQ(s.rank, src);
          EXPECT_GE(r.skip, 0);
          EXPECT_LE(r.skip + r.len, s.len);
          for (int64_t x = 0; x < r.len; ++x) {
            EXPECT_TRUE(got.emplace(s.doc, s.start + r.skip + x).second) << "sent twice";
          }
          tokens += r.len;
        }
        EXPECT_EQ(tokens, t.tokens);
        pair += tokens;
      }
      EXPECT_EQ(pair, traffic.pair_tokens[static_cast<size_t>(src) * n + dest]);
    }
    EXPECT_EQ(got, want) << "rank " << dest;
    checked += static_cast<int64_t>(want.size());
  }
  for (int32_t r = 0; r < n; ++r) {
    const RankLayout& rl = layout->ranks[r];
    EXPECT_EQ(rl.send_tokens, traffic.needed_elsewhere_tokens[r]);
    int64_t offset = 0;
    for (const SendRange& s : rl.send) {
      EXPECT_EQ(s.offset, offset);
      offset += s.len;
    }
    EXPECT_EQ(offset, rl.send_tokens);
  }
  for (const std::vector<DocPiece>& pieces : layout->docs)
    for (const DocPiece& p : pieces) EXPECT_EQ(p.send_index, -1);
  return checked;
}

// One 16-token document, b = 4, at N = 2 under llama3 (4 chunks of the 32
// rows, zigzag): rank 0 holds noisy [0, 8) and clean [8, 16), rank 1 noisy
// [8, 16) and clean [0, 8). Rank 1's noisy blocks 2, 3 need clean [0, 12):
// it has [0, 8) and receives [8, 12) from rank 0; rank 0's noisy block 1
// needs clean [0, 4), its clean shard clean [0, 16): it receives [0, 8).
TEST(MaskLayoutTest, OneDocumentByHand) {
  const Plan plan = MustPlan(Strategy::kLlama3, Batch{{16}, 2}, 4);
  ASSERT_THAT(plan.shards,
              ElementsAre(Shard{0, 0, 8, 0}, Shard{1, 8, 8, 0}, Shard{0, 8, 8, 1},
                          Shard{1, 0, 8, 1}));
  absl::StatusOr<CommLayout> layout = BuildCommLayout(plan);
  ASSERT_THAT(layout, IsOk());
  const RankLayout& r0 = layout->ranks[0];
  ASSERT_EQ(r0.send.size(), 1u);
  EXPECT_EQ(r0.send[0].shard, 1);
  EXPECT_EQ(r0.send[0].skip, 0);
  EXPECT_EQ(r0.send[0].len, 4);
  ASSERT_EQ(r0.targeted.size(), 1u);
  EXPECT_EQ(r0.targeted[0].dest, 1);
  EXPECT_EQ(r0.targeted[0].tokens, 4);
  const RankLayout& r1 = layout->ranks[1];
  ASSERT_EQ(r1.send.size(), 1u);
  EXPECT_EQ(r1.send[0].shard, 3);
  EXPECT_EQ(r1.send[0].len, 8);
  EXPECT_EQ(r1.targeted[0].dest, 0);
  EXPECT_EQ(r1.targeted[0].tokens, 8);
  EXPECT_GT(CheckLayout(plan), 0);
}

// Every strategy that plans under the mask, on random packed batches with
// long, short and one-token documents: exactly the needed tokens travel.
TEST(MaskLayoutTest, RandomBatchesSendExactlyWhatIsNeeded) {
  SplitMix64Rng rng(25);
  int64_t checked = 0;
  int plans = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const int32_t n = 1 + static_cast<int32_t>(rng.Next() % 6);
    const int64_t b = std::vector<int64_t>{1, 2, 3, 4, 16}[rng.Next() % 5];
    std::vector<int64_t> lens;
    const int docs = 1 + static_cast<int>(rng.Next() % 6);
    for (int d = 0; d < docs; ++d) {
      const uint64_t kind = rng.Next() % 3;
      lens.push_back(kind == 0 ? 1 : kind == 1 ? 1 + rng.Next() % 9 : 10 + rng.Next() % 70);
    }
    if (TotalTokens(lens) < n) lens.push_back(n);  // a batch holds at least N tokens
    for (Strategy strategy : AllStrategies()) {
      const AttentionMask mask{MaskKind::kBlockDiffusion, b};
      if (!PlansMask(strategy, mask)) continue;
      SCOPED_TRACE(::testing::PrintToString(lens) + " N=" + std::to_string(n) +
                   " b=" + std::to_string(b) + " " + std::string(StrategyName(strategy)));
      PlanOptions options;
      options.attention_mask = mask;
      absl::StatusOr<Plan> plan = MakePlan(strategy, Batch{lens, n}, options);
      // csbp refuses batches with fewer blocks than ranks.
      if (strategy == Strategy::kCsbp &&
          plan.status().code() == absl::StatusCode::kFailedPrecondition) {
        continue;
      }
      ASSERT_THAT(plan, IsOk());
      checked += CheckLayout(*plan);
      ++plans;
    }
  }
  EXPECT_GT(plans, 1000);
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace flashcp::core
