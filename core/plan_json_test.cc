#include "core/plan_json.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/plan_hash.h"
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
  // and doc 1 [0, 3): 4 real tokens and 1 and 2 segments. Workload
  // (2p + s + 1) s / 2: rank 0 (0+4+1)*4/2 = 10; rank 1 (8+1+1)*1/2 +
  // (0+3+1)*3/2 = 5 + 6 = 11; imbalance 11 / 10.5. Non-last tokens: rank 0 4
  // (doc 0's head), rank 1 0; C/N = 4, so the all-gather saves nothing. With
  // H = D = dtype = 1 a token's K and V are 2 bytes: full_kv and allgather
  // send each rank's 4 tokens to the other rank in each phase (8 bytes a
  // phase, 16 over both, per rank; 16 a phase summed over the one node).
  // Targeted: rank 0 sends doc 0's 4 head tokens forward (8 bytes) and rank 1
  // returns their dK, dV (8 bytes): sent [8, 8], one phase's tokens sent
  // [4, 0] and received [0, 4], bottleneck 4 tokens as full KV's, so saving
  // 0 and the all-gather (the tie's choice) is the cheaper scheme. One
  // document is cut; its shortest shard is 1 token.
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {5, 3};
  plan.padding = 0;
  plan.shards = {Shard{0, 0, 4, 0}, Shard{0, 4, 1, 1}, Shard{1, 0, 3, 1}};
  absl::StatusOr<PlanMetrics> metrics = AnalyzePlan(plan, ModelShape{1, 1, 1});
  ASSERT_THAT(metrics, IsOk());
  EXPECT_EQ(PlanToJson(plan, *metrics, {.strategy = "ring"}),
            absl::StrCat(
            "{\"batch_id\":0,\"strategy\":\"ring\",\"cp_size\":2,\"doc_lens\":[5,3],\"padding\":0"
            ",\"shards\":[{\"doc\":0,\"start\":0,\"len\":4,\"rank\":0},{\"doc\":0,\"start\":4,\"l"
            "en\":1,\"rank\":1},{\"doc\":1,\"start\":0,\"len\":3,\"rank\":1}],\"metrics\":{\"imba"
            "lance_ratio\":1.0476190476190477,\"comm_saving_ratio\":0,\"targeted_saving_ratio\":0"
            ",\"tokens_per_rank\":4,\"rank_tokens\":[4,4],\"rank_workload\":[10,11],\"rank_nonlas"
            "t_tokens\":[4,0],\"rank_segments\":[1,2],\"cut_docs\":1,\"min_cut_shard_len\":1,\"by"
            "tes\":[{\"scheme\":\"full_kv\",\"sent_bytes\":[16,16],\"received_bytes\":[16,16],\"b"
            "ottleneck_bytes\":16,\"phase_sent_tokens\":[4,4],\"phase_received_tokens\":[4,4],\"p"
            "hase_max_sent_tokens\":4,\"phase_max_received_tokens\":4,\"phase_bottleneck_tokens\""
            ":4,\"phase_max_sent_bytes\":8,\"phase_max_received_bytes\":8,\"phase_bottleneck_byte"
            "s\":8,\"phase_intra_node_bytes\":16,\"phase_inter_node_bytes\":0,\"phase_inter_node_"
            "sent_bytes\":[0,0],\"phase_inter_node_received_bytes\":[0,0],\"phase_max_intra_node_"
            "bytes\":8,\"phase_max_inter_node_bytes\":0},{\"scheme\":\"allgather\",\"sent_bytes\""
            ":[16,16],\"received_bytes\":[16,16],\"bottleneck_bytes\":16,\"phase_sent_tokens\":[4"
            ",4],\"phase_received_tokens\":[4,4],\"phase_max_sent_tokens\":4,\"phase_max_received"
            "_tokens\":4,\"phase_bottleneck_tokens\":4,\"phase_max_sent_bytes\":8,\"phase_max_rec"
            "eived_bytes\":8,\"phase_bottleneck_bytes\":8,\"phase_intra_node_bytes\":16,\"phase_i"
            "nter_node_bytes\":0,\"phase_inter_node_sent_bytes\":[0,0],\"phase_inter_node_receive"
            "d_bytes\":[0,0],\"phase_max_intra_node_bytes\":8,\"phase_max_inter_node_bytes\":0},{"
            "\"scheme\":\"targeted\",\"sent_bytes\":[8,8],\"received_bytes\":[8,8],\"bottleneck_b"
            "ytes\":16,\"phase_sent_tokens\":[4,0],\"phase_received_tokens\":[0,4],\"phase_max_se"
            "nt_tokens\":4,\"phase_max_received_tokens\":4,\"phase_bottleneck_tokens\":4,\"phase_"
            "max_sent_bytes\":8,\"phase_max_received_bytes\":8,\"phase_bottleneck_bytes\":8,\"pha"
            "se_intra_node_bytes\":8,\"phase_inter_node_bytes\":0,\"phase_inter_node_sent_bytes\""
            ":[0,0],\"phase_inter_node_received_bytes\":[0,0],\"phase_max_intra_node_bytes\":8,\""
            "phase_max_inter_node_bytes\":0},{\"scheme\":\"all_to_all\",\"sent_bytes\":[0,0],\"re"
            "ceived_bytes\":[0,0],\"bottleneck_bytes\":0,\"phase_sent_tokens\":[0,0],\"phase_rece"
            "ived_tokens\":[0,0],\"phase_max_sent_tokens\":0,\"phase_max_received_tokens\":0,\"ph"
            "ase_bottleneck_tokens\":0,\"phase_max_sent_bytes\":0,\"phase_max_received_bytes\":0,"
            "\"phase_bottleneck_bytes\":0,\"phase_intra_node_bytes\":0,\"phase_inter_node_bytes\""
            ":0,\"phase_inter_node_sent_bytes\":[0,0],\"phase_inter_node_received_bytes\":[0,0],\""
            "phase_max_intra_node_bytes\":0,\"phase_max_inter_node_bytes\":0}],\"planning_seconds"
            "\":0,\"cheaper_scheme\":\"allgather\",\"all_to_all_inapplicable\":\"query_heads: the"
            " all-to-all over a group of 2 ranks splits the Hq = 1 query heads evenly, so the gro"
            "up size must divide Hq (group 0: ranks 0..1)\",\"all_to_all_replicated_kv_heads\":0}"
            ",\"plan_hash\":\"acb8cc4eb63dfe48\",\"planner_version\":\"",
            PlannerVersion(), "\"}"));
}

TEST(PlanToJsonTest, AnotherPlannersVersionIsWrittenAsGiven) {
  const Plan plan{1, {3}, 0, {Shard{0, 0, 3, 0}}, {}};
  const std::string version = "9.8.7";
  const std::string json =
      PlanToJson(plan, PlanMetrics{}, {.strategy = "ring", .planner_version = &version});
  EXPECT_THAT(json, ::testing::EndsWith(
                        ",\"plan_hash\":\"d8944fcfeb38be2f\",\"planner_version\":\"9.8.7\"}"));
}

TEST(PlanToJsonTest, DoublesRoundTripNonFiniteIsAStringIlpAndEscaping) {
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
  m.cheaper_scheme = CommScheme::kTargeted;
  const PlanInfo ilp{.ilp_gap = 0.125, .ilp_optimal = false, .ilp_granularity = 8};
  EXPECT_EQ(PlanToJson(plan, m,
                       {.batch_id = 7, .strategy = "a\"b\\c\n", .planning_seconds = 0.25,
                        .ilp = &ilp}),
            "{\"batch_id\":7,\"strategy\":\"a\\\"b\\\\c\\n\",\"cp_size\":1,\"doc_lens\":[3],\"pad"
            "ding\":0,\"shards\":[{\"doc\":0,\"start\":0,\"len\":3,\"rank\":0}],\"metrics\":{\"im"
            "balance_ratio\":0.30000000000000004,\"comm_saving_ratio\":\"NaN\",\"targeted_saving_"
            "ratio\":\"-Infinity\",\"tokens_per_rank\":3,\"rank_tokens\":[],\"rank_workload\":[\""
            "Infinity\",2.5e-07],\"rank_nonlast_tokens\":[0],\"rank_segments\":[],\"cut_docs\":0,"
            "\"min_cut_shard_len\":0,\"bytes\":[{\"scheme\":\"full_kv\",\"sent_bytes\":[],\"recei"
            "ved_bytes\":[],\"bottleneck_bytes\":0,\"phase_sent_tokens\":[],\"phase_received_toke"
            "ns\":[],\"phase_max_sent_tokens\":0,\"phase_max_received_tokens\":0,\"phase_bottlene"
            "ck_tokens\":0,\"phase_max_sent_bytes\":0,\"phase_max_received_bytes\":0,\"phase_bott"
            "leneck_bytes\":0,\"phase_intra_node_bytes\":0,\"phase_inter_node_bytes\":0,\"phase_i"
            "nter_node_sent_bytes\":[],\"phase_inter_node_received_bytes\":[],\"phase_max_intra_n"
            "ode_bytes\":0,\"phase_max_inter_node_bytes\":0},{\"scheme\":\"allgather\",\"sent_byt"
            "es\":[],\"received_bytes\":[],\"bottleneck_bytes\":0,\"phase_sent_tokens\":[],\"phas"
            "e_received_tokens\":[],\"phase_max_sent_tokens\":0,\"phase_max_received_tokens\":0,\""
            "phase_bottleneck_tokens\":0,\"phase_max_sent_bytes\":0,\"phase_max_received_bytes\":"
            "0,\"phase_bottleneck_bytes\":0,\"phase_intra_node_bytes\":0,\"phase_inter_node_bytes"
            "\":0,\"phase_inter_node_sent_bytes\":[],\"phase_inter_node_received_bytes\":[],\"pha"
            "se_max_intra_node_bytes\":0,\"phase_max_inter_node_bytes\":0},{\"scheme\":\"targeted"
            "\",\"sent_bytes\":[],\"received_bytes\":[],\"bottleneck_bytes\":4611686018427387904,"
            "\"phase_sent_tokens\":[],\"phase_received_tokens\":[],\"phase_max_sent_tokens\":0,\""
            "phase_max_received_tokens\":0,\"phase_bottleneck_tokens\":0,\"phase_max_sent_bytes\""
            ":0,\"phase_max_received_bytes\":0,\"phase_bottleneck_bytes\":0,\"phase_intra_node_by"
            "tes\":0,\"phase_inter_node_bytes\":0,\"phase_inter_node_sent_bytes\":[],\"phase_inte"
            "r_node_received_bytes\":[],\"phase_max_intra_node_bytes\":0,\"phase_max_inter_node_b"
            "ytes\":0},{\"scheme\":\"all_to_all\",\"sent_bytes\":[],\"received_bytes\":[],\"bottl"
            "eneck_bytes\":0,\"phase_sent_tokens\":[],\"phase_received_tokens\":[],\"phase_max_se"
            "nt_tokens\":0,\"phase_max_received_tokens\":0,\"phase_bottleneck_tokens\":0,\"phase_"
            "max_sent_bytes\":0,\"phase_max_received_bytes\":0,\"phase_bottleneck_bytes\":0,\"pha"
            "se_intra_node_bytes\":0,\"phase_inter_node_bytes\":0,\"phase_inter_node_sent_bytes\""
            ":[],\"phase_inter_node_received_bytes\":[],\"phase_max_intra_node_bytes\":0,\"phase_"
            "max_inter_node_bytes\":0}],\"planning_seconds\":0.25,\"cheaper_scheme\":\"targeted\""
            ",\"all_to_all_inapplicable\":\"\",\"all_to_all_replicated_kv_heads\":0},\"ilp\":{\"o"
            "ptimal\":false,\"gap\":0.125,\"granularity\":8},\"plan_hash\":\"d8944fcfeb38be2f\",\""
            "planner_version\":\"" +
                std::string(PlannerVersion()) + "\"}");
}

}  // namespace
}  // namespace flashcp::core
