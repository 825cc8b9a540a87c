// Integration tests of the C++ client library, flashcp-client and
// flashcp-loadgen against the real flashcp-planner on port 0. flashcp-client's
// output is checked line for line against flashcp-plan's for the same batches.
// Nothing sleeps for luck: waits are on the LISTENING line, on RPC answers or
// on a retry hook, each with a deadline.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/grpc_planner_client.h"
#include "client/pipelined_planner.h"
#include "client/retrying_planner_client.h"
#include "core/cli.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/ports.h"
#include "tests/testing/subprocess.h"

namespace flashcp::client {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::flashcp::tests::testing::PlannerProcess;
using ::flashcp::tests::testing::ToolRun;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared

std::unique_ptr<PlannerProcess> StartPlanner(const std::vector<std::string>& args = {}) {
  return PlannerProcess::StartOrFail(FLASHCP_PLANNER_BIN, args, kTimeout);
}

// A tool's run: exit code, stdout, and stderr (kept apart through a file).
ToolRun RunTool(const std::vector<std::string>& argv, const std::string& input = "") {
  return tests::testing::RunTool(argv, input, absl::Now() + kTimeout, ::testing::TempDir());
}

v1::PlanRequest Request(std::vector<int64_t> docs, int32_t cp, const std::string& strategy) {
  v1::PlanRequest r;
  for (int64_t d : docs) r.add_doc_lens(d);
  r.set_cp_size(cp);
  r.set_strategy(strategy);
  return r;
}

// Runs `flashcp-plan --quiet ARGS` and `flashcp-client --server SERVER
// CLIENT_EXTRA ARGS`: both exit 0, the client writes nothing to stderr, and its
// stdout equals flashcp-plan's line for line. `pieces`: flashcp-plan's output
// split at '\n' (one per batch, plus the empty piece after the last '\n').
void ExpectClientOutputEqualsPlan(const std::string& server,
                                  const std::vector<std::string>& client_extra,
                                  const std::vector<std::string>& args, size_t pieces) {
  std::vector<std::string> plan_argv = {FLASHCP_PLAN_BIN, "--quiet"};
  plan_argv.insert(plan_argv.end(), args.begin(), args.end());
  std::vector<std::string> client_argv = {FLASHCP_CLIENT_BIN, "--server", server};
  client_argv.insert(client_argv.end(), client_extra.begin(), client_extra.end());
  client_argv.insert(client_argv.end(), args.begin(), args.end());
  const ToolRun want = RunTool(plan_argv);
  const ToolRun got = RunTool(client_argv);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(got.err, "");
  const std::vector<std::string> want_lines = absl::StrSplit(want.out, '\n');
  const std::vector<std::string> got_lines = absl::StrSplit(got.out, '\n');
  ASSERT_EQ(want_lines.size(), pieces);
  EXPECT_EQ(got_lines, want_lines);
}

// ---- flashcp-client against flashcp-plan --------------------------------------

TEST(FlashcpClientCliTest, DatasetOutputEqualsFlashcpPlanLineForLine) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  for (const std::string strategy : {"ring", "llama3"}) {
    SCOPED_TRACE(strategy);
    const std::vector<std::string> common = {"--cp",      "8",       "--strategy", strategy,
                                             "--dataset", "pile",    "--context",  "131072",
                                             "--batches", "24",      "--seed",     "7"};
    ExpectClientOutputEqualsPlan(planner->grpc_address(), {"--inflight", "6"}, common, 25);
  }
}

// --min_shard_tokens means the same to both tools: absent (the default 128),
// 0 (the rule off, sent as -1) and a value of its own.
TEST(FlashcpClientCliTest, MinShardTokensOutputEqualsFlashcpPlan) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"--min_shard_tokens", "0"},
        std::vector<std::string>{"--min_shard_tokens=512"}}) {
    SCOPED_TRACE(extra.empty() ? std::string("absent") : extra.back());
    std::vector<std::string> common = {"--cp",      "16",     "--strategy", "flashcp",
                                       "--dataset", "pile",   "--context",  "131072",
                                       "--batches", "8",      "--seed",     "3"};
    common.insert(common.end(), extra.begin(), extra.end());
    ExpectClientOutputEqualsPlan(planner->grpc_address(), {}, common, 9);
  }
}

TEST(FlashcpClientCliTest, StdinBatchesInInputOrderWithManyInFlight) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  // Sizes vary a lot so that replies could come back out of order.
  std::string input = "# comment\n";
  for (int i = 0; i < 40; ++i) {
    if (i % 2 == 0) {
      absl::StrAppend(&input, 100 + i, ",", 7 * i + 3, " 4096\n");
    } else {
      std::vector<std::string> many(200 + 10 * i, absl::StrCat(i + 1));
      absl::StrAppend(&input, absl::StrJoin(many, " "), "\n");
    }
  }
  const ToolRun want = RunTool({FLASHCP_PLAN_BIN, "--quiet", "--cp", "4", "--strategy", "ring"},
                               input);
  const ToolRun got = RunTool({FLASHCP_CLIENT_BIN, "--server", planner->grpc_address(), "--cp",
                               "4", "--strategy", "ring", "--inflight", "16"},
                              input);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(std::count(got.out.begin(), got.out.end(), '\n'), 40);
  EXPECT_EQ(got.out, want.out);
}

TEST(FlashcpClientCliTest, PerItemErrorsNameTheLineAndTheRestIsPlanned) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  // Line 2 does not parse; line 3 has 2 tokens for 4 ranks (the server's
  // INVALID_ARGUMENT); lines 1 and 4 are good.
  const std::string input = "5,3,9,1\nfive\n1,1\n8 8\n";
  const ToolRun got = RunTool({FLASHCP_CLIENT_BIN, "--server", planner->grpc_address(), "--cp",
                               "4", "--strategy", "ring", "--inflight", "4"},
                              input);
  EXPECT_EQ(got.exit_code, 1);
  const ToolRun good = RunTool({FLASHCP_PLAN_BIN, "--quiet", "--cp", "4", "--strategy", "ring"},
                               "5,3,9,1\n8 8\n");
  ASSERT_EQ(good.exit_code, 0) << good.err;
  // flashcp-client numbers the requests it sent: the good lines are batches 0
  // and 2 (line 3 was sent and refused).
  std::vector<std::string> want_lines = absl::StrSplit(good.out, '\n');
  ASSERT_EQ(want_lines.size(), 3u);
  const std::string batch1 = "{\"batch_id\":1,";
  ASSERT_TRUE(absl::StartsWith(want_lines[1], batch1)) << want_lines[1];
  want_lines[1].replace(0, batch1.size(), "{\"batch_id\":2,");
  EXPECT_EQ(got.out, absl::StrCat(want_lines[0], "\n", want_lines[1], "\n"));
  const std::vector<std::string> err_lines = absl::StrSplit(got.err, '\n');
  ASSERT_EQ(err_lines.size(), 4u) << got.err;
  EXPECT_EQ(err_lines[0],
            "flashcp-client: stdin line 2: INVALID_ARGUMENT: token 0: \"five\" is not a "
            "positive integer");
  EXPECT_THAT(err_lines[1], ::testing::StartsWith(
                                "flashcp-client: stdin line 3: INVALID_ARGUMENT: cp_size"));
  EXPECT_EQ(err_lines[2], "flashcp-client: 2 item(s) failed");
}

// A line longer than core::kMaxLineBytes is refused before it is held (it
// was read whole, however long: /dev/zero grew the client until memory ran
// out), and reading stops there, since its end may never come; the lines
// before it are planned.
TEST(FlashcpClientCliTest, ALineTooLongIsRefusedUnheldAndEndsTheInput) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  const std::string path = ::testing::TempDir() + "/client_long_line.txt";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << "5,3\n";
    const std::string chunk(1 << 20, '1');
    for (size_t n = 0; n <= core::kMaxLineBytes; n += chunk.size()) f << chunk;
    f << "\n8 8\n";
  }
  const ToolRun got = RunTool({FLASHCP_CLIENT_BIN, "--server", planner->grpc_address(), "--cp",
                               "2", "--strategy", "ring", "--input", path});
  const ToolRun want =
      RunTool({FLASHCP_PLAN_BIN, "--quiet", "--cp", "2", "--strategy", "ring"}, "5,3\n");
  unlink(path.c_str());
  ASSERT_EQ(want.exit_code, 0) << want.err;
  EXPECT_EQ(got.exit_code, 1);
  EXPECT_EQ(got.out, want.out);
  EXPECT_EQ(got.err, absl::StrCat("flashcp-client: ", path,
                                  " line 2: INVALID_ARGUMENT: longer than 16777216 bytes; the "
                                  "input after it is not read\nflashcp-client: 1 item(s) "
                                  "failed\n"));
}

TEST(FlashcpClientCliTest, SummaryPrintsTheQualityTable) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  const ToolRun got = RunTool({FLASHCP_CLIENT_BIN, "--server", planner->grpc_address(), "--cp",
                               "8", "--strategy", "ring", "--dataset", "pile", "--batches", "8",
                               "--summary"});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  const std::vector<std::string> lines = absl::StrSplit(got.out, '\n');
  ASSERT_EQ(lines.size(), 4u) << got.out;
  EXPECT_THAT(lines[1], ::testing::StartsWith("strategy       batches imb_mean"));
  EXPECT_THAT(lines[2], ::testing::StartsWith("ring                 8 "));
}

TEST(FlashcpClientCliTest, UnreachableServerFailsClearly) {
  // A port nobody listens on.
  const absl::StatusOr<int> port = tests::testing::FreeLoopbackPort();
  ASSERT_THAT(port.status(), IsOk());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  const ToolRun got = RunTool(
      {FLASHCP_CLIENT_BIN, "--server", address, "--cp", "2", "--connect_timeout", "0.3"},
      "5,3\n");
  EXPECT_EQ(got.exit_code, 1);
  EXPECT_EQ(got.out, "");
  EXPECT_THAT(got.err,
              HasSubstr(absl::StrCat("flashcp-client: cannot reach ", address,
                                     " within 300ms: DEADLINE_EXCEEDED")));
}

TEST(FlashcpClientCliTest, BadFlagIsUsageError) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--cp", "zero"}, "--cp: Illegal value 'zero' specified for flag 'cp'"},
      {{"--min_shard_tokens", "-1"},
       "--min_shard_tokens: must be an integer in [0, 1099511627776], got \"-1\""},
      {{"--dataset", "foo"}, "--dataset: unknown data set \"foo\" (wlbllm, pile, redpajama)"},
      {{"--heads", "0"}, "--heads: must be in [1, 1024], got 0"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {FLASHCP_CLIENT_BIN, "--server", "x:1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const ToolRun got = RunTool(argv);
    EXPECT_EQ(got.exit_code, 2) << flags[0];
    EXPECT_EQ(got.err, absl::StrCat("flashcp-client: ", message,
                                    "\nRun 'flashcp-client --help' for the flags.\n"));
  }
}

// ---- the C++ library ----------------------------------------------------------

TEST(GrpcPlannerClientTest, PlanPlanFutureListStrategiesAndServerInfo) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient client(MakeChannel(planner->grpc_address()));
  // Ring on [5, 3], N = 2: chunks of C/N = 4 tokens, so rank 0 holds doc 0
  // [0, 4) and rank 1 doc 0 [4, 5) and doc 1 [0, 3).
  PlanResult plan = client.Plan(Request({5, 3}, 2, "ring"), {.timeout = kTimeout});
  ASSERT_THAT(plan, IsOk());
  ASSERT_EQ(plan->shards_size(), 3);
  EXPECT_EQ(plan->shards(1).doc(), 0);
  EXPECT_EQ(plan->shards(1).start(), 4);
  EXPECT_EQ(plan->shards(1).len(), 1);
  EXPECT_EQ(plan->shards(1).rank(), 1);
  EXPECT_EQ(plan->strategy(), "ring");

  std::future<PlanResult> future = client.PlanFuture(Request({8, 8}, 2, "llama3"), {});
  PlanResult async = future.get();
  ASSERT_THAT(async, IsOk());
  EXPECT_EQ(async->cp_size(), 2);
  EXPECT_EQ(async->metrics().tokens_per_rank(), 8);

  auto strategies = client.ListStrategies({});
  ASSERT_THAT(strategies, IsOk());
  std::vector<std::string> names;
  for (const auto& s : strategies->strategies()) names.push_back(s.name());
  EXPECT_THAT(names, ::testing::IsSupersetOf({"ring", "llama3", "flashcp"}));
  auto info = client.GetServerInfo({});
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->api_version(), "flashcp.v1");
}

TEST(GrpcPlannerClientTest, ServerErrorsKeepTheirCode) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient client(MakeChannel(planner->grpc_address()));
  EXPECT_THAT(client.Plan(Request({1, 1}, 4, "ring"), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cp_size")));
  EXPECT_THAT(client.Plan(Request({4, 4}, 2, "no_such_strategy"), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("strategy")));
  EXPECT_THAT(client.PlanFuture(Request({}, 2, "ring"), {}).get(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("doc_lens")));
}

TEST(GrpcPlannerClientTest, DeadlineExceededWhileThePlannerIsHeld) {
  // --testing_hold_planning: nothing is planned until SIGUSR1, so the call
  // can only end by its deadline.
  auto planner = StartPlanner({"--testing_hold_planning"});
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient client(MakeChannel(planner->grpc_address()));
  EXPECT_THAT(client.Plan(Request({5, 3}, 2, "ring"), {.timeout = absl::Milliseconds(300)}),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(PlanPipelinedIntegrationTest, InOrderWithABadItemMidStream) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient client(MakeChannel(planner->grpc_address()));
  constexpr int kItems = 60;
  int next = 0;
  auto source = [&]() -> std::optional<v1::PlanRequest> {
    if (next == kItems) return std::nullopt;
    const int i = next++;
    // Item 17 asks for 4 ranks over 2 tokens: a per-item INVALID_ARGUMENT.
    // The others vary in size (4 to 503 documents), so replies may overtake.
    if (i == 17) return Request({1, 1}, 4, "ring");
    std::vector<int64_t> docs(4 + (i * 37) % 500, i + 1);
    return Request(docs, 4, i % 2 ? "ring" : "llama3");
  };
  std::vector<int64_t> indices;
  std::vector<std::string> outcomes;
  auto sink = [&](int64_t index, PlanResult result) {
    indices.push_back(index);
    if (result.ok()) {
      outcomes.push_back(absl::StrCat(result->doc_lens(0), "/", result->doc_lens_size(), "/",
                                      result->strategy()));
    } else {
      outcomes.push_back(absl::StatusCodeToString(result.status().code()));
    }
  };
  ASSERT_THAT(PlanPipelined(client, {.inflight = 8}, std::ref(source), std::ref(sink)), IsOk());
  ASSERT_EQ(indices.size(), static_cast<size_t>(kItems));
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ(indices[i], i);
    if (i == 17) {
      EXPECT_EQ(outcomes[i], "INVALID_ARGUMENT");
    } else {
      EXPECT_EQ(outcomes[i], absl::StrCat(i + 1, "/", 4 + (i * 37) % 500, "/",
                                          i % 2 ? "ring" : "llama3"));
    }
  }
}

// A planner that dies mid-stream is UNAVAILABLE, the transport's word, with
// how many results arrived: the helper's own Cancel() before Finish() made it
// CANCELLED, as if the caller had given up.
TEST(PlanPipelinedIntegrationTest, APlannerKilledMidStreamIsUnavailable) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  GrpcPlannerClient client(MakeChannel(planner->grpc_address()));
  int next = 0;
  int64_t delivered = 0;
  auto source = [&]() -> std::optional<v1::PlanRequest> {
    if (next == 10000) return std::nullopt;  // never reached: the planner is gone by then
    return Request(std::vector<int64_t>(64, 1000 + next++), 8, "ring");
  };
  auto sink = [&](int64_t, PlanResult result) {
    EXPECT_THAT(result, IsOk());
    if (++delivered == 20) {
      EXPECT_THAT(planner->process().Signal(SIGKILL), IsOk());
    }
  };
  const absl::Status status =
      PlanPipelined(client, {.inflight = 8}, std::ref(source), std::ref(sink));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable,
                               ::testing::StartsWith("PlanStream ended after ")));
  EXPECT_GE(delivered, 20);
}

TEST(RetryingPlannerClientIntegrationTest, RetriesUnavailableUntilTheServerStartsLate) {
  const absl::StatusOr<int> port = tests::testing::FreeLoopbackPort();
  ASSERT_THAT(port.status(), IsOk());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  auto grpc_client = std::make_shared<GrpcPlannerClient>(MakeChannel(address));
  // The sleep hook tells the test that an attempt has failed; the server is
  // started only then, so the first attempt provably met no server. (gRPC's
  // sync client polls an idle channel's reconnection only every 5 s, its
  // backup poller, so the retried call may succeed up to ~5 s after LISTENING.)
  absl::Notification first_failure;
  std::atomic<int> sleeps{0};
  // The wall clock, telling the test when the first attempt has failed.
  class NotifyingClock final : public core::WaitClock {
   public:
    NotifyingClock(absl::Notification& first, std::atomic<int>& sleeps)
        : first_(first), sleeps_(sleeps) {}
    absl::Time Now() const override { return absl::Now(); }
    void SleepFor(absl::Duration d) const override {
      if (sleeps_++ == 0) first_.Notify();
      absl::SleepFor(d);  // the backoff itself, not a wait for luck
    }
    bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond,
                           absl::Time deadline) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return mu.AwaitWithDeadline(cond, deadline);
    }

   private:
    absl::Notification& first_;
    std::atomic<int>& sleeps_;
  };
  const NotifyingClock notifying(first_failure, sleeps);
  RetryClock clock{.clock = &notifying};
  RetryingPlannerClient client(grpc_client,
                               {.max_attempts = 1 << 20,
                                .initial_backoff = absl::Milliseconds(20),
                                .max_backoff = absl::Milliseconds(200),
                                .total_timeout = kTimeout},
                               clock);
  PlanResult result = absl::UnknownError("not run");
  std::thread caller([&] { result = client.Plan(Request({5, 3}, 2, "ring"), {}); });
  ASSERT_TRUE(first_failure.WaitForNotificationWithTimeout(kTimeout));
  auto server = tests::testing::Subprocess::Start(
      {FLASHCP_PLANNER_BIN, "--listen", address, "--metrics", "127.0.0.1:0"});
  ASSERT_THAT(server, IsOk());
  auto line = (*server)->ReadLine(absl::Now() + kTimeout);
  ASSERT_THAT(line, IsOk());
  EXPECT_THAT(*line, ::testing::StartsWith(absl::StrCat("LISTENING grpc=", address)));
  caller.join();
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->shards_size(), 3);
  EXPECT_GE(sleeps.load(), 1);
  ASSERT_THAT((*server)->Signal(SIGTERM), IsOk());
  absl::StatusOr<int> exit_code = (*server)->Wait(absl::Now() + kTimeout);
  ASSERT_THAT(exit_code, IsOk());
  EXPECT_EQ(*exit_code, 0);
}

// A report that cannot be written is an error saying so, exit 1: flashcp-client
// exited 1 without a word, flashcp-loadgen exited 0 with its report lost.
TEST(ToolOutputTest, AnUnwritableStdoutIsAnErrorNamingIt) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  // sh runs the tool ($0, with "$@") with its stdout on /dev/full (ENOSPC).
  const auto to_full = [](std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" >/dev/full"});
    return argv;
  };
  const ToolRun client = RunTool(
      to_full({FLASHCP_CLIENT_BIN, "--server", planner->grpc_address(), "--cp", "2"}), "5,3\n");
  EXPECT_EQ(client.exit_code, 1);
  EXPECT_EQ(client.err, "flashcp-client: error writing the output\n");
  const ToolRun loadgen =
      RunTool(to_full({FLASHCP_LOADGEN_BIN, "--server", planner->grpc_address(), "--duration",
                       "30", "--max_requests", "5", "--strategy", "ring", "--json"}));
  EXPECT_EQ(loadgen.exit_code, 1);
  EXPECT_EQ(loadgen.err, "flashcp-loadgen: error writing the output\n");
}

// ---- flashcp-loadgen ----------------------------------------------------------

// The number after "key": in a flat JSON object; -1 when absent.
double JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\":(-?[0-9.eE+]+)"))) return -1;
  return std::stod(m[1]);
}

TEST(FlashcpLoadgenTest, UnaryAndStreamRunBoundedWithNoErrors) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "unary");
    std::vector<std::string> argv = {FLASHCP_LOADGEN_BIN, "--server", planner->grpc_address(),
                                     "--duration", "30", "--max_requests", "300", "--strategy",
                                     "ring", "--json"};
    if (stream) argv.push_back("--stream");
    const ToolRun run = RunTool(argv);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    ASSERT_EQ(std::count(run.out.begin(), run.out.end(), '\n'), 1) << run.out;
    EXPECT_TRUE(std::regex_match(run.out, std::regex("^\\{.*\\}\n$"))) << run.out;
    EXPECT_EQ(JsonNumber(run.out, "requests"), 300);
    EXPECT_EQ(JsonNumber(run.out, "errors"), 0);
    EXPECT_GT(JsonNumber(run.out, "qps"), 0);
    const double p50 = JsonNumber(run.out, "p50_ms"), p90 = JsonNumber(run.out, "p90_ms"),
                 p99 = JsonNumber(run.out, "p99_ms"), p999 = JsonNumber(run.out, "p999_ms");
    EXPECT_GT(p50, 0);
    EXPECT_LE(p50, p90);
    EXPECT_LE(p90, p99);
    EXPECT_LE(p99, p999);
  }
}

TEST(FlashcpLoadgenTest, DurationBoundsTheRun) {
  auto planner = StartPlanner();
  ASSERT_NE(planner, nullptr);
  const absl::Time start = absl::Now();
  const ToolRun run = RunTool({FLASHCP_LOADGEN_BIN, "--server", planner->grpc_address(),
                               "--duration", "0.5", "--strategy", "ring", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_GT(JsonNumber(run.out, "requests"), 0);
  EXPECT_EQ(JsonNumber(run.out, "errors"), 0);
  EXPECT_LT(JsonNumber(run.out, "duration_s"), 5);
}

// Errors are counted by code and the first few are printed with their
// messages, in the text report and in the JSON object.
TEST(FlashcpLoadgenTest, ReportsTheFirstErrorsWithCodesAndMessages) {
  auto planner = StartPlanner({"--max_cp_size", "4"});
  ASSERT_NE(planner, nullptr);
  const std::string message = "cp_size: 8 ranks, above this server's limit of 4";
  const ToolRun json = RunTool({FLASHCP_LOADGEN_BIN, "--server", planner->grpc_address(),
                                "--duration", "30", "--max_requests", "7", "--cp", "8",
                                "--strategy", "ring", "--json"});
  EXPECT_EQ(json.exit_code, 1) << json.err;
  EXPECT_EQ(JsonNumber(json.out, "requests"), 7);
  EXPECT_EQ(JsonNumber(json.out, "errors"), 7);
  std::string first;
  for (int i = 0; i < 5; ++i) {
    absl::StrAppend(&first, i == 0 ? "" : ",", "{\"code\":\"RESOURCE_EXHAUSTED\",\"message\":\"",
                    message, "\"}");
  }
  EXPECT_THAT(json.out, HasSubstr(absl::StrCat("\"error_codes\":{\"RESOURCE_EXHAUSTED\":7},"
                                               "\"first_errors\":[", first, "]}\n")));

  const ToolRun text = RunTool({FLASHCP_LOADGEN_BIN, "--server", planner->grpc_address(),
                                "--duration", "30", "--max_requests", "2", "--cp", "8",
                                "--strategy", "ring"});
  EXPECT_EQ(text.exit_code, 1) << text.err;
  EXPECT_THAT(text.out, HasSubstr(absl::StrCat("  RESOURCE_EXHAUSTED: 2\nfirst errors:\n"
                                               "  RESOURCE_EXHAUSTED: ", message, "\n"
                                               "  RESOURCE_EXHAUSTED: ", message, "\n")));
  EXPECT_THAT(planner->Terminate(), IsOk());
}

}  // namespace
}  // namespace flashcp::client
