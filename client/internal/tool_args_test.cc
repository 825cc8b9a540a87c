#include "client/internal/tool_args.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::client::internal {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;

absl::StatusOr<ToolArgs> Parse(const std::vector<std::string>& args) {
  return ToolArgs::Parse(args, {"cp", "target_imbalance", "server"}, {"json"});
}

TEST(ToolArgsTest, SpaceAndEqualsFormsAndSwitches) {
  auto a = Parse({"--cp", "8", "--target_imbalance=1.05", "--json", "--server", "h:1"});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a->Int("cp", 1, 1, 100), 8);
  EXPECT_EQ(*a->Double("target_imbalance", 0, 0, 10), 1.05);
  EXPECT_TRUE(a->Has("json"));
  EXPECT_EQ(a->String("server", ""), "h:1");
  EXPECT_FALSE(a->Has("missing"));
}

TEST(ToolArgsTest, DefaultsWhenAbsent) {
  auto a = Parse({});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a->Int("cp", 8, 1, 100), 8);
  EXPECT_EQ(*a->Double("target_imbalance", 0.5, 0, 10), 0.5);
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
  auto a = Parse({"--cp", "0", "--target_imbalance", "nan"});
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT(a->Int("cp", 8, 1, 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--cp: \"0\" is not an integer in [1, 100]"));
  EXPECT_THAT(a->Double("target_imbalance", 0, 0, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--target_imbalance: \"nan\" is not a number in [0, 10]"));
  auto b = Parse({"--cp", "8x"});
  ASSERT_THAT(b, IsOk());
  EXPECT_THAT(b->Int("cp", 8, 1, 100), StatusIs(absl::StatusCode::kInvalidArgument,
                                                "--cp: \"8x\" is not an integer in [1, 100]"));
}

TEST(MinShardTokensFieldTest, FlashcpPlanSpellingToTheRequestField) {
  EXPECT_EQ(MinShardTokensField(std::nullopt).value_or(-2), 0);  // the server's default, 128
  EXPECT_EQ(MinShardTokensField(0).value_or(-2), -1);            // the rule off
  EXPECT_EQ(MinShardTokensField(64).value_or(-2), 64);
  EXPECT_EQ(MinShardTokensField(int64_t{1} << 40).value_or(-2), int64_t{1} << 40);
  for (const int64_t bad : {int64_t{-1}, (int64_t{1} << 40) + 1}) {
    EXPECT_THAT(MinShardTokensField(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("--min_shard_tokens: must be an integer in [0, "
                                      "1099511627776], got \"",
                                      bad, "\"")));
  }
}

absl::StatusOr<std::optional<TlsOptions>> Tls(const std::vector<std::string>& args) {
  auto a = ToolArgs::Parse(args, {"tls_ca", "tls_cert", "tls_key", "tls_server_name"}, {});
  if (!a.ok()) return a.status();
  return TlsOptionsFromArgs(*a);
}

TEST(TlsOptionsFromArgsTest, NoneIsPlaintextAndTheFlagsFillTheOptions) {
  auto none = Tls({});
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->has_value());

  auto ca_only = Tls({"--tls_ca", "ca.pem"});
  ASSERT_THAT(ca_only, IsOk());
  ASSERT_TRUE(ca_only->has_value());
  EXPECT_EQ((*ca_only)->ca_file, "ca.pem");
  EXPECT_EQ((*ca_only)->cert_file, "");
  EXPECT_EQ((*ca_only)->key_file, "");
  EXPECT_EQ((*ca_only)->server_name, "");

  auto all = Tls({"--tls_ca=ca.pem", "--tls_cert", "c.pem", "--tls_key", "c.key",
                  "--tls_server_name", "planner.internal"});
  ASSERT_THAT(all, IsOk());
  ASSERT_TRUE(all->has_value());
  EXPECT_EQ((*all)->ca_file, "ca.pem");
  EXPECT_EQ((*all)->cert_file, "c.pem");
  EXPECT_EQ((*all)->key_file, "c.key");
  EXPECT_EQ((*all)->server_name, "planner.internal");
}

TEST(TlsOptionsFromArgsTest, BadCombinationsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"--tls_cert", "c.pem", "--tls_key", "c.key"}, "--tls_cert: needs --tls_ca"},
      {{"--tls_key", "c.key"}, "--tls_key: needs --tls_ca"},
      {{"--tls_server_name", "localhost"}, "--tls_server_name: needs --tls_ca"},
      {{"--tls_ca", "ca.pem", "--tls_cert", "c.pem"}, "--tls_cert, --tls_key: set both or neither"},
      {{"--tls_ca", "ca.pem", "--tls_key", "c.key"}, "--tls_cert, --tls_key: set both or neither"},
      {{"--tls_ca="}, "--tls_ca: empty value"},
      {{"--tls_ca", "ca.pem", "--tls_server_name="}, "--tls_server_name: empty value"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Tls(c.args), StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << c.message;
  }
}

}  // namespace
}  // namespace flashcp::client::internal
