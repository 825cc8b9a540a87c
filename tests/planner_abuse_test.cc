// flashcp-planner under abuse (issue 12 items 2, 11 and 14), against the real
// binary on port 0: the fd limit raised at start, silent and idle connections
// closed, a dead listener reported by health, /metrics served while silent
// connections are held, and log lines that clients cause rate-limited. Every
// wait has a deadline.
#include <sys/resource.h>
#include <unistd.h>

#include <dirent.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "proto/rpc/grpc_status.h"
#include "tests/testing/grpc_probes.h"
#include "tests/testing/http.h"
#include "tests/testing/idle_connections.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/subprocess.h"

namespace flashcp {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::flashcp::tests::testing::HealthStatus;
using ::flashcp::tests::testing::IdleConnections;
using ::flashcp::tests::testing::PlannerProcess;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared

absl::Time Deadline() { return absl::Now() + kTimeout; }

std::unique_ptr<PlannerProcess> Start(const std::vector<std::string>& args) {
  return PlannerProcess::StartOrFail(FLASHCP_PLANNER_BIN, args, kTimeout);
}

// A channel with a connection of its own: gRPC otherwise shares one
// connection between channels to the same target.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

absl::Status Plan53(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout) {
  v1::PlanRequest r;
  r.add_doc_lens(5);
  r.add_doc_lens(3);
  r.set_cp_size(2);
  r.set_strategy("ring");
  v1::PlanResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return proto::rpc::FromGrpcStatus(v1::Planner::NewStub(channel)->Plan(&context, r, &response));
}

// "Max open files  SOFT  HARD  files" of /proc/PID/limits.
std::pair<std::string, std::string> OpenFilesLimit(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/limits"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream fields(line.substr(14));
    std::string soft, hard;
    fields >> soft >> hard;
    return {soft, hard};
  }
  return {"?", "?"};
}

int OpenFds(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

TEST(PlannerAbuseTest, RaisesItsSoftFdLimitToTheHardLimitAtStart) {
  rlimit mine{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_max <= 64) GTEST_SKIP() << "hard RLIMIT_NOFILE is only " << mine.rlim_max;
  // The child inherits a soft limit of 64; the test's own is restored at once.
  rlimit low = mine;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::unique_ptr<PlannerProcess> p = Start({});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &mine), 0);
  ASSERT_NE(p, nullptr);
  const std::string hard =
      mine.rlim_max == RLIM_INFINITY ? "unlimited" : absl::StrCat(mine.rlim_max);
  EXPECT_EQ(OpenFilesLimit(p->process().pid()), std::make_pair(hard, hard));
  EXPECT_THAT(p->Terminate(), IsOk());
}

// A TCP connection that never speaks HTTP/2 is closed after
// --handshake_timeout (gRPC's default is 120 s).
TEST(PlannerAbuseTest, SilentConnectionsAreClosedAfterTheHandshakeTimeout) {
  std::unique_ptr<PlannerProcess> p = Start({"--handshake_timeout", "300ms"});
  ASSERT_NE(p, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(p->grpc_address(), 5, Deadline()), IsOk());
  EXPECT_EQ(idle.AwaitClosedByPeer(absl::Now() + absl::Seconds(20)), 5);
  EXPECT_THAT(p->Terminate(), IsOk());
}

// A connection with no call for --max_connection_idle gets a GOAWAY: the
// client's channel goes back to IDLE.
TEST(PlannerAbuseTest, IdleConnectionsAreClosedAfterMaxConnectionIdle) {
  std::unique_ptr<PlannerProcess> p = Start({"--max_connection_idle", "300ms"});
  ASSERT_NE(p, nullptr);
  std::shared_ptr<grpc::Channel> channel = OwnChannel(p->grpc_address());
  ASSERT_THAT(Plan53(channel, kTimeout), IsOk());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  grpc_connectivity_state state = channel->GetState(false);
  while (state != GRPC_CHANNEL_IDLE && absl::Now() < deadline) {
    channel->WaitForStateChange(state, absl::ToChronoTime(deadline));
    state = channel->GetState(false);
  }
  EXPECT_EQ(state, GRPC_CHANNEL_IDLE);
  ASSERT_THAT(Plan53(channel, kTimeout), IsOk());  // and it reconnects
  EXPECT_THAT(p->Terminate(), IsOk());
}

// Issue 31 item 7 (first seen as issue 12 item 2): after one accept4()
// EMFILE, gRPC 1.51's listener accepted nothing ever again; health said
// NOT_SERVING and nothing revived it. The planner's fd limit is lowered
// (prlimit on the child) to a few above what it holds, then more silent
// connections than that arrive. The planner sees the stall, rebuilds its
// server on the same port (closing the flood's connections), and serves new
// clients again within seconds, the flood's sockets still open on this side.
TEST(PlannerAbuseTest, AListenerKilledByEmfileComesBack) {
  tests::testing::Subprocess::Options merged;
  merged.merge_stderr = true;  // its log, to see the rebuild
  absl::StatusOr<std::unique_ptr<PlannerProcess>> started = PlannerProcess::Start(
      FLASHCP_PLANNER_BIN,
      {"--listener_check_interval", "100ms", "--listener_stall_checks", "3",
       "--handshake_timeout", "10m"},
      kTimeout, merged);
  ASSERT_THAT(started.status(), IsOk());
  PlannerProcess& p = **started;
  std::shared_ptr<grpc::Channel> existing = OwnChannel(p.grpc_address());
  ASSERT_THAT(Plan53(existing, kTimeout), IsOk());

  const pid_t pid = p.process().pid();
  const int held = OpenFds(pid);
  ASSERT_GT(held, 0);
  const rlimit low{static_cast<rlim_t>(held + 16), static_cast<rlim_t>(held + 16)};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &low, nullptr), 0);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(p.grpc_address(), 32, Deadline()), IsOk());

  bool rebuilt = false;
  while (!rebuilt) {
    const absl::StatusOr<std::string> line = p.process().ReadLine(Deadline());
    if (!line.ok()) break;
    rebuilt = absl::StrContains(*line, "health NOT_SERVING; rebuilding the server on the same port");
  }
  EXPECT_TRUE(rebuilt);
  // New clients are served again: each try has 2 s, all of them 20 s.
  const absl::Time served_by = absl::Now() + absl::Seconds(20);
  absl::Status plan = Plan53(OwnChannel(p.grpc_address()), absl::Seconds(2));
  while (!plan.ok() && absl::Now() < served_by) {
    plan = Plan53(OwnChannel(p.grpc_address()), absl::Seconds(2));
  }
  EXPECT_THAT(plan, IsOk());
  EXPECT_EQ(tests::testing::CheckHealth(OwnChannel(p.grpc_address()), "", Deadline())
                .value_or(HealthStatus::kUnknown),
            HealthStatus::kServing);
  EXPECT_THAT(Plan53(existing, kTimeout), IsOk());  // the old channel reconnects
  idle.CloseAll();
  EXPECT_THAT(p.Terminate(), IsOk());
}

// Issue 12 item 11: prometheus-cpp's default Exposer has two threads, so two
// silent TCP connections held every scrape for civetweb's 30 s timeout.
TEST(PlannerAbuseTest, TwoSilentConnectionsDoNotStopAScrape) {
  std::unique_ptr<PlannerProcess> p = Start({});
  ASSERT_NE(p, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(p->metrics_address(), 2, Deadline()), IsOk());
  absl::StatusOr<std::string> body = p->ScrapeMetrics(absl::Seconds(10));
  ASSERT_THAT(body, IsOk());
  EXPECT_THAT(*body, HasSubstr("flashcp_planner_build_info{"));
  EXPECT_THAT(p->Terminate(), IsOk());
}

// Issue 31 item 8: civetweb served /metrics one connection per thread (8
// threads) and waited up to --metrics_request_timeout (2 s) for each
// connection's request, so 40 silent connections held a scrape for about
// 10 s, Prometheus's default scrape timeout. The endpoint now polls every
// connection on one thread: the scrape is answered at once.
TEST(PlannerAbuseTest, FortySilentConnectionsDoNotDelayAScrape) {
  std::unique_ptr<PlannerProcess> p = Start({});
  ASSERT_NE(p, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(p->metrics_address(), 40, Deadline()), IsOk());
  absl::StatusOr<std::string> body = p->ScrapeMetrics(absl::Seconds(4));
  ASSERT_THAT(body, IsOk());
  EXPECT_THAT(*body, HasSubstr("flashcp_planner_build_info{"));
  EXPECT_THAT(p->Terminate(), IsOk());
}

// Issue 31 item 7: the liveness probe called grpc.health.v1 on the client
// port, which a connection flood can leave out of fds (with the rebuild off,
// for good); a probe held past its threshold restarted the pod. The probe is
// now GET /healthz on the metrics port, which keeps one fd in reserve: with
// the planner out of fds and its gRPC listener dead, /healthz still answers.
TEST(PlannerAbuseTest, TheLivenessProbeAnswersWhileTheClientPortIsOutOfFds) {
  std::unique_ptr<PlannerProcess> p = Start({"--listener_check_interval", "0",
                                             "--handshake_timeout", "10m"});
  ASSERT_NE(p, nullptr);
  const pid_t pid = p->process().pid();
  const int held = OpenFds(pid);
  ASSERT_GT(held, 0);
  const int limit = held + 16;
  const rlimit low{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &low, nullptr), 0);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(p->grpc_address(), 32, Deadline()), IsOk());
  const absl::Time full_by = Deadline();
  while (OpenFds(pid) < limit && absl::Now() < full_by) {
    absl::SleepFor(absl::Milliseconds(20));  // a bounded poll: gRPC accepts on its own
  }
  ASSERT_GE(OpenFds(pid), limit);
  absl::StatusOr<tests::testing::HttpResponse> live =
      tests::testing::HttpGet(p->metrics_address(), "/healthz", absl::Now() + absl::Seconds(10));
  ASSERT_THAT(live, IsOk());
  EXPECT_EQ(live->status, 200);
  EXPECT_EQ(live->body, "ok\n");
  // The gRPC port is still dead (nothing rebuilds it here).
  EXPECT_THAT(Plan53(OwnChannel(p->grpc_address()), absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  idle.CloseAll();
  EXPECT_THAT(p->Terminate(), IsOk());
}

// A unary Plan call whose request is `bytes` as they are; its status.
absl::Status RawPlan(std::shared_ptr<grpc::Channel> channel, const std::string& bytes) {
  grpc::GenericStub stub(std::move(channel));
  grpc::Slice slice(bytes);
  return proto::rpc::FromGrpcStatus(tests::testing::RawUnaryCall(
      stub, "/flashcp.v1.Planner/Plan", grpc::ByteBuffer(&slice, 1), Deadline()));
}

// Issue 12 item 14: protobuf logs an ERROR line for each message with invalid
// UTF-8 in a string field (10,000 requests, 10,000 lines). The planner lets
// kProtobufLogLines (10) through per minute; 50 such requests in less than a
// minute write exactly 10.
TEST(PlannerAbuseTest, InvalidUtf8LogsAreRateLimited) {
  absl::StatusOr<std::unique_ptr<PlannerProcess>> p = PlannerProcess::Start(
      FLASHCP_PLANNER_BIN, {}, kTimeout, tests::testing::Subprocess::Options{.merge_stderr = true});
  ASSERT_THAT(p, IsOk());
  v1::PlanRequest valid;
  valid.add_doc_lens(5);
  valid.add_doc_lens(3);
  valid.set_cp_size(2);
  // strategy (field 4, length-delimited) = "\xff\xfe": not UTF-8.
  const std::string bytes = valid.SerializeAsString() + std::string("\x22\x02\xff\xfe", 4);
  std::shared_ptr<grpc::Channel> channel = (*p)->NewChannel();
  constexpr int kRequests = 50;
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(RawPlan(channel, bytes),
              absl::InvalidArgumentError("could not parse flashcp.v1.PlanRequest"))
        << i;
  }
  ASSERT_THAT(Plan53(channel, kTimeout), IsOk());  // still serving
  EXPECT_THAT((*p)->Terminate(), IsOk());
  absl::StatusOr<std::string> output = (*p)->process().ReadAll(Deadline());
  ASSERT_THAT(output, IsOk());
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(*output, '\n')) {
    if (!absl::StrContains(line, "contains invalid UTF-8 data")) continue;
    ++lines;
    EXPECT_THAT(std::string(line),
                HasSubstr("] protobuf: String field 'flashcp.v1.PlanRequest.strategy' contains "
                          "invalid UTF-8 data when parsing a protocol buffer."));
  }
  EXPECT_EQ(lines, 10) << *output;
}

TEST(PlannerAbuseTest, BadBoundFlagsAreUsageErrorsNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--handshake_timeout", "0"}, "--handshake_timeout: must be at least 1ms"},
      {{"--max_connection_idle", "-1s"}, "--max_connection_idle: must be in [0, 365d], got -1s"},
      {{"--grpc_max_threads", "1"}, "--grpc_max_threads: must be at least 2, got 1"},
      {{"--listener_stall_checks", "0"}, "--listener_stall_checks: must be at least 1, got 0"},
      {{"--metrics_max_connections", "0"},
       "--metrics_max_connections: must be in [1, 65536], got 0"},
      {{"--metrics_request_timeout", "0"},
       "--metrics_request_timeout: must be in [1ms, 10m], got 0"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {FLASHCP_PLANNER_BIN, "--listen", "127.0.0.1:0", "--metrics",
                                     "127.0.0.1:0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<tests::testing::CommandResult> r =
        tests::testing::RunCommand(argv, "", Deadline());
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->exit_code, 2) << flags[0];
    EXPECT_EQ(r->output, absl::StrCat("flashcp-planner: ", message,
                                      "\nRun 'flashcp-planner --help' for the flags.\n"));
  }
}

}  // namespace
}  // namespace flashcp
