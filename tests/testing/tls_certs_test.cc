// GenerateTlsFiles: the chain verifies against its CA and not the other one,
// and the server certificate names localhost both ways. Checked with the same
// openssl CLI that made the files.
#include "tests/testing/tls_certs.h"

#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace flashcp::tests::testing {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kTimeout = absl::Seconds(60);

void Remove(const std::string& dir) {
  EXPECT_THAT(RunCommand({"/bin/rm", "-rf", dir}, "", absl::Now() + kTimeout), IsOk());
}

CommandResult OpenSsl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/env", "openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = RunCommand(argv, "", absl::Now() + kTimeout);
  EXPECT_THAT(r, IsOk());
  return r.ok() ? *r : CommandResult{-1, ""};
}

TEST(GenerateTlsFilesTest, ChainsVerifyAgainstTheirCaOnly) {
  auto f = GenerateTlsFiles(::testing::TempDir(), absl::Now() + kTimeout);
  ASSERT_THAT(f, IsOk());
  EXPECT_THAT(f->ca_cert, StartsWith(f->dir + "/"));

  CommandResult server = OpenSsl({"verify", "-CAfile", f->ca_cert, "-purpose", "sslserver",
                                  f->server_cert});
  EXPECT_EQ(server.exit_code, 0) << server.output;
  EXPECT_EQ(server.output, f->server_cert + ": OK\n");
  CommandResult client = OpenSsl({"verify", "-CAfile", f->ca_cert, "-purpose", "sslclient",
                                  f->client_cert});
  EXPECT_EQ(client.exit_code, 0) << client.output;
  EXPECT_EQ(client.output, f->client_cert + ": OK\n");
  // The server certificate is not a client certificate, nor signed by the other CA.
  EXPECT_EQ(OpenSsl({"verify", "-CAfile", f->ca_cert, "-purpose", "sslclient", f->server_cert})
                .exit_code,
            2);
  EXPECT_EQ(OpenSsl({"verify", "-CAfile", f->other_ca_cert, f->server_cert}).exit_code, 2);
  EXPECT_EQ(OpenSsl({"verify", "-CAfile", f->other_ca_cert, f->client_cert}).exit_code, 2);

  CommandResult san = OpenSsl({"x509", "-in", f->server_cert, "-noout", "-ext", "subjectAltName"});
  EXPECT_EQ(san.exit_code, 0) << san.output;
  EXPECT_THAT(san.output, HasSubstr("DNS:localhost, IP Address:127.0.0.1\n"));
  Remove(f->dir);
}

TEST(GenerateTlsFilesTest, EachCallMakesFreshFiles) {
  auto a = GenerateTlsFiles(::testing::TempDir(), absl::Now() + kTimeout);
  auto b = GenerateTlsFiles(::testing::TempDir(), absl::Now() + kTimeout);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_NE(a->dir, b->dir);
  // b's server certificate does not chain to a's CA: each run has its own keys.
  EXPECT_EQ(OpenSsl({"verify", "-CAfile", a->ca_cert, b->server_cert}).exit_code, 2);
  Remove(a->dir);
  Remove(b->dir);
}

TEST(GenerateTlsFilesTest, MissingParentIsInternal) {
  EXPECT_THAT(GenerateTlsFiles("/nonexistent/flashcp", absl::Now() + kTimeout),
              StatusIs(absl::StatusCode::kInternal,
                       StartsWith("mkdtemp /nonexistent/flashcp/flashcp_tls_")));
}

}  // namespace
}  // namespace flashcp::tests::testing
