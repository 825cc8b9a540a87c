#include "core/plan_json.h"

#include <cmath>
#include <limits>
#include <string>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;

struct GoodLine {
  const char* line;
  std::vector<int64_t> lens;
};

TEST(ParseBatchLineTest, AcceptsCommasAndWhitespace) {
  const GoodLine cases[] = {
      {"5,3", {5, 3}},
      {"5 3", {5, 3}},
      {"  5 ,\t3  \r\n", {5, 3}},
      {"1,2, 3\t4", {1, 2, 3, 4}},
      {"007", {7}},
      {"1099511627775", {(int64_t{1} << 40) - 1}},
  };
  for (const GoodLine& c : cases) {
    absl::StatusOr<std::vector<int64_t>> lens = ParseBatchLine(c.line);
    ASSERT_THAT(lens, IsOk()) << c.line;
    EXPECT_EQ(*lens, c.lens) << c.line;
  }
}

struct BadLine {
  const char* line;
  const char* message;
};

TEST(ParseBatchLineTest, RejectsWithTheTokenPosition) {
  const BadLine cases[] = {
      {"", "empty line: no document lengths"},
      {" \t ", "empty line: no document lengths"},
      {"5,0", "token 1: \"0\" is not a positive integer"},
      {"5,-3", "token 1: \"-3\" is not a positive integer"},
      {"+5", "token 0: \"+5\" is not a positive integer"},
      {"5 x 3", "token 1: \"x\" is not a positive integer"},
      {"1.5", "token 0: \"1.5\" is not a positive integer"},
      {"1099511627776", "token 0: \"1099511627776\" is not below 2^40"},
      {"99999999999999999999999", "token 0: \"99999999999999999999999\" is not below 2^40"},
      {"1,,2", "token 1: empty (two commas in a row, or a leading comma)"},
      {",1", "token 0: empty (two commas in a row, or a leading comma)"},
      {"1,2,", "token 2: empty (the line ends with a comma)"},
      {"1 2 abcdefghijklmnopqrstuvwxyz0123",
       "token 2: \"abcdefghijklmnopqrstuvwx...\" is not a positive integer"},
  };
  for (const BadLine& c : cases) {
    EXPECT_THAT(ParseBatchLine(c.line), StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << c.line;
  }
}

TEST(JsonStringTest, QuotesAndEscapesControlCharacters) {
  EXPECT_EQ(JsonString("a\"b\\c\nd\te\x01\xc3\xa9"), "\"a\\\"b\\\\c\\nd\\te\\u0001\xc3\xa9\"");
  EXPECT_EQ(JsonString(""), "\"\"");
}

TEST(PlanToJsonTest, HandWorkedRingPlan) {
  // docs [5, 3], N = 2, Ring: rank 0 holds doc 0 [0, 4); rank 1 doc 0 [4, 5)
  // and doc 1 [0, 3). Workload (2p + s + 1) s / 2: rank 0 (0+4+1)*4/2 = 10;
  // rank 1 (8+1+1)*1/2 + (0+3+1)*3/2 = 5 + 6 = 11; imbalance 11 / 10.5.
  // Non-last tokens: rank 0 4 (doc 0's head), rank 1 0; C/N = 4, so the
  // all-gather saves nothing. With H = D = dtype = 1: full_kv = allgather =
  // 4 * 4 * (N-1) = 16 bytes. Targeted: rank 0 sends doc 0's 4 head tokens'
  // K and V to rank 1 (2 * 4 = 8 bytes) and rank 1 returns their dK and dV
  // (8 bytes): each phase's bottleneck is 4 tokens, as full KV's, so 16 bytes
  // over both phases and saving 0. One document is cut; its shortest shard is
  // 1 token.
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {5, 3};
  plan.padding = 0;
  plan.shards = {Shard{0, 0, 4, 0}, Shard{0, 4, 1, 1}, Shard{1, 0, 3, 1}};
  absl::StatusOr<PlanMetrics> metrics = AnalyzePlan(plan, ModelShape{1, 1, 1});
  ASSERT_THAT(metrics, IsOk());
  EXPECT_EQ(PlanToJson(plan, *metrics, "ring"),
            "{\"cp_size\":2,\"docs\":[5,3],\"padding\":0,\"shards\":["
            "{\"doc\":0,\"start\":0,\"len\":4,\"rank\":0},"
            "{\"doc\":0,\"start\":4,\"len\":1,\"rank\":1},"
            "{\"doc\":1,\"start\":0,\"len\":3,\"rank\":1}],"
            "\"metrics\":{\"imbalance\":1.0476190476190477,\"comm_saving\":0,"
            "\"targeted_saving\":0,\"cut_docs\":1,\"min_cut_shard_len\":1,"
            "\"tokens_per_rank\":4,\"rank_workload\":[10,11],\"rank_nonlast_tokens\":[4,0],"
            "\"bytes_full_kv\":16,\"bytes_allgather\":16,\"bytes_targeted\":16},"
            "\"strategy\":\"ring\"}");
}

TEST(PlanToJsonTest, DoublesRoundTripNonFiniteIsNullExtraAndEscaping) {
  Plan plan;
  plan.cp_size = 1;
  plan.doc_lens = {3};
  plan.shards = {Shard{0, 0, 3, 0}};
  PlanMetrics m;
  m.imbalance = 0.1 + 0.2;  // 0.30000000000000004: every digit needed to read back
  m.comm_saving = std::numeric_limits<double>::quiet_NaN();
  m.targeted_saving = -std::numeric_limits<double>::infinity();
  m.tokens_per_rank = 3;
  m.rank_workload = {std::numeric_limits<double>::infinity(), 2.5e-7};  // 2.5e-07: valid JSON
  m.rank_nonlast_tokens = {0};
  m.bytes[2].bottleneck = int64_t{1} << 62;
  EXPECT_EQ(PlanToJson(plan, m, "a\"b\\c\n", ",\"batch\":7"),
            "{\"cp_size\":1,\"docs\":[3],\"padding\":0,\"shards\":["
            "{\"doc\":0,\"start\":0,\"len\":3,\"rank\":0}],"
            "\"metrics\":{\"imbalance\":0.30000000000000004,\"comm_saving\":null,"
            "\"targeted_saving\":null,\"cut_docs\":0,\"min_cut_shard_len\":0,"
            "\"tokens_per_rank\":3,\"rank_workload\":[null,2.5e-07],\"rank_nonlast_tokens\":[0],"
            "\"bytes_full_kv\":0,\"bytes_allgather\":0,\"bytes_targeted\":4611686018427387904},"
            "\"strategy\":\"a\\\"b\\\\c\\n\",\"batch\":7}");
}

}  // namespace
}  // namespace flashcp::core
