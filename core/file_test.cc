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

}  // namespace
}  // namespace flashcp::core
