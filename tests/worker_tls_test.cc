// flashcp-worker against a TLS planner: the real flashcp-planner on port 0
// with mTLS (--tls_cert/--tls_key/--tls_client_ca; certificates made by
// openssl at test time, tests/testing/tls_certs.h) and a group of real
// flashcp-worker processes (--device cpu, small shapes, a few steps) whose
// rendezvous and plans both go over the worker's TLS channel. Nothing sleeps:
// waits are on the WORKER and LISTENING lines and on process exit, each with a
// deadline.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tls_certs.h"
#include "tests/testing/worker_process.h"

namespace flashcp {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::tests::testing::GenerateTlsFiles;
using ::flashcp::tests::testing::PlannerProcess;
using ::flashcp::tests::testing::RunCommand;
using ::flashcp::tests::testing::TlsFiles;
using ::flashcp::tests::testing::WorkerProcess;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared
constexpr int kRanks = 2;
constexpr int kSteps = 3;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

class WorkerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto files = GenerateTlsFiles(::testing::TempDir(), In(kTimeout));
    ASSERT_THAT(files, IsOk());
    tls_ = *std::move(files);
    auto planner = PlannerProcess::Start(
        FLASHCP_PLANNER_BIN,
        {"--threads", "1", "--tls_cert", tls_.server_cert, "--tls_key", tls_.server_key,
         "--tls_client_ca", tls_.ca_cert},
        kTimeout);
    ASSERT_THAT(planner, IsOk());
    planner_ = *std::move(planner);
  }
  void TearDown() override {
    if (!tls_.dir.empty()) {
      EXPECT_THAT(RunCommand({"/bin/rm", "-rf", tls_.dir}, "", In(kTimeout)), IsOk());
    }
  }

  // Flags of rank `rank` of a `world_size`-rank CPU group `group` on the
  // planner: small shapes, kSteps steps, collectives bounded by `timeout_s`.
  std::vector<std::string> WorkerArgs(int rank, int world_size, const std::string& group,
                                      int timeout_s) const {
    return {"--rank",       absl::StrCat(rank),
            "--world_size", absl::StrCat(world_size),
            "--group",      group,
            "--planner",    planner_->grpc_address(),
            "--device",     "cpu",
            "--context",    "1024",
            "--heads",      "1",
            "--head_dim",   "16",
            "--steps",      absl::StrCat(kSteps),
            "--timeout_s",  absl::StrCat(timeout_s)};
  }
  // The TLS flags of a worker the mTLS planner accepts.
  std::vector<std::string> MutualTlsArgs() const {
    return {"--tls_ca", tls_.ca_cert, "--tls_cert", tls_.client_cert,
            "--tls_key=" + tls_.client_key};
  }

  TlsFiles tls_;
  std::unique_ptr<PlannerProcess> planner_;
};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(WorkerTlsTest, GroupRunsItsStepsOverMutualTls) {
  std::vector<WorkerProcess> ws;
  for (int r = 0; r < kRanks; ++r) {
    std::vector<std::string> args = Concat(WorkerArgs(r, kRanks, "tls", 30), MutualTlsArgs());
    if (r == 1) {  // the certificate names localhost too; 127.0.0.1 is dialled
      args.push_back("--tls_server_name");
      args.push_back("localhost");
    }
    auto w = WorkerProcess::Start(FLASHCP_WORKER_BIN, args, In(kTimeout));
    ASSERT_THAT(w, IsOk());
    ws.push_back(*std::move(w));
  }
  for (int r = 0; r < kRanks; ++r) {
    auto code = ws[r].Finish(In(kTimeout));
    ASSERT_THAT(code, IsOk()) << "rank " << r;
    EXPECT_EQ(*code, 0) << "rank " << r << ": " << ws[r].output;
    EXPECT_THAT(ws[r].output, HasSubstr(absl::StrCat("flashcp-worker rank ", r, ": done")));
  }
  // The driver planned and ran every step through the planner.
  EXPECT_THAT(ws[0].output, HasSubstr(absl::StrCat("RUN {\"strategy\":\"flashcp\",\"scheme\":"
                                                   "\"allgather\",\"steps\":",
                                                   kSteps, ",")));
  EXPECT_THAT(planner_->Terminate(kTimeout), IsOk());
}

// No client certificate for the mTLS planner (or no TLS at all): every Join
// fails its handshake, so the worker gives up when --timeout_s runs out and
// exits 1 naming the rendezvous call and the connection failure (gRPC's
// "failed to connect to all addresses" with the planner's address).
TEST_F(WorkerTlsTest, WorkerTheMutualTlsPlannerRefusesExitsWithinItsTimeout) {
  constexpr int kTimeoutS = 3;
  const std::vector<std::vector<std::string>> refused = {
      {"--tls_ca", tls_.ca_cert},  // TLS, but no client certificate
      {},                          // plaintext
  };
  for (const std::vector<std::string>& tls : refused) {
    SCOPED_TRACE(tls.empty() ? "plaintext" : "no client certificate");
    const absl::Time start = absl::Now();
    auto w = WorkerProcess::Start(FLASHCP_WORKER_BIN,
                                  Concat(WorkerArgs(0, 1, "refused", kTimeoutS), tls),
                                  In(kTimeout));
    ASSERT_THAT(w, IsOk());
    auto code = w->Finish(In(kTimeout));
    ASSERT_THAT(code, IsOk());
    EXPECT_EQ(*code, 1) << w->output;
    // gRPC's last reason after the address ("Socket closed", a handshake
    // error) depends on which side of the handshake gives up first.
    EXPECT_THAT(w->output, HasSubstr(absl::StrCat(
                               "flashcp-worker rank 0: UNAVAILABLE: rendezvous Join: failed to "
                               "connect to all addresses; last error: UNAVAILABLE: ipv4:",
                               planner_->grpc_address(), ": ")));
    // Join is retried (backoff up to 1 s) until --timeout_s; one more
    // attempt's deadline and the process start-up are the slack.
    const absl::Duration took = absl::Now() - start;
    EXPECT_GE(took, absl::Seconds(kTimeoutS - 1));
    EXPECT_LT(took, absl::Seconds(kTimeoutS + 20));
  }
}

// The TLS flags are checked as flashcp-client checks them, with its messages
// (client::internal::TlsOptionsFromGiven, WithTls); a bad value is a failure
// before the worker binds or joins anything.
TEST_F(WorkerTlsTest, BadTlsFlagsNameTheFlag) {
  const std::string missing = tls_.dir + "/no_such_ca.pem";
  struct Case {
    std::vector<std::string> tls;
    int exit_code;  // 2: a usage error, the whole output; 1: a file, a log line
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"--tls_ca", tls_.ca_cert, "--tls_cert", tls_.client_cert}, 2,
       "--tls_cert, --tls_key: set both or neither"},
      {{"--tls_server_name", "localhost"}, 2, "--tls_server_name: needs --tls_ca"},
      {{"--tls_key", tls_.client_key}, 2, "--tls_key: needs --tls_ca"},
      {{"--tls_ca="}, 2, "--tls_ca: empty value"},
      {{"--tls_ca", tls_.ca_cert, "--tls_server_name="}, 2, "--tls_server_name: empty value"},
      {{"--tls_ca", missing}, 1,
       absl::StrCat("NOT_FOUND: --tls_ca: cannot open \"", missing,
                    "\": No such file or directory")},
      {{"--tls_ca", tls_.client_key}, 1,
       absl::StrCat("INVALID_ARGUMENT: --tls_ca: \"", tls_.client_key,
                    "\" holds no PEM CERTIFICATE")},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {FLASHCP_WORKER_BIN, "--planner", planner_->grpc_address()};
    argv.insert(argv.end(), c.tls.begin(), c.tls.end());
    auto r = RunCommand(argv, "", In(kTimeout));
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->exit_code, c.exit_code) << c.want;
    if (c.exit_code == 2) {
      EXPECT_EQ(r->output, absl::StrCat("flashcp-worker: ", c.want,
                                        "\nRun 'flashcp-worker --help' for the flags.\n"));
    } else {
      EXPECT_THAT(r->output, HasSubstr(absl::StrCat("flashcp-worker rank 0: ", c.want, "\n")));
    }
    EXPECT_THAT(r->output, ::testing::Not(HasSubstr("WORKER rank=")));
  }
}

}  // namespace
}  // namespace flashcp
