// flashcp-plan --pipeline: its flags (core/cli_args.cc) and its output
// (core/cli_pipeline.h).
#include <sstream>
#include <string>
#include <vector>

#include "core/cli.h"
#include "core/pipeline.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(PipelineCliTest, FlagsBecomeTheRequest) {
  const auto o = ParseCliArgs({"--pipeline", "--pp=8", "--sp", "2", "--memory_budget_gib=40",
                               "--layers=16", "--hidden=2048", "--kv_hidden=512",
                               "--ffn_hidden=5632", "--vocab=32000",
                               "--strategy=token_level,dpp", "--ilp_time_limit=1.5s", "100"});
  ASSERT_THAT(o, IsOk());
  EXPECT_TRUE(o->pipeline);
  EXPECT_EQ(o->pipeline_request.pp_size, 8);
  EXPECT_EQ(o->pipeline_request.sp_size, 2);
  EXPECT_EQ(o->pipeline_request.memory_budget_bytes, 40.0 * (int64_t{1} << 30));
  EXPECT_EQ(o->pipeline_request.model.layers, 16);
  EXPECT_EQ(o->pipeline_request.model.hidden, 2048);
  EXPECT_EQ(o->pipeline_request.model.kv_hidden, 512);
  EXPECT_EQ(o->pipeline_request.model.ffn_hidden, 5632);
  EXPECT_THAT(o->pipeline_strategies,
              ElementsAre(PipelineStrategy::kTokenLevel, PipelineStrategy::kDpp));
  EXPECT_EQ(o->pipeline_options.ckpt.time_limit_seconds, 1.5);
  const auto all = ParseCliArgs({"--pipeline", "--summary", "1"});
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->pipeline_strategies.size(), std::size(kAllPipelineStrategies));
}

TEST(PipelineCliTest, BadFlagsAreNamed) {
  EXPECT_THAT(ParseCliArgs({"--pp=4", "1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--pp: needs --pipeline")));
  EXPECT_THAT(ParseCliArgs({"--pipeline", "--pp=3", "1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--layers")));
  EXPECT_THAT(ParseCliArgs({"--pipeline", "--strategy=ring", "1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--strategy")));
  EXPECT_THAT(ParseCliArgs({"--pipeline", "--pipeline_profile=h100", "1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--pipeline_profile")));
}

TEST(PipelineCliTest, PrintsOneJsonLinePerBatchOrASummary) {
  auto o = ParseCliArgs({"--pipeline", "--quiet", "--docs", "40000,9000,3000,800", "--docs",
                         "5000,5000"});
  ASSERT_THAT(o, IsOk());
  std::istringstream in;
  std::ostringstream out, err;
  ASSERT_EQ(RunCli(*o, in, out, err), kExitOk) << err.str();
  std::istringstream lines(out.str());
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    EXPECT_THAT(line, StartsWith("{\"batch_id\":" + std::to_string(n) + ",\"strategy\":\"dpp\""));
    EXPECT_THAT(line, HasSubstr("\"ckpt_solver\":\"greedy\""));
    ++n;
  }
  EXPECT_EQ(n, 2);

  o = ParseCliArgs({"--pipeline", "--quiet", "--summary", "--memory_budget_gib=29", "131072"});
  ASSERT_THAT(o, IsOk());
  std::ostringstream sum, err2;
  ASSERT_EQ(RunCli(*o, in, sum, err2), kExitOk) << err2.str();
  // Nothing fits 29 GiB: every row counts the batch and no fit.
  EXPECT_THAT(sum.str(), HasSubstr("dpp                  1     0"));
  // Without --summary a batch that fits no plan is an error.
  o = ParseCliArgs({"--pipeline", "--quiet", "--memory_budget_gib=29", "131072"});
  ASSERT_THAT(o, IsOk());
  std::ostringstream out3, err3;
  EXPECT_EQ(RunCli(*o, in, out3, err3), kExitBadInput);
  EXPECT_THAT(err3.str(), HasSubstr("GiB) more"));
}

}  // namespace
}  // namespace flashcp::core
