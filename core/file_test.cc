#include "core/file.h"

#include <string>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;

TEST(FileTest, WritesAndReadsBack) {
  const std::string path = ::testing::TempDir() + "/flashcp_file_test.bin";
  const std::string data("a\0b\n", 4);
  ASSERT_THAT(WriteFile("--out", path, data), IsOk());
  absl::StatusOr<std::string> got = ReadFile("--in", path);
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_EQ(*got, data);
  ASSERT_THAT(WriteFile("--out", path, ""), IsOk());
  got = ReadFile("--in", path);
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_EQ(*got, "");
}

// The code follows the errno, the message names the flag and the path.
TEST(FileTest, ErrorsCarryTheErrnosCode) {
  EXPECT_THAT(ReadFile("--tls_ca", "/nonexistent/flashcp/ca.pem"),
              StatusIs(absl::StatusCode::kNotFound,
                       "--tls_ca: cannot open \"/nonexistent/flashcp/ca.pem\": No such file or "
                       "directory"));
  EXPECT_THAT(ReadFile("--input", "/"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "--input: cannot read \"/\": Is a directory"));
  EXPECT_THAT(WriteFile("--svg", "/nonexistent/flashcp/plan.svg", "x"),
              StatusIs(absl::StatusCode::kNotFound,
                       "--svg: cannot open \"/nonexistent/flashcp/plan.svg\": No such file or "
                       "directory"));
  EXPECT_THAT(WriteFile("--svg", "/", "x"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "--svg: cannot open \"/\": Is a directory"));
}

// ReadPem: the file's bytes where a BEGIN line ends in the label asked for;
// InvalidArgument naming the flag and the path where none does.
TEST(FileTest, ReadPemChecksTheLabel) {
  const std::string path = ::testing::TempDir() + "/flashcp_file_test.pem";
  const std::string key =
      "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n";
  ASSERT_THAT(WriteFile("--out", path, key), IsOk());
  absl::StatusOr<std::string> got = ReadPem(path, "--tls_key", "PRIVATE KEY");
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_EQ(*got, key);
  EXPECT_THAT(ReadPem(path, "--tls_cert", "CERTIFICATE"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--tls_cert: \"" + path + "\" holds no PEM CERTIFICATE"));
  ASSERT_THAT(WriteFile("--out", path, "not a pem"), IsOk());
  EXPECT_THAT(ReadPem(path, "--tls_ca", "CERTIFICATE"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--tls_ca: \"" + path + "\" holds no PEM CERTIFICATE"));
  EXPECT_THAT(ReadPem("/nonexistent/flashcp/ca.pem", "--tls_ca", "CERTIFICATE"),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace flashcp::core
