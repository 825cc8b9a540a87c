// ShardBatches on the host (no CUDA call, no device needed): the exact int32
// tables a step uploads for its two shard groups, the checks of Describe and
// of UseDeviceTables. Built where the CUDA backend is (label unit).
#include <cstdint>
#include <memory>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cuda/shard_attention.h"

namespace flashcp::worker::cuda {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using ::testing::ElementsAreArray;

// Two whole shards (rows 0-2, 5-6) and one prefixed shard (rows 3-4 over six
// staged keys) of ten local rows; Hq = 2, Hkv = 1, D = 8.
ShardAttentionSpec Spec() {
  ShardAttentionSpec s;
  s.heads_q = 2;
  s.heads_kv = 1;
  s.head_dim = 8;
  s.scale = 0.5f;
  s.q_rows = 10;
  s.stage_rows = 6;
  s.whole_start = {0, 5};
  s.whole_len = {3, 2};
  s.prefix_q_start = {3};
  s.prefix_q_len = {2};
  s.prefix_kv_len = {6};
  return s;
}

TEST(ShardBatchesTest, TablesOfBothGroups) {
  auto b = ShardBatches::Describe(Spec());
  ASSERT_THAT(b.status(), IsOk());
  // Per group, seven arrays of sequences + 1 entries (attention.h's
  // VarlenBatch): q_start, kv_start, seq_q, seq_kv, q_start * Hq * D,
  // kv_start * Hkv * D, q_start * Hq; the last entry of the starts is the
  // group's end row, of the lengths 0.
  const std::vector<int32_t> whole = {0, 5, 7,  0, 5, 7,  3, 2, 0,  3, 2, 0,
                                      0, 80, 112,  0, 40, 56,  0, 10, 14};
  const std::vector<int32_t> prefixed = {3, 5,  0, 6,  2, 0,  6, 0,  48, 80,  0, 48,  6, 10};
  std::vector<int32_t> want = whole;
  want.insert(want.end(), prefixed.begin(), prefixed.end());
  EXPECT_THAT((*b)->tables(), ElementsAreArray(want));
  EXPECT_FALSE((*b)->ready());
}

TEST(ShardBatchesTest, UseDeviceTablesChecksTheCount) {
  auto b = ShardBatches::Describe(Spec());
  ASSERT_THAT(b.status(), IsOk());
  // The address is only stored (no call here reads it).
  std::vector<int32_t> memory(35);
  EXPECT_THAT((*b)->UseDeviceTables(nullptr, 35),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "shard tables: 35 int32 at null; expected 35 at a device address"));
  EXPECT_THAT((*b)->UseDeviceTables(memory.data(), 34),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "shard tables: 34 int32 at an address; expected 35 at a device address"));
  EXPECT_FALSE((*b)->ready());
  EXPECT_THAT((*b)->UseDeviceTables(memory.data(), 35), IsOk());
  EXPECT_TRUE((*b)->ready());
}

TEST(ShardBatchesTest, DescribeRefusesBadLayouts) {
  ShardAttentionSpec stage = Spec();
  stage.stage_rows = 5;
  EXPECT_THAT(ShardBatches::Describe(stage).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "stage_rows 5; the prefixed shards' keys take 6"));
  ShardAttentionSpec outside = Spec();
  outside.whole_start = {0, 9};
  EXPECT_THAT(ShardBatches::Describe(outside).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "whole shard 1: rows [9, 11) outside q's 10 rows"));
  ShardAttentionSpec lists = Spec();
  lists.prefix_kv_len = {6, 1};
  EXPECT_THAT(ShardBatches::Describe(lists).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "shard lists of different lengths"));
  ShardAttentionSpec heads = Spec();
  heads.heads_kv = 3;
  EXPECT_THAT(ShardBatches::Describe(heads).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ShardBatchesTest, NoShardsNeedNoTables) {
  ShardAttentionSpec empty = Spec();
  empty.whole_start.clear();
  empty.whole_len.clear();
  empty.prefix_q_start.clear();
  empty.prefix_q_len.clear();
  empty.prefix_kv_len.clear();
  empty.stage_rows = 0;
  auto b = ShardBatches::Describe(empty);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_TRUE((*b)->tables().empty());
  EXPECT_TRUE((*b)->ready());
  EXPECT_THAT((*b)->UseDeviceTables(nullptr, 0), IsOk());
}

}  // namespace
}  // namespace flashcp::worker::cuda
