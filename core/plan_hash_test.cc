#include "core/plan_hash.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/strategies.h"
#include "core/testing/plans.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::HeadTailPlan;
using ::flashcp::core::testing::IsOk;

// docs [5, 3], N = 2, the ring plan of plan_json_test's hand-worked example.
Plan RingPlan() {
  return Plan{2, {5, 3}, 0, {Shard{0, 0, 4, 0}, Shard{0, 4, 1, 1}, Shard{1, 0, 3, 1}}, {}};
}

// One document of 5 tokens on 3 ranks: C/N = 2, one padding token on rank 2.
Plan PaddedPlan() {
  return Plan{3, {5}, 1, {Shard{0, 0, 2, 0}, Shard{0, 2, 2, 1}, Shard{0, 4, 1, 2}}, {}};
}

TEST(Fnv1a64Test, PublishedVectors) {
  // The FNV reference vectors (draft-eastlake-fnv, test suite).
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(PlanHashBytesTest, CanonicalEncodingOfAHandMadePlan) {
  // Prefix, then cp_size 2, padding 0, 2 documents [6, 2], 3 shards of
  // (doc, start, len, rank): 16 + 8 * (2 + 1 + 2 + 1 + 12) = 160 bytes.
  const std::string bytes = PlanHashBytes(HeadTailPlan());
  ASSERT_EQ(bytes.size(), 160u);
  EXPECT_EQ(bytes.substr(0, 16), std::string("flashcp.plan.v1\0", 16));
  const auto int64_at = [&bytes](size_t i) {
    uint64_t u = 0;
    for (int b = 7; b >= 0; --b) u = (u << 8) | static_cast<uint8_t>(bytes[16 + 8 * i + b]);
    return static_cast<int64_t>(u);
  };
  std::vector<int64_t> ints;
  for (size_t i = 0; i < 18; ++i) ints.push_back(int64_at(i));
  EXPECT_THAT(ints, ::testing::ElementsAre(2, 0, 2, 6, 2, 3, 0, 2, 4, 0, 0, 0, 2, 1, 1, 0, 2, 1));
  // Little-endian: the low byte of cp_size first.
  EXPECT_EQ(bytes[16], '\x02');
  EXPECT_EQ(bytes[17], '\0');
}

TEST(PlanHashTest, PinnedValuesOfHandMadePlans) {
  // Worked out independently (a Python FNV-1a over the same bytes); a change
  // here changes every plan's hash, so it needs a new kPlanHashPrefix.
  EXPECT_EQ(PlanHashHex(PlanHash(HeadTailPlan())), "9f2e867e53569aee");
  EXPECT_EQ(PlanHashHex(PlanHash(RingPlan())), "acb8cc4eb63dfe48");
  EXPECT_EQ(PlanHashHex(PlanHash(PaddedPlan())), "071de5c13127938f");
}

TEST(PlanHashTest, EveryPartOfThePlanCounts) {
  const Plan base = HeadTailPlan();
  const uint64_t h = PlanHash(base);
  Plan swapped = base;  // the same cuts, the ranks exchanged (and reordered by rank)
  swapped.shards = {{0, 0, 2, 0}, {1, 0, 2, 0}, {0, 2, 4, 1}};
  Plan recut = base;  // doc 0 cut at 3 instead of 2
  recut.shards = {{0, 3, 3, 0}, {0, 0, 3, 1}, {1, 0, 2, 1}};
  Plan reordered = base;  // rank 1's shards in the other token order
  reordered.shards = {{0, 2, 4, 0}, {1, 0, 2, 1}, {0, 0, 2, 1}};
  Plan docs = base;
  docs.doc_lens = {6, 3};
  Plan padding = base;
  padding.padding = 1;
  Plan ranks = base;
  ranks.cp_size = 3;
  for (const Plan* other : {&swapped, &recut, &reordered, &docs, &padding, &ranks}) {
    EXPECT_NE(PlanHash(*other), h);
  }
  EXPECT_EQ(PlanHash(HeadTailPlan()), h);
}

TEST(PlanHashTest, HashOfTheBytesOnEveryStrategysRandomPlans) {
  // PlanHash hashes exactly PlanHashBytes; plans that differ hash apart.
  std::mt19937_64 rng(30);
  int distinct_pairs = 0;
  for (int i = 0; i < 200; ++i) {
    Batch batch;
    const int docs = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int d = 0; d < docs; ++d) {
      batch.doc_lens.push_back(std::uniform_int_distribution<int64_t>(1, 2000)(rng));
    }
    batch.cp_size = static_cast<int32_t>(std::min<int64_t>(
        TotalTokens(batch.doc_lens), std::uniform_int_distribution<int32_t>(1, 16)(rng)));
    std::vector<Plan> plans;
    for (Strategy s : AllStrategies()) {
      if (s == Strategy::kIlp) continue;   // core links no solver
      if (s == Strategy::kBasp) continue;  // equal-length documents only
      absl::StatusOr<Plan> plan = MakePlan(s, batch, PlanOptions{});
      ASSERT_THAT(plan, IsOk());
      const std::string bytes = PlanHashBytes(*plan);
      ASSERT_EQ(bytes.size(),
                16 + 8 * (4 + plan->doc_lens.size() + 4 * plan->shards.size()));
      ASSERT_EQ(PlanHash(*plan), Fnv1a64(bytes));
      plans.push_back(*std::move(plan));
    }
    for (size_t a = 0; a < plans.size(); ++a) {
      for (size_t b = a + 1; b < plans.size(); ++b) {
        const bool same = plans[a].shards == plans[b].shards;
        EXPECT_EQ(PlanHash(plans[a]) == PlanHash(plans[b]), same) << "batch " << i;
        distinct_pairs += same ? 0 : 1;
      }
    }
  }
  EXPECT_GT(distinct_pairs, 1000);
}

// A block-diffusion plan appends its mask id and block size after the
// shards; the causal encoding (no mask section) is unchanged.
TEST(PlanHashTest, ABlockDiffusionMaskIsPartOfTheHash) {
  const Plan causal = RingPlan();
  Plan bd = causal;
  bd.mask = AttentionMask{MaskKind::kBlockDiffusion, 4};
  const std::string causal_bytes = PlanHashBytes(causal);
  const std::string bd_bytes = PlanHashBytes(bd);
  ASSERT_EQ(bd_bytes.size(), causal_bytes.size() + 16);
  EXPECT_EQ(bd_bytes.substr(0, causal_bytes.size()), causal_bytes);
  EXPECT_EQ(bd_bytes.substr(causal_bytes.size()),
            std::string("\x01\0\0\0\0\0\0\0\x04\0\0\0\0\0\0\0", 16));
  EXPECT_NE(PlanHash(bd), PlanHash(causal));
  Plan other_block = bd;
  other_block.mask.block_size = 8;
  EXPECT_NE(PlanHash(other_block), PlanHash(bd));
  EXPECT_EQ(PlanHash(bd), Fnv1a64(bd_bytes));
}

TEST(PlanHashHexTest, SixteenLowercaseDigitsZeroPadded) {
  EXPECT_EQ(PlanHashHex(0), "0000000000000000");
  EXPECT_EQ(PlanHashHex(0x1abULL), "00000000000001ab");
  EXPECT_EQ(PlanHashHex(~uint64_t{0}), "ffffffffffffffff");
}

TEST(PlannerVersionTest, IsTheProjectRelease) {
  EXPECT_THAT(std::string(PlannerVersion()), ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+"));
}

}  // namespace
}  // namespace flashcp::core
