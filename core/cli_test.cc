#include "core/cli.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ilp_deadline.h"
#include "core/plan_svg.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "core/testing/ticking_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(ParseCliArgsTest, Defaults) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->cp_size, 8);
  EXPECT_THAT(o->strategies, ElementsAre(Strategy::kFlashCp));
  EXPECT_FALSE(o->from_all);
  EXPECT_FALSE(o->summary);
  EXPECT_TRUE(o->batches_text.empty());
  EXPECT_EQ(o->input_path, "");
  EXPECT_FALSE(o->dataset.has_value());
  EXPECT_DOUBLE_EQ(o->plan.target_imbalance, 1.02);
  EXPECT_EQ(o->plan.min_shard_tokens, 128);
}

TEST(ParseCliArgsTest, EveryFlagBothSyntaxes) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--cp",
                                               "4",
                                               "--strategy=ring,flashcp",
                                               "--target_imbalance",
                                               "1.05",
                                               "--dataset=wlbllm",
                                               "--context",
                                               "4096",
                                               "--batches=3",
                                               "--seed",
                                               "18446744073709551615",
                                               "--summary",
                                               "--heads",
                                               "8",
                                               "--head_dim=64",
                                               "--dtype_bytes",
                                               "4",
                                               "--ilp_granularity",
                                               "512",
                                               "--ilp_time_limit=2.5s",
                                               "--min_shard_tokens",
                                               "64",
                                               "--quiet"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->cp_size, 4);
  EXPECT_THAT(o->strategies, ElementsAre(Strategy::kRing, Strategy::kFlashCp));
  EXPECT_FALSE(o->from_all);
  EXPECT_DOUBLE_EQ(o->plan.target_imbalance, 1.05);
  EXPECT_EQ(o->dataset, Dataset::kWlbLlm);
  EXPECT_EQ(o->context, 4096);
  EXPECT_EQ(o->batches, 3);
  EXPECT_EQ(o->seed, 18446744073709551615ULL);
  EXPECT_TRUE(o->summary);
  EXPECT_EQ(o->shape.heads, 8);
  EXPECT_EQ(o->shape.head_dim, 64);
  EXPECT_EQ(o->shape.dtype_bytes, 4);
  EXPECT_EQ(o->plan.ilp.granularity, 512);
  EXPECT_EQ(o->ilp_time_limit, absl::Milliseconds(2500));
  EXPECT_EQ(o->plan.min_shard_tokens, 64);
  EXPECT_FALSE(o->progress);
  EXPECT_TRUE(o->warnings.empty());
}

// The dashed spellings of one release ago still work, each with a warning
// naming the new spelling; a call leaves the flags as it found them.
TEST(ParseCliArgsTest, DashedSpellingsWarnAndCallsDoNotLeak) {
  absl::StatusOr<CliOptions> o =
      ParseCliArgs({"--target-imbalance", "1.05", "--min-shard-tokens=64", "--head-dim", "64"});
  ASSERT_THAT(o, IsOk());
  EXPECT_DOUBLE_EQ(o->plan.target_imbalance, 1.05);
  EXPECT_EQ(o->plan.min_shard_tokens, 64);
  EXPECT_EQ(o->shape.head_dim, 64);
  EXPECT_THAT(o->warnings,
              ElementsAre(HasSubstr("--target-imbalance is deprecated; use --target_imbalance"),
                          HasSubstr("--min-shard-tokens is deprecated; use --min_shard_tokens"),
                          HasSubstr("--head-dim is deprecated; use --head_dim")));
  absl::StatusOr<CliOptions> d = ParseCliArgs({});
  ASSERT_THAT(d, IsOk());
  EXPECT_DOUBLE_EQ(d->plan.target_imbalance, 1.02);
  EXPECT_EQ(d->plan.min_shard_tokens, 128);
  EXPECT_EQ(d->shape.head_dim, 128);
}

TEST(ParseCliArgsTest, HelpListsEveryFlagWithItsDefault) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--cp", "x", "--help"});
  ASSERT_THAT(o, IsOk());
  EXPECT_TRUE(o->help);
  const std::string usage = CliUsage();
  for (const char* flag :
       {"--batches=64", "--context=131072", "--cp=8", "--dataset=", "--docs=", "--dtype_bytes=2",
        "--head_dim=128", "--heads=32", "--ilp_granularity=0", "--ilp_time_limit=10s",
        "--input=", "--min_shard_tokens=128", "--query_heads=0", "--quiet=false", "--seed=1",
        "--strategy=", "--summary=false", "--svg=", "--target_imbalance=1.02",
        "--attention_mask=causal_document", "--block_size=0"}) {
    EXPECT_THAT(usage, HasSubstr(absl::StrCat("\n  ", flag, "\n"))) << flag;
  }
}

TEST(ParseCliArgsTest, QueryHeadsReachTheShape) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--heads", "8", "--query_heads", "64", "5", "3"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->shape.heads, 8);
  EXPECT_EQ(o->shape.query_heads, 64);
  EXPECT_EQ(QueryHeads(o->shape), 64);
}

// --ilp_time_limit bounds the whole ILP call from its start, as in the
// planner: seconds_left counts down on the caller's clock.
TEST(SetIlpDeadlineTest, CountsFromTheCallsStart) {
  const core::testing::TickingClock clock(absl::Seconds(3));  // each Now() 3 s on
  IlpOptions ilp;
  SetIlpDeadline(absl::Seconds(10), clock.Now(), &clock, ilp);  // start 3 s, end 13 s
  EXPECT_DOUBLE_EQ(ilp.time_limit_seconds, 10);
  ASSERT_TRUE(ilp.seconds_left);
  EXPECT_DOUBLE_EQ(ilp.seconds_left(), 7);   // now 6 s
  EXPECT_DOUBLE_EQ(ilp.seconds_left(), 4);   // 9 s
  EXPECT_DOUBLE_EQ(ilp.seconds_left(), 1);   // 12 s
  EXPECT_DOUBLE_EQ(ilp.seconds_left(), -2);  // 15 s: spent, CBC stops
}

TEST(ParseCliArgsTest, SummaryDefaultsToAllButIlp) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--summary", "--dataset", "pile"});
  ASSERT_THAT(o, IsOk());
  EXPECT_THAT(o->strategies,
              ElementsAre(Strategy::kLlama3, Strategy::kPerDoc, Strategy::kRing, Strategy::kZigzag,
                          Strategy::kWholeDoc, Strategy::kFlashCpPaper, Strategy::kFlashCp,
                          Strategy::kMagi));
  EXPECT_TRUE(o->from_all);
}

TEST(ParseCliArgsTest, PositionalLengthsAreOneBatchDocsAreOneEach) {
  absl::StatusOr<CliOptions> pos = ParseCliArgs({"5,3", "2", "--", "7"});
  ASSERT_THAT(pos, IsOk());
  EXPECT_THAT(pos->batches_text, ElementsAre("5,3 2 7"));
  absl::StatusOr<CliOptions> docs = ParseCliArgs({"--docs", "5,3", "--docs=8 8"});
  ASSERT_THAT(docs, IsOk());
  EXPECT_THAT(docs->batches_text, ElementsAre("5,3", "8 8"));
}

struct BadArgs {
  std::vector<std::string> args;
  const char* message;
};

TEST(ParseCliArgsTest, BadFlagsNameTheFlag) {
  const BadArgs cases[] = {
      {{"--cp", "0"}, "--cp: must be an integer in [1, 65536], got \"0\""},
      {{"--cp=-3"}, "--cp: must be an integer in [1, 65536], got \"-3\""},
      {{"--cp"}, "--cp: missing value"},
      {{"--cp", "8x"}, "--cp: Illegal value '8x' specified for flag 'cp'"},
      {{"--strategy", "best"},
       "--strategy: unknown strategy \"best\" (all, llama3, per_doc, ring, zigzag, whole_doc, "
       "flashcp_paper, flashcp, ilp, magi, csbp, basp, or a comma-separated list)"},
      {{"--attention_mask", "bd3lm"},
       "--attention_mask: unknown mask \"bd3lm\" (causal_document, block_diffusion)"},
      {{"--attention_mask=block_diffusion"},
       "--block_size: must be in [1, 2^40] with attention_mask block_diffusion, got 0"},
      {{"--block_size=4"},
       "--block_size: only with attention_mask block_diffusion, got 4 with causal_document"},
      {{"--target_imbalance", "0.9"},
       "--target_imbalance: must be a number in [1, 1e+06], got \"0.9\""},
      {{"--target_imbalance", "nan"},
       "--target_imbalance: must be a number in [1, 1e+06], got \"nan\""},
      {{"--min_shard_tokens", "-1"},
       "--min_shard_tokens: must be an integer in [0, 1099511627776], got \"-1\""},
      {{"--min_shard_tokens=1099511627777"},
       "--min_shard_tokens: must be an integer in [0, 1099511627776], got \"1099511627777\""},
      {{"--dataset", "c4"}, "--dataset: unknown data set \"c4\" (wlbllm, pile, redpajama)"},
      {{"--dataset", "pile", "--context", "0"},
       "--context: must be an integer in [1, 1099511627776], got \"0\""},
      {{"--dataset", "pile", "--batches", "1000001"},
       "--batches: must be an integer in [1, 1000000], got \"1000001\""},
      {{"--dataset", "pile", "--seed", "-1"},
       "--seed: Illegal value '-1' specified for flag 'seed'"},
      {{"--ilp_time_limit", "10"},
       "--ilp_time_limit: Illegal value '10' specified for flag 'ilp_time_limit'"},
      {{"--ilp_time_limit", "0s"}, "--ilp_time_limit: must be a duration in [1ms, 24h], got \"0\""},
      {{"--heads", "0"}, "--heads: must be in [1, 1024], got 0"},
      {{"--heads", "8", "--query_heads", "12"},
       "--query_heads: must be 0 (equal to heads) or a multiple of heads (8) in [1, 1024], got 12"},
      {{"--head_dim", "2048"}, "--head_dim: must be in [1, 1024], got 2048"},
      {{"--head_dim", "4294967297"},
       "--head_dim: Illegal value '4294967297' specified for flag 'head_dim'"},
      {{"--dtype_bytes", "3"}, "--dtype_bytes: must be 1, 2 or 4, got 3"},
      {{"--docs", "5,,3"}, "--docs: token 1: empty (two commas in a row, or a leading comma)"},
      {{"--docs="}, "--docs: empty line: no document lengths"},
      {{"--summary=maybe"}, "--summary: Illegal value 'maybe' specified for flag 'summary'"},
      {{"--svg="}, "--svg: missing file name"},
      {{"--svg"}, "--svg: missing value"},
      {{"--bogus"}, "unknown flag \"--bogus\""},
      {{"-x"}, "unknown flag \"-x\""},
      {{"5", "x"}, "document lengths (arguments): token 1: \"x\" is not a positive integer"},
      {{"5", "--docs", "3"}, "give document lengths either as arguments or with --docs, not both"},
      {{"--dataset", "pile", "--input", "f"},
       "give batches from one source: lengths (arguments or --docs), --input, or --dataset"},
      {{"--context", "10"}, "--context: needs --dataset"},
      {{"--seed", "10"}, "--seed: needs --dataset"},
  };
  for (const BadArgs& c : cases) {
    EXPECT_THAT(ParseCliArgs(c.args), StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << c.args[0];
  }
}

TEST(PercentileTest, NearestRank) {
  EXPECT_EQ(Percentile({}, 0.95), 0);
  EXPECT_EQ(Percentile({3, 1, 2}, 0.5), 2);   // ceil(1.5) = 2nd smallest
  EXPECT_EQ(Percentile({3, 1, 2}, 0.99), 3);  // ceil(2.97) = 3rd
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(Percentile(hundred, 0.95), 95);
  EXPECT_EQ(Percentile(hundred, 0.99), 99);
}

TEST(SummaryAccumulatorTest, MeansPercentilesAndShortestCut) {
  SummaryAccumulator acc(Strategy::kRing);
  PlanMetrics a;
  a.imbalance = 1.0;
  a.comm_saving = 0.5;
  a.targeted_saving = 0.75;
  a.cut_docs = 2;
  a.min_cut_shard_len = 7;
  a.tokens_per_rank = 8;
  a.bytes[static_cast<int>(CommScheme::kAllGather)].phase.bottleneck_tokens = 12;  // 1.5 C/N
  a.bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens = 4;    // 0.5 C/N
  PlanMetrics b = a;
  b.imbalance = 1.5;
  b.comm_saving = 0.25;
  b.targeted_saving = 0.25;
  b.cut_docs = 1;
  b.min_cut_shard_len = 3;
  b.bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens = 10;  // 1.25 C/N
  PlanMetrics c = a;
  c.min_cut_shard_len = 0;  // no cut document: does not lower the minimum
  acc.Add(a, 1.0);
  acc.Add(b, 3.0);
  acc.Add(c, 2.0);
  const StrategySummary s = acc.Finish();
  EXPECT_EQ(s.strategy, Strategy::kRing);
  EXPECT_EQ(s.batches, 3);
  EXPECT_DOUBLE_EQ(s.imbalance_mean, 3.5 / 3);
  EXPECT_DOUBLE_EQ(s.imbalance_p95, 1.5);
  EXPECT_DOUBLE_EQ(s.allgather_saving_mean, 1.25 / 3);
  EXPECT_DOUBLE_EQ(s.targeted_saving_mean, 1.75 / 3);
  EXPECT_DOUBLE_EQ(s.allgather_phase_mean, 1.5);
  EXPECT_DOUBLE_EQ(s.targeted_phase_mean, 2.25 / 3);
  EXPECT_DOUBLE_EQ(s.cut_docs_mean, 5.0 / 3);
  EXPECT_EQ(s.min_cut_shard_len, 3);
  EXPECT_DOUBLE_EQ(s.plan_ms_mean, 2.0);
  EXPECT_DOUBLE_EQ(s.plan_ms_p99, 3.0);
  EXPECT_EQ(FormatSummaryTable({s}),
            "strategy       batches imb_mean  imb_p95   save_ag  save_tgt phase_ag phase_tg "
            "cut_docs   min_cut   ms_mean    ms_p99\n"
            "ring                 3   1.1667   1.5000     41.7%     58.3%    1.500    0.750      "
            "1.7         3     2.000     3.000\n");
}

TEST(RunCliTest, StreamsJsonInInputOrderAndNamesBadLines) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--cp", "2", "--strategy", "ring", "--quiet"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in("8,8\n# a comment\n\n4 4\n3 x\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitBadInput);
  EXPECT_EQ(err.str(), "flashcp-plan: stdin line 5: token 1: \"x\" is not a positive integer\n");
  const std::string text = out.str();
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  EXPECT_THAT(text, StartsWith("{\"batch_id\":0,\"strategy\":\"ring\",\"cp_size\":2,"
                               "\"doc_lens\":[8,8],"));
  EXPECT_THAT(text.substr(text.find('\n') + 1),
              StartsWith("{\"batch_id\":1,\"strategy\":\"ring\",\"cp_size\":2,"
                         "\"doc_lens\":[4,4],"));
}

TEST(RunCliTest, BlockDiffusionPlansTheTwoCopies) {
  absl::StatusOr<CliOptions> o =
      ParseCliArgs({"--cp", "2", "--strategy", "all", "--attention_mask=block_diffusion",
                    "--block_size", "4", "--quiet", "8"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->plan.attention_mask, (AttentionMask{MaskKind::kBlockDiffusion, 4}));
  // "all" under block diffusion: the strategies that plan it.
  EXPECT_THAT(o->strategies, ElementsAre(Strategy::kLlama3, Strategy::kPerDoc, Strategy::kRing,
                                         Strategy::kZigzag, Strategy::kFlashCp, Strategy::kCsbp));
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), 0) << err.str();
  const std::string text = out.str();
  EXPECT_THAT(text, StartsWith("{\"batch_id\":0,\"strategy\":\"llama3\",\"cp_size\":2,"
                               "\"doc_lens\":[8,8],\"padding\":0,\"shards\":[{\"doc\":0,"
                               "\"start\":0,\"len\":4,\"rank\":0},{\"doc\":1,\"start\":4,"
                               "\"len\":4,\"rank\":0},"));
  EXPECT_THAT(text, HasSubstr("\"attention_mask\":\"block_diffusion\",\"block_size\":4}\n"));
  EXPECT_THAT(text, HasSubstr("\"strategy\":\"csbp\""));
}

TEST(RunCliTest, BatchSmallerThanTheGroupIsABadBatch) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--cp", "4", "--strategy", "ring", "2", "1"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitBadInput);
  EXPECT_EQ(err.str(),
            "flashcp-plan: command-line batch 0: cp_size: 4 ranks is more than the batch's 3 "
            "tokens\n");
  EXPECT_EQ(out.str(), "");
}

TEST(RunCliTest, MissingInputFile) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--input", "/nonexistent/flashcp/batches.txt"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitBadInput);
  EXPECT_EQ(err.str(),
            "flashcp-plan: --input: cannot open \"/nonexistent/flashcp/batches.txt\": No such file "
            "or directory\n");
}

// A path that opens but cannot be read (a directory) is an I/O error naming
// it, exit 1; it was an uncaught std::ios_base::failure from the stream
// buffer (abort, exit 134).
TEST(RunCliTest, UnreadableInputIsAnErrorNotAnAbort) {
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--input", dir, "--quiet"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitBadInput);
  EXPECT_EQ(err.str(), absl::StrCat("flashcp-plan: ", dir, ": read error\n"));
  EXPECT_EQ(out.str(), "");
}

TEST(RunCliTest, SummaryOfDataSetBatches) {
  absl::StatusOr<CliOptions> o =
      ParseCliArgs({"--dataset", "wlbllm", "--context", "16384", "--batches", "4", "--cp", "4",
                    "--strategy", "llama3,ring", "--summary", "--quiet"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitOk);
  EXPECT_EQ(err.str(), "");
  EXPECT_THAT(out.str(), HasSubstr("# flashcp-plan summary: N = 4, 4 batches of 16384 tokens "
                                   "drawn from wlbllm (seed 1)"));
  EXPECT_THAT(out.str(), HasSubstr("\nllama3               4 "));
  EXPECT_THAT(out.str(), HasSubstr("\nring                 4 "));
}

TEST(ParseCliArgsTest, ClusterFlagsOverrideThePreset) {
  absl::StatusOr<CliOptions> none = ParseCliArgs({"--ranks_per_node", "4"});
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->plan.ranks_per_node, 4);
  EXPECT_FALSE(none->step_time.has_value());
  absl::StatusOr<CliOptions> o =
      ParseCliArgs({"--cluster", "h100-sxm", "--ranks_per_node=8", "--nic_gbytes_per_s", "25",
                    "--nvlink_latency=3us", "--layers", "32", "--query_heads", "64",
                    "--compute_profile", "cpu-fp32", "--overlap_whole_shards=false",
                    "--rank_step_times", "--choose_by_step_time"});
  ASSERT_THAT(o, IsOk());
  ASSERT_TRUE(o->step_time.has_value());
  EXPECT_EQ(o->step_time->cluster_name, "h100-sxm");
  EXPECT_EQ(o->step_time->layers, 32);
  EXPECT_TRUE(o->step_time->per_rank);
  EXPECT_TRUE(o->choose_by_step_time);
  EXPECT_EQ(o->shape.query_heads, 64);
  const ClusterSpec& c = o->step_time->cluster;
  EXPECT_EQ(c.ranks_per_node, 8);
  EXPECT_DOUBLE_EQ(c.nic_bytes_per_second, 25e9);
  EXPECT_DOUBLE_EQ(c.nvlink_latency_seconds, 3e-6);
  EXPECT_DOUBLE_EQ(c.nvlink_bytes_per_second, 450e9);
  EXPECT_DOUBLE_EQ(c.hbm_bytes_per_second, 3.35e12);
  EXPECT_EQ(c.compute, CostProfile("cpu-fp32").value());
  EXPECT_FALSE(c.overlap_whole_shards);

  const BadArgs cases[] = {
      {{"--cluster", "tpu"}, "--cluster: cluster preset \"tpu\" is unknown; known: h100-sxm, h200"},
      {{"--nic_gbytes_per_s", "0"},
       "--nic_gbytes_per_s (bytes/s): must be finite and > 0, got 0"},
      {{"--cluster=h200", "--forward_fraction", "1"},
       "--forward_fraction: must be in (0, 1), got 1"},
      {{"--cluster=h200", "--compute_profile", "pairs"},
       "--compute_profile: must be a profile in seconds, not pairs, got \"pairs\""},
      {{"--layers", "2"}, "--layers and --rank_step_times need --cluster (or a cluster constant)"},
      {{"--cluster=h200", "--layers", "0"},
       "--layers: must be an integer in [1, 100000], got \"0\""},
      {{"--choose_by_step_time"}, "--choose_by_step_time: needs --cluster"},
      {{"--cluster=h200", "--heads", "4", "--query_heads", "6"},
       "--query_heads: must be 0 (equal to heads) or a multiple of heads (4) in [1, 1024], got 6"},
      {{"--ranks_per_node", "-1"},
       "--ranks_per_node: must be an integer in [0, 65536], got \"-1\""},
  };
  for (const BadArgs& c : cases) {
    EXPECT_THAT(ParseCliArgs(c.args), StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << c.args[0];
  }
}

TEST(RunCliTest, SummaryWithPredictedStepsAndSpeedups) {
  absl::StatusOr<CliOptions> o =
      ParseCliArgs({"--dataset", "pile", "--context", "16384", "--batches", "2", "--cp", "4",
                    "--strategy", "llama3,flashcp", "--summary", "--quiet", "--cluster",
                    "h100-sxm"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitOk);
  EXPECT_EQ(err.str(), "");
  EXPECT_THAT(out.str(), HasSubstr("# step_ms: mean predicted attention time of one step"));
  EXPECT_THAT(out.str(), HasSubstr(" step_ms exchange "));
  EXPECT_THAT(out.str(), HasSubstr("\nspeedup over          llama3       flashcp\n"));
  // Each strategy over itself is exactly 1.
  EXPECT_THAT(out.str(), HasSubstr("\nllama3                1.000x"));
  EXPECT_THAT(out.str(), HasSubstr("full_kv"));
}

TEST(RunCliTest, JsonCarriesThePredictedStep) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--cp", "2", "--strategy", "ring", "--cluster",
                                               "h200", "--rank_step_times", "--quiet", "8", "8"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitOk);
  EXPECT_THAT(out.str(), HasSubstr("\"predicted_exchange\":\"ring\""));
  EXPECT_THAT(out.str(), HasSubstr("\"rank_predicted_times\":[{\"forward_compute\":"));
  EXPECT_THAT(out.str(), HasSubstr("\"predicted_cluster\":\"h200\"}"));
}

// basp runs the all-to-all: its JSON lists all_to_all among the exchanges and
// as its own; where its groups (of 3) do not divide Hq = 32 the entry says
// why, and the summary prints n/a, not a 0 to compare.
TEST(RunCliTest, BaspPredictsTheAllToAllOrSaysItDoesNotApply) {
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--cp", "4", "--strategy", "basp", "--cluster",
                                               "h200", "--quiet", "8", "8"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitOk);
  EXPECT_THAT(out.str(), HasSubstr("\"predicted_exchange\":\"all_to_all\""));
  EXPECT_THAT(out.str(), HasSubstr("{\"exchange\":\"all_to_all\",\"step_seconds\":"));
  EXPECT_THAT(out.str(), Not(HasSubstr("\"inapplicable\"")));

  o = ParseCliArgs({"--cp", "6", "--strategy", "basp,per_doc", "--cluster", "h200", "--summary",
                    "--quiet", "9", "9"});
  ASSERT_THAT(o, IsOk());
  std::ostringstream sum, sum_err;
  EXPECT_EQ(RunCli(*o, in, sum, sum_err), kExitOk);
  EXPECT_THAT(sum.str(), HasSubstr("        n/a all_to_all\n"));
  EXPECT_THAT(sum.str(), HasSubstr("\nbasp                     n/a           n/a\n"));

  o = ParseCliArgs({"--cp", "6", "--strategy", "basp", "--cluster", "h200", "--quiet", "9", "9"});
  ASSERT_THAT(o, IsOk());
  std::ostringstream json, json_err;
  EXPECT_EQ(RunCli(*o, in, json, json_err), kExitOk);
  EXPECT_THAT(json.str(), HasSubstr("\"exchange_seconds\":0,\"inapplicable\":\"query_heads: "));
}

// --svg draws the first batch's plans, one panel per strategy in the order
// asked, exactly as PlansToSvg draws them; the JSON lines still come out.
TEST(RunCliTest, SvgDrawsTheFirstBatchSideBySide) {
  const std::string path = ::testing::TempDir() + "/cli_test_plan.svg";
  absl::StatusOr<CliOptions> o = ParseCliArgs(
      {"--cp", "2", "--strategy", "per_doc,flashcp", "--quiet", "--svg", path});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->svg_path, path);
  std::istringstream in("9,5,2\n4 4\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitOk);
  EXPECT_EQ(err.str(), "flashcp-plan: note: --svg drew batch 0 of 2\n");
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4);

  const Batch batch{{9, 5, 2}, 2};
  std::vector<PlanPanel> panels;
  for (Strategy s : {Strategy::kPerDoc, Strategy::kFlashCp}) {
    absl::StatusOr<Plan> plan = MakePlan(s, batch);
    ASSERT_THAT(plan, IsOk());
    panels.push_back({std::string(StrategyName(s)), *plan});
  }
  absl::StatusOr<std::string> want = PlansToSvg(panels);
  ASSERT_THAT(want, IsOk());
  std::ifstream file(path, std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, *want);
}

TEST(RunCliTest, SvgUnwritablePathIsAnError) {
  absl::StatusOr<CliOptions> o =
      ParseCliArgs({"--cp", "2", "--quiet", "--svg", "/nonexistent/flashcp/plan.svg", "8", "8"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitBadInput);
  EXPECT_EQ(err.str(),
            "flashcp-plan: --svg: cannot open \"/nonexistent/flashcp/plan.svg\": No such file or "
            "directory\n");
}

TEST(RunCliTest, SvgWithNoBatchIsAnError) {
  const std::string path = ::testing::TempDir() + "/cli_test_empty.svg";
  absl::StatusOr<CliOptions> o = ParseCliArgs({"--quiet", "--svg", path});
  ASSERT_THAT(o, IsOk());
  std::istringstream in("# only a comment\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunCli(*o, in, out, err), kExitBadInput);
  EXPECT_EQ(err.str(), "flashcp-plan: --svg: no batch to draw\n");
  EXPECT_EQ(out.str(), "");
}

}  // namespace
}  // namespace flashcp::core
