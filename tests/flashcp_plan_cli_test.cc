// Runs the built flashcp-plan binary as a real process (its path comes from
// the FLASHCP_PLAN_BIN compile definition) and checks its stdout, stderr and
// exit status.
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/plan_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace {

using ::flashcp::tests::testing::ToolRun;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Runs `flashcp-plan <args>` with `stdin_text` on its stdin.
ToolRun RunPlan(std::vector<std::string> args, const std::string& stdin_text = "") {
  args.insert(args.begin(), FLASHCP_PLAN_BIN);
  return ::flashcp::tests::testing::RunTool(args, stdin_text, absl::Now() + absl::Seconds(60),
                                            ::testing::TempDir());
}

// docs [5, 3] on N = 2 with Ring sharding, H = D = 1 and 1-byte elements, as
// batch 0: a PlanResponse in JSON (core/plan_json_test.cc works the numbers
// out). Ring cuts the packed sequence into 2 chunks of C/N = 4 tokens: rank 0
// holds doc 0 [0, 4); rank 1 holds doc 0 [4, 5) and doc 1 [0, 3). Workload
// (2p + s + 1) s / 2: 10 and 5 + 6 = 11, imbalance 11 / 10.5; every scheme's
// bottleneck is 4 tokens a phase (16 bytes over both), so nothing is saved.
const std::string kRingJson =
    std::string(
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
    "\":0,\"cheaper_scheme\":\"allgather\",\"cost_profile\":\"pairs\",\"cost\":{\"whole_p"
    "air\":1,\"prefixed_pair\":1,\"sequence\":0,\"token\":0},\"cost_calibrated\":false,\""
    "rank_predicted_cost\":[10,11],\"predicted_cost_imbalance\":1.0476190476190477,\"all_"
    "to_all_inapplicable\":\"query_heads: the all-to-all over a group of 2 ranks splits t"
    "he Hq = 1 query heads evenly, so the group size must divide Hq (group 0: ranks 0..1)"
    "\",\"all_to_all_replicated_kv_heads\":0},\"plan_hash\":\"acb8cc4eb63dfe48\",\"planne"
    "r_version\":\"") +
    std::string(flashcp::core::PlannerVersion()) + "\"}";

// H = D = 1, 1-byte elements, then `tail`.
std::vector<std::string> RingOnTwo(std::vector<std::string> tail) {
  std::vector<std::string> args = {"--cp", "2", "--strategy", "ring", "--heads", "1",
                                   "--head_dim", "1", "--dtype_bytes", "1"};
  args.insert(args.end(), tail.begin(), tail.end());
  return args;
}

TEST(FlashcpPlanCliTest, HandWorkedRingBatchFromArguments) {
  const ToolRun r = RunPlan(RingOnTwo({"5", "3"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, std::string(kRingJson) + "\n");
}

TEST(FlashcpPlanCliTest, StdinBatchesInInputOrder) {
  // Odd total: 7 tokens on 2 ranks is C/N = 4 with one padding token on rank 1
  // (rank_tokens [4, 3]); workload 10 and (8 + 3 + 1) 3 / 2 = 18: imbalance
  // 18 / 14.
  const ToolRun r = RunPlan(RingOnTwo({}), "5,3\n# comment\n\n7\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            std::string(kRingJson) + "\n" +
                "{\"batch_id\":1,\"strategy\":\"ring\",\"cp_size\":2,\"doc_lens\":[7],\"padding\":1,\""
                "shards\":[{\"doc\":0,\"start\":0,\"len\":4,\"rank\":0},{\"doc\":0,\"start\":4,\"len\""
                ":3,\"rank\":1}],\"metrics\":{\"imbalance_ratio\":1.2857142857142858,\"comm_saving_ra"
                "tio\":0,\"targeted_saving_ratio\":0,\"tokens_per_rank\":4,\"rank_tokens\":[4,3],\"ra"
                "nk_workload\":[10,18],\"rank_nonlast_tokens\":[4,0],\"rank_segments\":[1,1],\"cut_do"
                "cs\":1,\"min_cut_shard_len\":3,\"bytes\":[{\"scheme\":\"full_kv\",\"sent_bytes\":[16"
                ",16],\"received_bytes\":[16,16],\"bottleneck_bytes\":16,\"phase_sent_tokens\":[4,4],"
                "\"phase_received_tokens\":[4,4],\"phase_max_sent_tokens\":4,\"phase_max_received_tok"
                "ens\":4,\"phase_bottleneck_tokens\":4,\"phase_max_sent_bytes\":8,\"phase_max_receive"
                "d_bytes\":8,\"phase_bottleneck_bytes\":8,\"phase_intra_node_bytes\":16,\"phase_inter"
                "_node_bytes\":0,\"phase_inter_node_sent_bytes\":[0,0],\"phase_inter_node_received_by"
                "tes\":[0,0],\"phase_max_intra_node_bytes\":8,\"phase_max_inter_node_bytes\":0},{\"sc"
                "heme\":\"allgather\",\"sent_bytes\":[16,16],\"received_bytes\":[16,16],\"bottleneck_"
                "bytes\":16,\"phase_sent_tokens\":[4,4],\"phase_received_tokens\":[4,4],\"phase_max_s"
                "ent_tokens\":4,\"phase_max_received_tokens\":4,\"phase_bottleneck_tokens\":4,\"phase"
                "_max_sent_bytes\":8,\"phase_max_received_bytes\":8,\"phase_bottleneck_bytes\":8,\"ph"
                "ase_intra_node_bytes\":16,\"phase_inter_node_bytes\":0,\"phase_inter_node_sent_bytes"
                "\":[0,0],\"phase_inter_node_received_bytes\":[0,0],\"phase_max_intra_node_bytes\":8,"
                "\"phase_max_inter_node_bytes\":0},{\"scheme\":\"targeted\",\"sent_bytes\":[8,8],\"re"
                "ceived_bytes\":[8,8],\"bottleneck_bytes\":16,\"phase_sent_tokens\":[4,0],\"phase_rec"
                "eived_tokens\":[0,4],\"phase_max_sent_tokens\":4,\"phase_max_received_tokens\":4,\"p"
                "hase_bottleneck_tokens\":4,\"phase_max_sent_bytes\":8,\"phase_max_received_bytes\":8"
                ",\"phase_bottleneck_bytes\":8,\"phase_intra_node_bytes\":8,\"phase_inter_node_bytes\""
                ":0,\"phase_inter_node_sent_bytes\":[0,0],\"phase_inter_node_received_bytes\":[0,0],\""
                "phase_max_intra_node_bytes\":8,\"phase_max_inter_node_bytes\":0},{\"scheme\":\"all_t"
                "o_all\",\"sent_bytes\":[0,0],\"received_bytes\":[0,0],\"bottleneck_bytes\":0,\"phase"
                "_sent_tokens\":[0,0],\"phase_received_tokens\":[0,0],\"phase_max_sent_tokens\":0,\"p"
                "hase_max_received_tokens\":0,\"phase_bottleneck_tokens\":0,\"phase_max_sent_bytes\":"
                "0,\"phase_max_received_bytes\":0,\"phase_bottleneck_bytes\":0,\"phase_intra_node_byt"
                "es\":0,\"phase_inter_node_bytes\":0,\"phase_inter_node_sent_bytes\":[0,0],\"phase_in"
                "ter_node_received_bytes\":[0,0],\"phase_max_intra_node_bytes\":0,\"phase_max_inter_n"
                "ode_bytes\":0}],\"planning_seconds\":0,\"cheaper_scheme\":\"allgather\",\"cost_profi"
                "le\":\"pairs\",\"cost\":{\"whole_pair\":1,\"prefixed_pair\":1,\"sequence\":0,\"token"
                "\":0},\"cost_calibrated\":false,\"rank_predicted_cost\":[10,18],\"predicted_cost_imb"
                "alance\":1.2857142857142858,\"all_to_all_inapplicable\":\"query_heads: the all-to-al"
                "l over a group of 2 ranks splits the Hq = 1 query heads evenly, so the group size mu"
                "st divide Hq (group 0: ranks 0..1)\",\"all_to_all_replicated_kv_heads\":0},\"plan_ha"
                "sh\":\"3aeb382f97e12acb\",\"planner_version\":\"" +
                std::string(flashcp::core::PlannerVersion()) + "\"}\n");
}

TEST(FlashcpPlanCliTest, BadBatchLineNamesTheLine) {
  const ToolRun r = RunPlan({"--cp", "2", "--strategy", "ring"}, "5,3\n4,0\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "flashcp-plan: stdin line 2: token 1: \"0\" is not a positive integer\n");
  // Line 1 was planned.
  EXPECT_THAT(r.out, StartsWith("{\"batch_id\":0,\"strategy\":\"ring\",\"cp_size\":2,"
                                "\"doc_lens\":[5,3],"));
}

TEST(FlashcpPlanCliTest, BadFlagValueIsAUsageError) {
  const ToolRun r = RunPlan({"--cp", "0", "5", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "flashcp-plan: --cp: must be an integer in [1, 65536], got \"0\"\n"
            "Run 'flashcp-plan --help' for the flags.\n");
  EXPECT_EQ(r.out, "");
}

TEST(FlashcpPlanCliTest, BadMinShardTokensIsAUsageError) {
  const ToolRun r = RunPlan({"--min_shard_tokens", "-5", "5", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "flashcp-plan: --min_shard_tokens: must be an integer in [0, 1099511627776], "
            "got \"-5\"\n"
            "Run 'flashcp-plan --help' for the flags.\n");
  EXPECT_EQ(r.out, "");
}

TEST(FlashcpPlanCliTest, UnknownFlagAndUnknownDataSet) {
  ToolRun r = RunPlan({"--frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, StartsWith("flashcp-plan: unknown flag \"--frobnicate\"\n"));
  r = RunPlan({"--dataset", "c4"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err,
              StartsWith("flashcp-plan: --dataset: unknown data set \"c4\" (wlbllm, pile, redpajama)"));
}

TEST(FlashcpPlanCliTest, MissingInputFile) {
  const ToolRun r = RunPlan({"--input", "/nonexistent/flashcp/batches.txt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "flashcp-plan: --input: cannot open \"/nonexistent/flashcp/batches.txt\": No such file "
            "or directory\n");
}

TEST(FlashcpPlanCliTest, DataSetSummaryHasATableAndACleanStdout) {
  const ToolRun r = RunPlan({"--dataset", "pile", "--context", "16384", "--cp", "4", "--batches",
                             "3", "--seed", "5", "--strategy", "llama3,ring", "--summary"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("# flashcp-plan summary: N = 4, 3 batches of 16384 tokens drawn "
                                "from pile (seed 5)"));
  EXPECT_THAT(r.out, HasSubstr("\nstrategy       batches imb_mean"));
  EXPECT_THAT(r.out, HasSubstr("\nllama3               3 "));
  EXPECT_THAT(r.out, HasSubstr("\nring                 3 "));
}

TEST(FlashcpPlanCliTest, HelpGoesToStdout) {
  const ToolRun r = RunPlan({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, StartsWith("Usage: flashcp-plan [--flag=value ...] [LENGTH ...]\n"));
  // --min_shard_tokens promises what PlanOptions::min_shard_tokens does: best
  // effort, subordinate to R (core/strategies.h).
  EXPECT_THAT(r.out, HasSubstr("\n  --min_shard_tokens=128\n      flashcp's minimum cut shard, "
                               "tokens (0 turns the rule off). Best effort, below the imbalance "
                               "target R: "));
  EXPECT_EQ(r.err, "");
}

}  // namespace
