// Integration tests of flashcp-planner: each test starts the real binary on
// port 0 (reading its LISTENING line) and talks to it over gRPC and HTTP.
// Nothing sleeps for luck: waits are on the LISTENING line, on RPC answers, on
// health, or on a metric reaching a value, each with a deadline. Slow-planner
// scenarios use the binary's --testing_hold_planning hook (nothing is planned
// until SIGUSR1) to make queued work deterministic.
#include <signal.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/rpc/grpc_status.h"
#include "tests/testing/expected_plans.h"
#include "tests/testing/grpc_probes.h"
#include "tests/testing/metrics_text.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/rendezvous_requests.h"
#include "tests/testing/subprocess.h"

namespace flashcp {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::flashcp::tests::testing::ExpectRingPlanFor53;
using ::flashcp::tests::testing::FindSample;
using ::flashcp::tests::testing::HealthStatus;
using ::flashcp::tests::testing::Labels;
using ::flashcp::tests::testing::PlannerProcess;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// absl::StatusOr<T> that is OK and whose value matches.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared

absl::Time Deadline() { return absl::Now() + kTimeout; }

std::unique_ptr<PlannerProcess> StartPlanner(const std::vector<std::string>& args = {}) {
  return PlannerProcess::StartOrFail(FLASHCP_PLANNER_BIN, args, kTimeout);
}

v1::PlanRequest Request(uint64_t id, std::vector<int64_t> docs, int32_t cp,
                        const std::string& strategy = "ring") {
  return tests::testing::PlanRequestOf(id, docs, cp, strategy);
}

// A unary Plan with a deadline; the status as absl::Status.
absl::Status Plan(v1::Planner::Stub& stub, const v1::PlanRequest& request,
                  v1::PlanResponse* response, absl::Duration timeout = kTimeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return proto::rpc::FromGrpcStatus(stub.Plan(&context, request, response));
}

// A unary Plan started asynchronously; `done` is notified with `status`.
struct AsyncPlan {
  AsyncPlan(v1::Planner::Stub& stub, v1::PlanRequest r) : request(std::move(r)) {
    stub.async()->Plan(&context, &request, &response, [this](grpc::Status s) {
      status = s;
      done.Notify();
    });
  }
  grpc::ClientContext context;
  v1::PlanRequest request;
  v1::PlanResponse response;
  absl::Notification done;
  grpc::Status status;
};

// Scrapes until the sample has `want` (polling in 5 ms steps: waiting on the
// server's state, with a deadline).
absl::Status WaitForSample(const PlannerProcess& p, const std::string& name, const Labels& labels,
                           double want) {
  const absl::Time deadline = Deadline();
  std::string last;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> text = p.ScrapeMetrics();
    if (text.ok()) {
      absl::StatusOr<double> v = FindSample(*text, name, labels);
      if (v.ok() && *v == want) return absl::OkStatus();
      last = v.ok() ? absl::StrCat(*v) : v.status().ToString();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(name, " never reached ", want, "; last: ", last));
}

TEST(PlannerServiceTest, UnaryRingPlanHasTheHandWorkedShards) {
  std::unique_ptr<PlannerProcess> p = StartPlanner();
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());
  v1::PlanRequest request = Request(42, {5, 3}, 2);
  request.set_include_layout(true);
  v1::PlanResponse response;
  ASSERT_THAT(Plan(*stub, request, &response), IsOk());
  EXPECT_EQ(response.batch_id(), 42u);
  ExpectRingPlanFor53(response);
  ASSERT_EQ(response.layout_size(), 2);
  EXPECT_THAT(response.layout(0).shards(), ElementsAre(0));
  EXPECT_EQ(response.layout(0).send_tokens(), 4);
  EXPECT_THAT(response.layout(1).shards(), ElementsAre(1, 2));
  EXPECT_EQ(response.layout(1).send_tokens(), 0);
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, ListStrategiesAndServerInfo) {
  std::unique_ptr<PlannerProcess> p = StartPlanner(
      {"--threads", "3", "--queue_size", "17", "--max_docs", "100", "--max_tokens", "5000",
       "--max_cp_size", "64"});
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());
  {
    grpc::ClientContext context;
    v1::ListStrategiesResponse list;
    ASSERT_TRUE(stub->ListStrategies(&context, v1::ListStrategiesRequest(), &list).ok());
    std::vector<std::string> names;
    std::vector<std::string> defaults;
    for (const v1::StrategyInfo& s : list.strategies()) {
      names.push_back(s.name());
      if (s.is_default()) defaults.push_back(s.name());
      EXPECT_FALSE(s.description().empty()) << s.name();
    }
    EXPECT_THAT(names, ElementsAre("llama3", "per_doc", "ring", "zigzag", "whole_doc",
                                   "flashcp_paper", "flashcp", "ilp", "magi", "csbp", "basp"));
    EXPECT_THAT(defaults, ElementsAre("flashcp"));
  }
  {
    grpc::ClientContext context;
    v1::ServerInfo info;
    ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    EXPECT_EQ(info.api_version(), "flashcp.v1");
    EXPECT_FALSE(info.version().empty());
    EXPECT_EQ(info.planner_threads(), 3);
    EXPECT_EQ(info.queue_capacity(), 17);
    EXPECT_EQ(info.max_docs_per_batch(), 100);
    EXPECT_EQ(info.max_tokens_per_batch(), 5000);
    EXPECT_EQ(info.max_cp_size(), 64);
  }
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, StreamAnswersEveryIdOnceWithABadItemMidStream) {
  std::unique_ptr<PlannerProcess> p = StartPlanner({"--threads", "2", "--stream_window", "8"});
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());
  constexpr int kItems = 300;
  constexpr uint64_t kBad = 137;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(Deadline()));
  auto stream = stub->PlanStream(&context);
  std::thread writer([&] {
    for (int i = 0; i < kItems; ++i) {
      const uint64_t id = 1000 + i;
      v1::PlanRequest r = Request(id, {i % 7 + 1, 5, 3}, 2);
      if (id == 1000 + kBad) r.set_cp_size(0);
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
  });
  std::map<uint64_t, int> seen;
  v1::PlanResponse response;
  while (stream->Read(&response)) {
    ++seen[response.batch_id()];
    const int i = static_cast<int>(response.batch_id()) - 1000;
    if (i == static_cast<int>(kBad)) {
      ASSERT_TRUE(response.has_error());
      EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_EQ(response.error().message(), "cp_size: must be at least 1, got 0");
      EXPECT_EQ(response.shards_size(), 0);
    } else {
      ASSERT_FALSE(response.has_error()) << response.error().message();
      EXPECT_THAT(response.doc_lens(), ElementsAre(i % 7 + 1, 5, 3));
      int64_t tokens = 0;
      for (const v1::Shard& s : response.shards()) tokens += s.len();
      EXPECT_EQ(tokens, i % 7 + 1 + 8);
    }
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(seen.size(), static_cast<size_t>(kItems));
  for (const auto& [id, count] : seen) {
    EXPECT_GE(id, 1000u);
    EXPECT_LT(id, 1000u + kItems);
    EXPECT_EQ(count, 1) << id;
  }
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

struct BadInput {
  std::string name;
  v1::PlanRequest request;
  absl::StatusCode code;
  std::string message;  // exact
};

TEST(PlannerServiceTest, EveryBadInputGetsItsCodeAndTheServerKeepsServing) {
  std::unique_ptr<PlannerProcess> p = StartPlanner(
      {"--max_docs", "4", "--max_tokens", "1000", "--max_message_bytes", "65536"});
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());
  auto with = [](std::function<void(v1::PlanRequest&)> f) {
    v1::PlanRequest r = Request(1, {5, 3}, 2);
    f(r);
    return r;
  };
  const std::vector<BadInput> cases = {
      {"empty doc_lens", with([](v1::PlanRequest& r) { r.clear_doc_lens(); }),
       absl::StatusCode::kInvalidArgument, "doc_lens: the batch has no documents"},
      {"zero length", with([](v1::PlanRequest& r) { r.set_doc_lens(1, 0); }),
       absl::StatusCode::kInvalidArgument,
       "doc_lens[1]: a document length must be at least 1, got 0"},
      {"negative length", with([](v1::PlanRequest& r) { r.set_doc_lens(0, -5); }),
       absl::StatusCode::kInvalidArgument,
       "doc_lens[0]: a document length must be at least 1, got -5"},
      {"cp_size 0", with([](v1::PlanRequest& r) { r.set_cp_size(0); }),
       absl::StatusCode::kInvalidArgument, "cp_size: must be at least 1, got 0"},
      {"cp_size above tokens", with([](v1::PlanRequest& r) { r.set_cp_size(9); }),
       absl::StatusCode::kInvalidArgument, "cp_size: 9 ranks is more than the batch's 8 tokens"},
      {"unknown strategy", with([](v1::PlanRequest& r) { r.set_strategy("nope"); }),
       absl::StatusCode::kInvalidArgument,
       "strategy: unknown strategy \"nope\" (llama3, per_doc, ring, zigzag, whole_doc, "
       "flashcp_paper, flashcp, ilp, magi, csbp, basp)"},
      {"target_imbalance < 1", with([](v1::PlanRequest& r) { r.set_target_imbalance(0.9); }),
       absl::StatusCode::kInvalidArgument,
       "target_imbalance: must be a finite ratio >= 1 (0 means 1.02), got 0.9"},
      {"negative heads", with([](v1::PlanRequest& r) { r.set_heads(-2); }),
       absl::StatusCode::kInvalidArgument, "heads: must be in [1, 1024], got -2"},
      {"head_dim too big", with([](v1::PlanRequest& r) { r.set_head_dim(4096); }),
       absl::StatusCode::kInvalidArgument, "head_dim: must be in [1, 1024], got 4096"},
      {"dtype 3 bytes", with([](v1::PlanRequest& r) { r.set_dtype_bytes(3); }),
       absl::StatusCode::kInvalidArgument, "dtype_bytes: must be 1, 2 or 4, got 3"},
      {"over max_docs", Request(1, {1, 1, 1, 1, 1}, 2), absl::StatusCode::kResourceExhausted,
       "doc_lens: 5 documents, above this server's limit of 4"},
      {"over max_tokens", Request(1, {600, 600}, 2), absl::StatusCode::kResourceExhausted,
       "doc_lens: 1200 tokens, above this server's limit of 1000"},
  };
  v1::PlanResponse response;
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(Plan(*stub, c.request, &response), absl::Status(c.code, c.message));
    // The server still serves.
    ASSERT_THAT(Plan(*stub, Request(2, {5, 3}, 2), &response), IsOk());
    ExpectRingPlanFor53(response);
  }
  {
    SCOPED_TRACE("oversize message");
    // 30000 varints of 3 bytes: ~90 KB against --max_message_bytes 65536.
    v1::PlanRequest big = Request(3, std::vector<int64_t>(30000, 100000), 2);
    ASSERT_GT(big.ByteSizeLong(), 65536u);
    EXPECT_THAT(Plan(*stub, big, &response),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("larger than max")));
    ASSERT_THAT(Plan(*stub, Request(2, {5, 3}, 2), &response), IsOk());
    ExpectRingPlanFor53(response);
  }
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, QueueFullIsResourceExhausted) {
  // One thread, one waiting job, and nothing planned until SIGUSR1: the first
  // call fills the queue, so the second is refused.
  std::unique_ptr<PlannerProcess> p =
      StartPlanner({"--threads", "1", "--queue_size", "1", "--testing_hold_planning"});
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());
  AsyncPlan first(*stub, Request(1, {5, 3}, 2));
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_queue_depth", {}, 1), IsOk());

  v1::PlanResponse response;
  EXPECT_EQ(Plan(*stub, Request(2, {5, 3}, 2), &response),
            absl::ResourceExhaustedError(
                "planner: the planning queue is full (1 jobs waiting); retry later"));

  ASSERT_THAT(p->process().Signal(SIGUSR1), IsOk());  // let planning run
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  ExpectRingPlanFor53(first.response);
  ASSERT_THAT(Plan(*stub, Request(3, {5, 3}, 2), &response), IsOk());
  ExpectRingPlanFor53(response);
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, DeadlineExceededDropsTheQueuedJob) {
  std::unique_ptr<PlannerProcess> p = StartPlanner({"--testing_hold_planning"});
  ASSERT_NE(p, nullptr);
  std::shared_ptr<grpc::Channel> channel = p->NewChannel();
  // Connected first, and a deadline long enough for the request to reach a
  // loaded server: a deadline that passes while connecting never reaches it,
  // and the server would count nothing (seen once on 2 busy cores at 300 ms).
  ASSERT_THAT(tests::testing::WaitForServing(channel, "", Deadline()), IsOk());
  auto stub = v1::Planner::NewStub(channel);
  v1::PlanResponse response;
  EXPECT_THAT(Plan(*stub, Request(1, {5, 3}, 2), &response, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The server saw the deadline pass and dropped the job from its queue.
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_requests_total",
                            {{"method", "Plan"}, {"code", "DEADLINE_EXCEEDED"}}, 1),
              IsOk());
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_queue_depth", {}, 0), IsOk());
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_inflight_requests", {}, 0), IsOk());

  ASSERT_THAT(p->process().Signal(SIGUSR1), IsOk());
  ASSERT_THAT(Plan(*stub, Request(2, {5, 3}, 2), &response), IsOk());
  ExpectRingPlanFor53(response);
  // The dropped job was never planned: one plan in total.
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_planning_duration_seconds_count",
                            {{"cp_size", "2"}, {"strategy", "ring"}}, 1),
              IsOk());
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, ClientCancellationDropsQueuedWork) {
  std::unique_ptr<PlannerProcess> p =
      StartPlanner({"--testing_hold_planning", "--stream_window", "4"});
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());

  // Unary: queued, then cancelled by the client.
  AsyncPlan unary(*stub, Request(1, {5, 3}, 2));
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_queue_depth", {}, 1), IsOk());
  unary.context.TryCancel();
  ASSERT_TRUE(unary.done.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_EQ(unary.status.error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_requests_total",
                            {{"method", "Plan"}, {"code", "CANCELLED"}}, 1),
              IsOk());
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_queue_depth", {}, 0), IsOk());

  // Stream: 10 items sent, the window (4) read and queued, then cancelled.
  {
    grpc::ClientContext stream_context;
    auto stream = stub->PlanStream(&stream_context);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(stream->Write(Request(100 + i, {5, 3}, 2)));
    ASSERT_THAT(WaitForSample(*p, "flashcp_planner_inflight_requests", {}, 4), IsOk());
    ASSERT_THAT(WaitForSample(*p, "flashcp_planner_queue_depth", {}, 4), IsOk());
    stream_context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_requests_total",
                            {{"method", "PlanStream"}, {"code", "CANCELLED"}}, 4),
              IsOk());
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_queue_depth", {}, 0), IsOk());
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_inflight_requests", {}, 0), IsOk());

  ASSERT_THAT(p->process().Signal(SIGUSR1), IsOk());
  v1::PlanResponse good;
  ASSERT_THAT(Plan(*stub, Request(2, {5, 3}, 2), &good), IsOk());
  ExpectRingPlanFor53(good);
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, HealthGoesNotServingOnSigtermAndInFlightWorkDrains) {
  std::unique_ptr<PlannerProcess> p = StartPlanner({"--testing_hold_planning"});
  ASSERT_NE(p, nullptr);
  std::shared_ptr<grpc::Channel> channel = p->NewChannel();
  EXPECT_THAT(tests::testing::CheckHealth(channel, "", Deadline()),
              IsOkAndHolds(HealthStatus::kServing));
  EXPECT_THAT(tests::testing::CheckHealth(channel, "flashcp.v1.Planner", Deadline()),
              IsOkAndHolds(HealthStatus::kServing));

  // One plan in flight (held) when SIGTERM arrives.
  auto stub = v1::Planner::NewStub(channel);
  AsyncPlan plan(*stub, Request(7, {5, 3}, 2));
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_queue_depth", {}, 1), IsOk());

  absl::StatusOr<std::unique_ptr<tests::testing::HealthWatch>> watch =
      tests::testing::HealthWatch::Start(channel, "flashcp.v1.Planner", Deadline());
  ASSERT_THAT(watch, IsOk());
  EXPECT_THAT((*watch)->Next(Deadline()), IsOkAndHolds(HealthStatus::kServing));

  ASSERT_THAT(p->process().Signal(SIGTERM), IsOk());
  EXPECT_THAT((*watch)->Next(Deadline()), IsOkAndHolds(HealthStatus::kNotServing));
  watch->reset();  // cancels the watch, which would otherwise hold the drain open

  // The in-flight plan is answered, then the process exits 0.
  ASSERT_TRUE(plan.done.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_TRUE(plan.status.ok()) << plan.status.error_message();
  ExpectRingPlanFor53(plan.response);
  EXPECT_THAT(p->process().Wait(Deadline()), IsOkAndHolds(0));
}

// --drain_timeout bounds the exit: a plan still running when it passes is
// cancelled, which stops it at the planner's next check (here an ILP with a
// 600 s limit, which would otherwise run to it).
TEST(PlannerServiceTest, SigtermExitIsBoundedByTheDrainTimeoutWhileAPlanRuns) {
  std::unique_ptr<PlannerProcess> p = StartPlanner(
      {"--allow_ilp", "--ilp_time_limit", "600s", "--drain_timeout", "1s"});
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());
  const std::vector<int64_t> docs = tests::testing::SlowIlpBatch();
  AsyncPlan plan(*stub, Request(1, docs, 8, "ilp"));
  ASSERT_THAT(WaitForSample(*p, "flashcp_planner_inflight_requests", {}, 1), IsOk());
  const absl::Time sigterm = absl::Now();
  ASSERT_THAT(p->process().Signal(SIGTERM), IsOk());
  EXPECT_THAT(p->process().Wait(Deadline()), IsOkAndHolds(0));
  const absl::Duration exit_after = absl::Now() - sigterm;
  EXPECT_GE(exit_after, absl::Seconds(1));  // the drain waited for the plan
  // The slack is for a shared, loaded machine; without cancellable planning
  // the exit waited for the plan, here up to its 600 s limit.
  EXPECT_LT(exit_after, absl::Seconds(1) + absl::Seconds(5)) << exit_after;
  ASSERT_TRUE(plan.done.WaitForNotificationWithTimeout(kTimeout));
  // The server cancelled it at the drain deadline and closed the connection:
  // which of the two the client sees first is gRPC's race.
  EXPECT_THAT(plan.status.error_code(),
              ::testing::AnyOf(grpc::StatusCode::CANCELLED, grpc::StatusCode::UNAVAILABLE))
      << plan.status.error_message();
}

TEST(PlannerServiceTest, SigintAlsoDrainsAndExitsZero) {
  std::unique_ptr<PlannerProcess> p = StartPlanner();
  ASSERT_NE(p, nullptr);
  ASSERT_THAT(tests::testing::WaitForServing(p->NewChannel(), "", Deadline()), IsOk());
  ASSERT_THAT(p->process().Signal(SIGINT), IsOk());
  EXPECT_THAT(p->process().Wait(Deadline()), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, AStrayPositionalArgumentIsRefused) {
  // `docker run IMAGE id` appends "id" to the entrypoint; it must not be ignored.
  absl::StatusOr<tests::testing::CommandResult> r = tests::testing::RunCommand(
      {FLASHCP_PLANNER_BIN, "--listen", "127.0.0.1:0", "50051"}, "", Deadline());
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_THAT(r->output, ::testing::HasSubstr(
                             "flashcp-planner: unexpected argument \"50051\"; every option is a --flag"));
}

// gRPC's default SO_REUSEPORT let a second planner start on a port in use and
// share its connections (issue 15); it must refuse to start instead.
TEST(PlannerServiceTest, ASecondPlannerOnAPortInUseRefusesToStart) {
  std::unique_ptr<PlannerProcess> first = StartPlanner();
  const std::string address = first->grpc_address();
  absl::StatusOr<tests::testing::CommandResult> r = tests::testing::RunCommand(
      {FLASHCP_PLANNER_BIN, "--listen", address, "--metrics", ""}, "", Deadline());
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 1);
  EXPECT_THAT(r->output, ::testing::HasSubstr(absl::StrCat(
                             "--listen: cannot listen on ", address, " (address in use?)")));
  EXPECT_THAT(first->Terminate(), IsOkAndHolds(0));
}

// --serve splits the stateless planning (replicas behind a Service) from the
// rendezvous (one replica): each role serves, and reports healthy, only its
// own service; the other answers UNIMPLEMENTED.
TEST(PlannerServiceTest, ServeRoleServesOnlyItsService) {
  struct Case {
    std::string serve;
    bool planning, rendezvous;
  };
  for (const Case& c : {Case{"all", true, true}, Case{"planning", true, false},
                        Case{"rendezvous", false, true}}) {
    SCOPED_TRACE(c.serve);
    std::unique_ptr<PlannerProcess> p = StartPlanner({"--serve", c.serve});
    ASSERT_NE(p, nullptr);
    auto planner = v1::Planner::NewStub(p->NewChannel());
    v1::PlanResponse response;
    const absl::Status plan = Plan(*planner, Request(1, {5, 3}, 2), &response);
    EXPECT_EQ(plan.code(), c.planning ? absl::StatusCode::kOk : absl::StatusCode::kUnimplemented)
        << plan;
    auto rendezvous = v1::Rendezvous::NewStub(p->NewChannel());
    const absl::Status rdv = tests::testing::JoinAlone(*rendezvous, "g", Deadline()).status();
    EXPECT_EQ(rdv.code(), c.rendezvous ? absl::StatusCode::kOk : absl::StatusCode::kUnimplemented)
        << rdv;
    EXPECT_THAT(tests::testing::CheckHealth(p->NewChannel(), "", Deadline()),
                IsOkAndHolds(HealthStatus::kServing));
    for (const auto& [service, served] :
         {std::pair<std::string, bool>{"flashcp.v1.Planner", c.planning},
          {"flashcp.v1.Rendezvous", c.rendezvous}}) {
      absl::StatusOr<HealthStatus> h = tests::testing::CheckHealth(p->NewChannel(), service,
                                                                   Deadline());
      if (served) {
        EXPECT_THAT(h, IsOkAndHolds(HealthStatus::kServing)) << service;
      } else {
        EXPECT_EQ(h.status().code(), absl::StatusCode::kNotFound) << service;
      }
    }
    EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
  }
  absl::StatusOr<tests::testing::CommandResult> r = tests::testing::RunCommand(
      {FLASHCP_PLANNER_BIN, "--listen", "127.0.0.1:0", "--serve", "store"}, "", Deadline());
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_EQ(r->output,
            "flashcp-planner: --serve: want all, planning or rendezvous, got \"store\"\n"
            "Run 'flashcp-planner --help' for the flags.\n");
}

TEST(PlannerServiceTest, ReflectionListsThePlanner) {
  std::unique_ptr<PlannerProcess> p = StartPlanner();
  ASSERT_NE(p, nullptr);
  absl::StatusOr<std::vector<std::string>> services =
      tests::testing::ListServicesByReflection(p->NewChannel(), Deadline());
  ASSERT_THAT(services, IsOk());
  EXPECT_THAT(*services, Contains("flashcp.v1.Planner"));
  EXPECT_THAT(*services, Contains("grpc.health.v1.Health"));
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

TEST(PlannerServiceTest, MetricsMoveAfterRequestsAndPassPromtool) {
  std::unique_ptr<PlannerProcess> p = StartPlanner();
  ASSERT_NE(p, nullptr);
  auto stub = v1::Planner::NewStub(p->NewChannel());
  absl::StatusOr<std::string> before = p->ScrapeMetrics();
  ASSERT_THAT(before, IsOk());
  EXPECT_THAT(FindSample(*before, "flashcp_planner_requests_total",
                         {{"method", "Plan"}, {"code", "OK"}}),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(FindSample(*before, "flashcp_planner_build_info", {{"version", "0.1.0"}}),
              IsOkAndHolds(1.0));

  v1::PlanResponse response;
  for (int i = 0; i < 3; ++i) ASSERT_THAT(Plan(*stub, Request(i, {5, 3}, 2), &response), IsOk());
  EXPECT_THAT(Plan(*stub, Request(9, {5, 3}, 0), &response),
              StatusIs(absl::StatusCode::kInvalidArgument));
  {
    grpc::ClientContext context;
    auto stream = stub->PlanStream(&context);
    ASSERT_TRUE(stream->Write(Request(10, {5, 3}, 2, "llama3")));
    ASSERT_TRUE(stream->WritesDone());
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_TRUE(stream->Finish().ok());
  }

  absl::StatusOr<std::string> after = p->ScrapeMetrics();
  ASSERT_THAT(after, IsOk());
  const std::string& m = *after;
  EXPECT_THAT(FindSample(m, "flashcp_planner_requests_total", {{"method", "Plan"}, {"code", "OK"}}),
              IsOkAndHolds(3.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_requests_total",
                         {{"method", "Plan"}, {"code", "INVALID_ARGUMENT"}}),
              IsOkAndHolds(1.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_requests_total",
                         {{"method", "PlanStream"}, {"code", "OK"}}),
              IsOkAndHolds(1.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_request_duration_seconds_count", {{"method", "Plan"}}),
              IsOkAndHolds(4.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_planning_duration_seconds_count",
                         {{"cp_size", "2"}, {"strategy", "ring"}}),
              IsOkAndHolds(3.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_planning_duration_seconds_count",
                         {{"cp_size", "2"}, {"strategy", "llama3"}}),
              IsOkAndHolds(1.0));
  // imbalance 11/10.5 = 1.0476: in the 1.05 bucket, not the 1.03 one.
  EXPECT_THAT(FindSample(m, "flashcp_planner_plan_imbalance_ratio_bucket",
                         {{"cp_size", "2"}, {"strategy", "ring"}, {"le", "1.03"}}),
              IsOkAndHolds(0.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_plan_imbalance_ratio_bucket",
                         {{"cp_size", "2"}, {"strategy", "ring"}, {"le", "1.05"}}),
              IsOkAndHolds(3.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_plan_comm_saving_ratio_count",
                         {{"cp_size", "2"}, {"strategy", "ring"}, {"scheme", "allgather"}}),
              IsOkAndHolds(3.0));
  // ring's targeted saving is exactly 0 for this batch: one phase moves 4
  // tokens (rank 0 sends, rank 1 receives), as full KV does (C/N = 4).
  EXPECT_THAT(FindSample(m, "flashcp_planner_plan_comm_saving_ratio_sum",
                         {{"cp_size", "2"}, {"strategy", "ring"}, {"scheme", "targeted"}}),
              IsOkAndHolds(0.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_inflight_requests"), IsOkAndHolds(0.0));
  EXPECT_THAT(FindSample(m, "flashcp_planner_queue_depth"), IsOkAndHolds(0.0));

  const std::string promtool = FLASHCP_PROMTOOL;
  if (access(promtool.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "promtool not found (scripts/install-deps.sh installs it)";
  }
  absl::StatusOr<tests::testing::CommandResult> check =
      tests::testing::RunCommand({promtool, "check", "metrics"}, m, Deadline());
  ASSERT_THAT(check, IsOk());
  EXPECT_EQ(check->exit_code, 0) << check->output;
  EXPECT_EQ(check->output, "");
  EXPECT_THAT(p->Terminate(), IsOkAndHolds(0));
}

}  // namespace
}  // namespace flashcp
