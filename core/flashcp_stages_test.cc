// The stage table and the table of which stages run at which N
// (core/internal/flashcp_stages.h, core/internal/flashcp_tuning.h).
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/internal/flashcp_grouped.h"
#include "core/internal/flashcp_stages.h"
#include "core/internal/flashcp_tuning.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

TEST(StagesTest, RunInTheirOrder) {
  std::vector<std::string> names;
  for (const internal::Stage& stage : internal::Stages()) names.emplace_back(stage.name);
  EXPECT_EQ(names, (std::vector<std::string>{"grouped", "chunk_heap", "density_fill",
                                             "capacity_groups"}));
}

// Each N falls in the band of the least max_ranks at or above it.
TEST(StagesTest, BandOfN) {
  struct Case {
    int32_t n;
    int32_t max_ranks;
  };
  const Case cases[] = {{1, 2},   {2, 2},   {3, 8},   {8, 8},   {9, 16},
                        {16, 16}, {17, 32}, {32, 32}, {33, std::numeric_limits<int32_t>::max()},
                        {65536, std::numeric_limits<int32_t>::max()}};
  for (const Case& c : cases) EXPECT_EQ(internal::BandOf(c.n).max_ranks, c.max_ranks) << c.n;
}

// Which stages run where: none at N <= 2; chunk heaps only from 9 to 32
// ranks; fills only beyond 8; the all-gather held only up to 8.
TEST(StagesTest, WhichStagesRunAtN) {
  const auto runs = [](int32_t n, internal::StageAtN internal::RankBand::*at) {
    return (internal::BandOf(n).*at).variants > 0;
  };
  for (int32_t n : {1, 2}) {
    for (const internal::Stage& stage : internal::Stages()) EXPECT_FALSE(runs(n, stage.at)) << n;
  }
  EXPECT_TRUE(runs(8, &internal::RankBand::grouped));
  EXPECT_FALSE(runs(8, &internal::RankBand::chunk_heap));
  EXPECT_TRUE(runs(9, &internal::RankBand::chunk_heap));
  EXPECT_TRUE(runs(32, &internal::RankBand::chunk_heap));
  EXPECT_FALSE(runs(33, &internal::RankBand::chunk_heap));
  EXPECT_FALSE(runs(8, &internal::RankBand::fill));
  EXPECT_TRUE(runs(64, &internal::RankBand::fill));
  EXPECT_TRUE(runs(3, &internal::RankBand::kv_groups));
  EXPECT_TRUE(internal::BandOf(8).kv_groups.allgather_held);
  EXPECT_FALSE(internal::BandOf(9).kv_groups.allgather_held);
}

// Every prefix a band takes exists.
TEST(StagesTest, BandsTakeExistingVariants) {
  for (const internal::RankBand& band : internal::kRankBands) {
    EXPECT_LE(band.chunk_heap.variants, std::size(internal::kChunkHeapVariants));
    EXPECT_LE(band.kv_groups.variants, std::size(internal::kKvGroupParams));
    EXPECT_LE(band.fill.variants, 2u);
    EXPECT_LE(band.grouped.variants, internal::GroupedVariants(band.max_ranks).size());
  }
}

TEST(StagesTest, GroupedVariantsFilledBeyondEightRanks) {
  EXPECT_EQ(internal::GroupedVariants(8).front(), (std::pair<double, double>{1.0, 0.0}));
  EXPECT_EQ(internal::GroupedVariants(8).back(), (std::pair<double, double>{0.55, 0.0}));
  EXPECT_EQ(internal::GroupedVariants(9).back(), (std::pair<double, double>{1.0, 0.2}));
}

}  // namespace
}  // namespace flashcp::core
