#include "client/internal/tool_args.h"

#include <map>
#include <optional>
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

// The TLS flags given, as CommandLine::given and the flags' values make them.
absl::StatusOr<std::optional<TlsOptions>> Tls(const std::map<std::string, std::string>& given) {
  return TlsOptionsFromGiven(given);
}

TEST(TlsOptionsFromGivenTest, NoneIsPlaintextAndTheFlagsFillTheOptions) {
  auto none = Tls({});
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->has_value());

  auto ca_only = Tls({{"tls_ca", "ca.pem"}});
  ASSERT_THAT(ca_only, IsOk());
  ASSERT_TRUE(ca_only->has_value());
  EXPECT_EQ((*ca_only)->ca_file, "ca.pem");
  EXPECT_EQ((*ca_only)->cert_file, "");
  EXPECT_EQ((*ca_only)->key_file, "");
  EXPECT_EQ((*ca_only)->server_name, "");

  auto all = Tls({{"tls_ca", "ca.pem"},
                  {"tls_cert", "c.pem"},
                  {"tls_key", "c.key"},
                  {"tls_server_name", "planner.internal"}});
  ASSERT_THAT(all, IsOk());
  ASSERT_TRUE(all->has_value());
  EXPECT_EQ((*all)->ca_file, "ca.pem");
  EXPECT_EQ((*all)->cert_file, "c.pem");
  EXPECT_EQ((*all)->key_file, "c.key");
  EXPECT_EQ((*all)->server_name, "planner.internal");
}

TEST(TlsOptionsFromGivenTest, BadCombinationsNameTheFlag) {
  struct Case {
    std::map<std::string, std::string> given;
    std::string message;
  };
  const Case cases[] = {
      {{{"tls_cert", "c.pem"}, {"tls_key", "c.key"}}, "--tls_cert: needs --tls_ca"},
      {{{"tls_key", "c.key"}}, "--tls_key: needs --tls_ca"},
      {{{"tls_server_name", "localhost"}}, "--tls_server_name: needs --tls_ca"},
      {{{"tls_ca", "ca.pem"}, {"tls_cert", "c.pem"}}, "--tls_cert, --tls_key: set both or neither"},
      {{{"tls_ca", "ca.pem"}, {"tls_key", "c.key"}}, "--tls_cert, --tls_key: set both or neither"},
      {{{"tls_ca", ""}}, "--tls_ca: empty value"},
      {{{"tls_ca", "ca.pem"}, {"tls_server_name", ""}}, "--tls_server_name: empty value"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Tls(c.given), StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << c.message;
  }
}

}  // namespace
}  // namespace flashcp::client::internal
