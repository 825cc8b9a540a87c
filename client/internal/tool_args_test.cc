#include "client/internal/tool_args.h"

#include <set>
#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::client::internal {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;

absl::StatusOr<ToolArgs> Parse(const std::vector<std::string>& args) {
  return ToolArgs::Parse(args, {"cp", "target-imbalance", "server"}, {"json"});
}

TEST(ToolArgsTest, SpaceAndEqualsFormsAndSwitches) {
  auto a = Parse({"--cp", "8", "--target-imbalance=1.05", "--json", "--server", "h:1"});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a->Int("cp", 1, 1, 100), 8);
  EXPECT_EQ(*a->Double("target-imbalance", 0, 0, 10), 1.05);
  EXPECT_TRUE(a->Has("json"));
  EXPECT_EQ(a->String("server", ""), "h:1");
  EXPECT_FALSE(a->Has("missing"));
}

TEST(ToolArgsTest, DefaultsWhenAbsent) {
  auto a = Parse({});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a->Int("cp", 8, 1, 100), 8);
  EXPECT_EQ(*a->Double("target-imbalance", 0.5, 0, 10), 0.5);
  EXPECT_EQ(a->String("server", "x"), "x");
}

TEST(ToolArgsTest, ParseErrorsNameTheArgument) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"--bogus", "1"}, "unknown flag --bogus"},
      {{"--cp"}, "--cp needs a value"},
      {{"8"}, "unexpected argument \"8\""},
      {{"-c"}, "unexpected argument \"-c\""},
      {{"--json=1"}, "--json takes no value"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Parse(c.args), StatusIs(absl::StatusCode::kInvalidArgument, c.message));
  }
}

TEST(ToolArgsTest, ValueErrorsNameTheFlagAndRange) {
  auto a = Parse({"--cp", "0", "--target-imbalance", "nan"});
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT(a->Int("cp", 8, 1, 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--cp: \"0\" is not an integer in [1, 100]"));
  EXPECT_THAT(a->Double("target-imbalance", 0, 0, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--target-imbalance: \"nan\" is not a number in [0, 10]"));
  auto b = Parse({"--cp", "8x"});
  ASSERT_THAT(b, IsOk());
  EXPECT_THAT(b->Int("cp", 8, 1, 100), StatusIs(absl::StatusCode::kInvalidArgument,
                                                "--cp: \"8x\" is not an integer in [1, 100]"));
}

TEST(MinShardTokensFieldTest, FlashcpPlanSpellingToTheRequestField) {
  const std::set<std::string> flags = {"min-shard-tokens"};
  struct Case {
    std::vector<std::string> args;
    int64_t field;
  };
  const Case cases[] = {
      {{}, 0},                                   // the server's default, 128
      {{"--min-shard-tokens", "0"}, -1},         // the rule off
      {{"--min-shard-tokens=64"}, 64},
      {{"--min-shard-tokens", "1099511627776"}, int64_t{1} << 40},
  };
  for (const Case& c : cases) {
    auto a = ToolArgs::Parse(c.args, flags, {});
    ASSERT_THAT(a, IsOk());
    auto field = MinShardTokensField(*a);
    ASSERT_THAT(field, IsOk());
    EXPECT_EQ(*field, c.field) << (c.args.empty() ? "absent" : c.args.back());
  }
  for (const std::string bad : {"-1", "1099511627777", "x"}) {
    auto a = ToolArgs::Parse({"--min-shard-tokens", bad}, flags, {});
    ASSERT_THAT(a, IsOk());
    EXPECT_THAT(MinShardTokensField(*a),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "--min-shard-tokens: \"" + bad +
                             "\" is not an integer in [0, 1099511627776]"));
  }
}

}  // namespace
}  // namespace flashcp::client::internal
