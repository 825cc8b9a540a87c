#include "bench/ring_varlen.h"

#include <cstdint>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::bench {
namespace {

using ::flashcp::core::testing::IsOk;

TEST(RingVarlenTest, EveryDocumentInNContiguousChunks) {
  // One 16-token document at N = 4: chunk k = [4k, 4k + 4) on rank k.
  const core::Plan p = PlanRingVarlen(core::Batch{{16}, 4});
  EXPECT_THAT(core::ValidatePlan(p), IsOk());
  EXPECT_EQ(p.shards, (std::vector<core::Shard>{
                          {0, 0, 4, 0}, {0, 4, 4, 1}, {0, 8, 4, 2}, {0, 12, 4, 3}}));
}

TEST(RingVarlenTest, LeftoversRoundRobinAcrossDocuments) {
  // 10 tokens: 2 each, leftovers to ranks 0, 1 -> 3, 3, 2, 2; 6 tokens: 1
  // each, leftovers to ranks 2, 3 -> 1, 1, 2, 2: 4 tokens a rank.
  const core::Plan p = PlanRingVarlen(core::Batch{{10, 6}, 4});
  EXPECT_THAT(core::ValidatePlan(p), IsOk());
  EXPECT_EQ(p.shards, (std::vector<core::Shard>{{0, 0, 3, 0},
                                                {1, 0, 1, 0},
                                                {0, 3, 3, 1},
                                                {1, 1, 1, 1},
                                                {0, 6, 2, 2},
                                                {1, 2, 2, 2},
                                                {0, 8, 2, 3},
                                                {1, 4, 2, 3}}));
  // A document shorter than N: empty chunks are skipped.
  const core::Plan small = PlanRingVarlen(core::Batch{{2, 5, 1}, 4});
  EXPECT_THAT(core::ValidatePlan(small), IsOk());
}

TEST(RingVarlenTest, ValidOnSampledBatches) {
  for (const core::Dataset d : {core::Dataset::kWlbLlm, core::Dataset::kPile,
                                core::Dataset::kRedPajama}) {
    for (const int32_t n : {3, 4, 8}) {
      const absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
          core::SampleBatches(d, 8192, 20, 7);
      ASSERT_THAT(batches.status(), IsOk());
      for (const std::vector<int64_t>& lens : *batches) {
        EXPECT_THAT(core::ValidatePlan(PlanRingVarlen(core::Batch{lens, n})), IsOk());
      }
    }
  }
}

}  // namespace
}  // namespace flashcp::bench
