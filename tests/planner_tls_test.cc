// TLS and mTLS end to end: the real flashcp-planner on port 0 with
// --tls_cert/--tls_key (and --tls_client_ca), certificates made by openssl at
// test time (tests/testing/tls_certs.h), and the C++ client library,
// flashcp-client and flashcp-loadgen speaking TLS to it. Every refusal is
// checked for its exact status code. Nothing sleeps: waits are on the
// LISTENING line, on RPC answers or on process exit, each with a deadline.
#include <algorithm>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_planner_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/grpc_probes.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/expected_plans.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tls_certs.h"

namespace flashcp::client {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::flashcp::tests::testing::CheckHealth;
using ::flashcp::tests::testing::GenerateTlsFiles;
using ::flashcp::tests::testing::HealthStatus;
using ::flashcp::tests::testing::PlannerProcess;
using ::flashcp::tests::testing::RunCommand;
using ::flashcp::tests::testing::TlsFiles;
using ::flashcp::tests::testing::ToolRun;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared
// A call that must fail fails fast (no wait_for_ready): this only bounds it.
const CallOptions kCall = {.timeout = absl::Seconds(30)};

class PlannerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto files = GenerateTlsFiles(::testing::TempDir(), absl::Now() + kTimeout);
    ASSERT_THAT(files, IsOk());
    tls_ = *std::move(files);
  }
  void TearDown() override {
    if (!tls_.dir.empty()) {
      EXPECT_THAT(RunCommand({"/bin/rm", "-rf", tls_.dir}, "", absl::Now() + kTimeout), IsOk());
    }
  }

  // The planner serving TLS with the generated server certificate; with
  // `mutual`, it also requires a client certificate signed by the test CA.
  std::unique_ptr<PlannerProcess> StartPlanner(bool mutual) {
    std::vector<std::string> args = {"--tls_cert", tls_.server_cert, "--tls_key", tls_.server_key};
    if (mutual) {
      args.push_back("--tls_client_ca");
      args.push_back(tls_.ca_cert);
    }
    return PlannerProcess::StartOrFail(FLASHCP_PLANNER_BIN, args, kTimeout);
  }

  // A channel with WithTls(`tls`), which must succeed.
  static std::shared_ptr<grpc::Channel> TlsChannel(const std::string& target,
                                                   const TlsOptions& tls) {
    auto options = WithTls({}, tls);
    EXPECT_THAT(options, IsOk());
    return options.ok() ? MakeChannel(target, *options) : nullptr;
  }

  TlsFiles tls_;
};

v1::PlanRequest Ring53() {
  v1::PlanRequest r;
  r.set_batch_id(42);
  r.add_doc_lens(5);
  r.add_doc_lens(3);
  r.set_cp_size(2);
  r.set_strategy("ring");
  return r;
}

// Ring on [5, 3], N = 2, worked by hand (tests/testing/expected_plans.h): the
// plan came through the TLS connection intact.
void ExpectRingPlanFor53(const PlanResult& result) {
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->batch_id(), 42u);
  tests::testing::ExpectRingPlanFor53(*result);
}

// ---- the C++ client library ----------------------------------------------------

TEST_F(PlannerTlsTest, TlsClientGetsTheExactPlan) {
  auto planner = StartPlanner(/*mutual=*/false);
  ASSERT_NE(planner, nullptr);
  {
    GrpcPlannerClient client(TlsChannel(planner->grpc_address(), {.ca_file = tls_.ca_cert}));
    ExpectRingPlanFor53(client.Plan(Ring53(), kCall));
    auto info = client.GetServerInfo(kCall);
    ASSERT_THAT(info, IsOk());
    EXPECT_EQ(info->api_version(), "flashcp.v1");
  }
  // A TLS planner drains and exits 0 like a plaintext one. (The client is
  // gone first: an idle connection holds the drain for about 5 s, with or
  // without TLS.)
  EXPECT_EQ(planner->Terminate(kTimeout).value_or(-1), 0);
}

TEST_F(PlannerTlsTest, PlaintextClientIsUnavailable) {
  auto planner = StartPlanner(/*mutual=*/false);
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient client(MakeChannel(planner->grpc_address()));
  EXPECT_THAT(client.Plan(Ring53(), kCall), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(client.GetServerInfo(kCall), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(PlannerTlsTest, ClientTrustingAnotherCaIsUnavailable) {
  auto planner = StartPlanner(/*mutual=*/false);
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient client(TlsChannel(planner->grpc_address(), {.ca_file = tls_.other_ca_cert}));
  EXPECT_THAT(client.Plan(Ring53(), kCall), StatusIs(absl::StatusCode::kUnavailable));
}

// The server certificate names localhost and 127.0.0.1: dialling 127.0.0.1
// with the name "localhost" passes, with a name it does not carry fails.
TEST_F(PlannerTlsTest, ServerNameOverrideIsChecked) {
  auto planner = StartPlanner(/*mutual=*/false);
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient good(TlsChannel(planner->grpc_address(),
                                    {.ca_file = tls_.ca_cert, .server_name = "localhost"}));
  ExpectRingPlanFor53(good.Plan(Ring53(), kCall));
  GrpcPlannerClient bad(TlsChannel(planner->grpc_address(),
                                   {.ca_file = tls_.ca_cert, .server_name = "planner.example"}));
  EXPECT_THAT(bad.Plan(Ring53(), kCall), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(PlannerTlsTest, MutualTlsNeedsTheCaSignedClientCertificate) {
  auto planner = StartPlanner(/*mutual=*/true);
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient without(TlsChannel(planner->grpc_address(), {.ca_file = tls_.ca_cert}));
  EXPECT_THAT(without.Plan(Ring53(), kCall), StatusIs(absl::StatusCode::kUnavailable));

  GrpcPlannerClient with(TlsChannel(planner->grpc_address(), {.ca_file = tls_.ca_cert,
                                                              .cert_file = tls_.client_cert,
                                                              .key_file = tls_.client_key}));
  ExpectRingPlanFor53(with.Plan(Ring53(), kCall));
  // A stream over the same connection works too.
  std::unique_ptr<PlanStream> stream = with.OpenPlanStream(kCall);
  ASSERT_TRUE(stream->Write(Ring53()));
  ASSERT_TRUE(stream->WritesDone());
  v1::PlanResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ExpectRingPlanFor53(response);
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_THAT(stream->Finish(), IsOk());
}

TEST_F(PlannerTlsTest, HealthCheckOverTls) {
  auto planner = StartPlanner(/*mutual=*/true);
  ASSERT_NE(planner, nullptr);
  auto channel = TlsChannel(planner->grpc_address(), {.ca_file = tls_.ca_cert,
                                                      .cert_file = tls_.client_cert,
                                                      .key_file = tls_.client_key});
  for (const std::string service : {"", "flashcp.v1.Planner"}) {
    auto health = CheckHealth(channel, service, absl::Now() + kTimeout);
    ASSERT_THAT(health, IsOk()) << service;
    EXPECT_EQ(*health, HealthStatus::kServing) << service;
  }
  EXPECT_THAT(CheckHealth(planner->NewChannel(), "", absl::Now() + kTimeout),
              StatusIs(absl::StatusCode::kUnavailable));
}

// ---- flashcp-client and flashcp-loadgen ------------------------------------------

// Runs a tool with `input` on stdin; stdout and stderr kept apart.
ToolRun RunTool(const std::vector<std::string>& argv, const std::string& input = "") {
  return tests::testing::RunTool(argv, input, absl::Now() + kTimeout, ::testing::TempDir());
}

TEST_F(PlannerTlsTest, FlashcpClientOverMutualTlsPrintsFlashcpPlansJson) {
  auto planner = StartPlanner(/*mutual=*/true);
  ASSERT_NE(planner, nullptr);
  const std::string input = "5,3\n60000 30000 20000 21072\n# comment\n4096,100,7\n";
  const ToolRun want = RunTool({FLASHCP_PLAN_BIN, "--quiet", "--cp", "4", "--strategy", "flashcp"},
                               input);
  const ToolRun got = RunTool({FLASHCP_CLIENT_BIN, "--server", planner->grpc_address(), "--cp",
                               "4", "--strategy", "flashcp", "--tls_ca", tls_.ca_cert,
                               "--tls_cert", tls_.client_cert, "--tls_key=" + tls_.client_key},
                              input);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(got.err, "");
  EXPECT_EQ(std::count(got.out.begin(), got.out.end(), '\n'), 3);
  EXPECT_EQ(got.out, want.out);
}

TEST_F(PlannerTlsTest, FlashcpClientTlsErrors) {
  auto planner = StartPlanner(/*mutual=*/true);
  ASSERT_NE(planner, nullptr);
  const std::string server = planner->grpc_address();
  // A bad combination of flags: exit 2, the flags named.
  ToolRun run = RunTool({FLASHCP_CLIENT_BIN, "--server", server, "--tls_ca", tls_.ca_cert,
                         "--tls_cert", tls_.client_cert},
                        "5,3\n");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err,
            "flashcp-client: --tls_cert, --tls_key: set both or neither\n"
            "Run 'flashcp-client --help' for the flags.\n");
  run = RunTool({FLASHCP_CLIENT_BIN, "--server", server, "--tls_server_name", "localhost"},
                "5,3\n");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err, "flashcp-client: --tls_server_name: needs --tls_ca\n"
            "Run 'flashcp-client --help' for the flags.\n");
  // A file that is not there: exit 1, the flag and the path named.
  const std::string missing = tls_.dir + "/no_such_ca.pem";
  run = RunTool({FLASHCP_CLIENT_BIN, "--server", server, "--tls_ca", missing}, "5,3\n");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, absl::StrCat("flashcp-client: --tls_ca: cannot open \"", missing,
                                  "\": No such file or directory\n"));
  // No client certificate for the mTLS server: the handshake never succeeds,
  // so the client gives up after --connect_timeout and plans nothing.
  run = RunTool({FLASHCP_CLIENT_BIN, "--server", server, "--tls_ca", tls_.ca_cert,
                 "--connect_timeout", "2"},
                "5,3\n");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_THAT(run.err, StartsWith(absl::StrCat("flashcp-client: cannot reach ", server,
                                               " within 2s: DEADLINE_EXCEEDED: ")));
  EXPECT_THAT(run.err, HasSubstr("; last connection error: UNAVAILABLE: "));
}

TEST_F(PlannerTlsTest, FlashcpLoadgenOverMutualTls) {
  auto planner = StartPlanner(/*mutual=*/true);
  ASSERT_NE(planner, nullptr);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "unary");
    std::vector<std::string> argv = {
        FLASHCP_LOADGEN_BIN, "--server",   planner->grpc_address(), "--max_requests", "40",
        "--duration",        "60",         "--strategy",            "ring",           "--json",
        "--concurrency",     "2",          "--tls_ca",              tls_.ca_cert,     "--tls_cert",
        tls_.client_cert,    "--tls_key",  tls_.client_key};
    if (stream) argv.push_back("--stream");
    const ToolRun run = RunTool(argv);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_TRUE(std::regex_search(run.out, std::regex("\"requests\":40,\"errors\":0,")))
        << run.out;
  }
}

}  // namespace
}  // namespace flashcp::client
