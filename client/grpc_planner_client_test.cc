// WithTls: which files it reads, and its exact errors. The PEM files here are
// placeholders with the right BEGIN lines: WithTls checks the kind of block
// and leaves parsing to the TLS handshake, which
// tests/planner_tls_test.cc covers against the real planner.
#include "client/grpc_planner_client.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::client {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;

constexpr char kCert[] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
constexpr char kKey[] = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";
constexpr char kEcKey[] =
    "-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\n";

// A file under the test's temp dir holding `text`; its path.
std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/with_tls_", getpid(), "_", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(WithTlsTest, CaOnlyAndMutualTlsKeepTheOtherOptions) {
  const std::string ca = WriteFile("ca.pem", kCert);
  const std::string cert = WriteFile("client.pem", kCert);
  const std::string key = WriteFile("client.key", kKey);
  const std::string ec_key = WriteFile("client_ec.key", kEcKey);
  ChannelOptions base;
  base.own_connection = true;
  base.max_receive_message_bytes = 1234;

  auto ca_only = WithTls(base, {.ca_file = ca});
  ASSERT_THAT(ca_only, IsOk());
  EXPECT_NE(ca_only->credentials, nullptr);
  EXPECT_EQ(ca_only->tls_server_name, "");
  EXPECT_TRUE(ca_only->own_connection);
  EXPECT_EQ(ca_only->max_receive_message_bytes, 1234);

  for (const std::string& k : {key, ec_key}) {
    auto mtls = WithTls(base, {.ca_file = ca, .cert_file = cert, .key_file = k,
                               .server_name = "planner.internal"});
    ASSERT_THAT(mtls, IsOk());
    EXPECT_NE(mtls->credentials, nullptr);
    EXPECT_EQ(mtls->tls_server_name, "planner.internal");
  }
  // The base is a copy: still plaintext.
  EXPECT_EQ(base.credentials, nullptr);
}

TEST(WithTlsTest, ErrorsNameTheFlagAndThePath) {
  const std::string ca = WriteFile("ca2.pem", kCert);
  const std::string cert = WriteFile("client2.pem", kCert);
  const std::string key = WriteFile("client2.key", kKey);
  const std::string empty = WriteFile("empty.pem", "");
  const std::string missing = absl::StrCat(::testing::TempDir(), "/with_tls_no_such_file.pem");
  struct Case {
    TlsOptions tls;
    absl::StatusCode code;
    std::string message;
  };
  const Case cases[] = {
      {{}, absl::StatusCode::kInvalidArgument,
       "--tls_ca: required for TLS (the CA bundle the server's certificate chains to)"},
      {{.ca_file = ca, .cert_file = cert}, absl::StatusCode::kInvalidArgument,
       "--tls_cert, --tls_key: set both or neither"},
      {{.ca_file = ca, .key_file = key}, absl::StatusCode::kInvalidArgument,
       "--tls_cert, --tls_key: set both or neither"},
      {{.ca_file = missing}, absl::StatusCode::kNotFound,
       absl::StrCat("--tls_ca: cannot open \"", missing, "\": No such file or directory")},
      {{.ca_file = ca, .cert_file = missing, .key_file = key}, absl::StatusCode::kNotFound,
       absl::StrCat("--tls_cert: cannot open \"", missing, "\": No such file or directory")},
      {{.ca_file = ca, .cert_file = cert, .key_file = missing}, absl::StatusCode::kNotFound,
       absl::StrCat("--tls_key: cannot open \"", missing, "\": No such file or directory")},
      {{.ca_file = empty}, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls_ca: \"", empty, "\" holds no PEM CERTIFICATE")},
      {{.ca_file = key}, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls_ca: \"", key, "\" holds no PEM CERTIFICATE")},
      {{.ca_file = ca, .cert_file = key, .key_file = key}, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls_cert: \"", key, "\" holds no PEM CERTIFICATE")},
      {{.ca_file = ca, .cert_file = cert, .key_file = cert}, absl::StatusCode::kInvalidArgument,
       absl::StrCat("--tls_key: \"", cert, "\" holds no PEM PRIVATE KEY")},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(WithTls({}, c.tls), StatusIs(c.code, c.message)) << c.message;
  }
}

}  // namespace
}  // namespace flashcp::client
