// The daemon's pieces without processes: the gRPC rendezvous client and Gloo
// store against a real in-process Rendezvous server, option validation, and
// the summary line.
#include "worker/daemon.h"

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/grpc_planner_client.h"
#include "core/analysis.h"
#include "core/clock.h"
#include "core/datasets.h"
#include "core/mask.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/rendezvous_service.h"
#include "prometheus/registry.h"
#include "proto/convert.h"
#include "tests/testing/inprocess_rendezvous.h"
#include "tests/testing/ports.h"
#include "worker/gloo_communicator.h"
#include "worker/grpc_store.h"
#include "worker/metrics.h"
#include "worker/testing/gloo_ranks.h"
#include "worker/testing/scripted_planner.h"

namespace flashcp::worker {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RendezvousFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<tests::testing::InProcessRendezvous>> r =
        tests::testing::InProcessRendezvous::Start();
    ASSERT_THAT(r.status(), IsOk());
    rendezvous_ = *std::move(r);
    stub_ = rendezvous_->stub();
  }
  planner_service::RendezvousHost& host() { return rendezvous_->host(); }
  std::unique_ptr<tests::testing::InProcessRendezvous> rendezvous_;
  std::shared_ptr<v1::Rendezvous::StubInterface> stub_;
};

TEST_F(RendezvousFixture, TwoRanksConnectGlooThroughTheStore) {
  std::vector<absl::Status> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      RendezvousClient client(stub_, "pair", r, /*incarnation=*/100 + r);
      absl::StatusOr<int32_t> ws = client.Join(2);
      if (!ws.ok()) {
        results[r] = ws.status();
        return;
      }
      absl::StatusOr<std::vector<int32_t>> members = client.AwaitMembers(absl::Seconds(30));
      if (!members.ok()) {
        results[r] = members.status();
        return;
      }
      GrpcStore store(&client, absl::Seconds(30));
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          ConnectGloo(store, r, 2, GlooOptions{"127.0.0.1", absl::Seconds(30)});
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      results[r] = (*comm)->Barrier();
      if (results[r].ok()) results[r] = client.Leave();
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], IsOk());
  EXPECT_EQ(host().state().group_count(), 0u);
}

TEST_F(RendezvousFixture, ExactCodesThroughTheClient) {
  RendezvousClient a(stub_, "g", 0, 1);
  ASSERT_EQ(a.Join(2).value(), 2);
  EXPECT_THAT(a.AwaitMembers(absl::Milliseconds(50)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("rendezvous AwaitMembers: group \"g\": ranks 1 of 2 have not "
                                 "joined")));
  RendezvousClient other_size(stub_, "g", 1, 1);
  EXPECT_THAT(other_size.Join(3).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  RendezvousClient b(stub_, "g", 1, 1);
  ASSERT_EQ(b.Join(2).value(), 2);
  EXPECT_THAT(a.AwaitMembers(absl::Seconds(5)).value(), ElementsAre(0, 1));
  RendezvousClient duplicate(stub_, "g", 0, 2);
  EXPECT_THAT(duplicate.Join(2).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rank 0 is already a member")));
  // The client carries the token Join gave it; one that never joined has none.
  RendezvousClient stranger(stub_, "g", 1, 7);
  EXPECT_EQ(stranger.Set("k", "v"),
            absl::PermissionDeniedError(
                "rendezvous Set: group \"g\": the call carries no token (Join returns one)"));
  EXPECT_THAT(stranger.Abort("x"), StatusIs(absl::StatusCode::kPermissionDenied));

  GrpcStore store(&a, absl::Milliseconds(50));
  store.set("k", {'x', 'y'});
  EXPECT_EQ(store.get("k"), (std::vector<char>{'x', 'y'}));
  EXPECT_THAT(store.first_error(), IsOk());
  EXPECT_THROW(store.get("missing"), gloo::IoException);
  EXPECT_THAT(store.first_error(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("\"missing\" not set")));

  ASSERT_THAT(b.Abort("peer died"), IsOk());
  EXPECT_THAT(a.Set("k2", "v"), StatusIs(absl::StatusCode::kAborted,
                                         HasSubstr("aborted: rank 1: peer died")));
}

// A survivor that lost a peer which had itself failed names the group's
// first failure too; the first to fail, or a rank that cannot abort, reports
// its own failure as it is.
TEST_F(RendezvousFixture, AbortGroupAddsTheGroupsFirstFailure) {
  RendezvousClient a(stub_, "cut", 0, 1), b(stub_, "cut", 1, 2);
  ASSERT_THAT(a.Join(2).status(), IsOk());
  ASSERT_THAT(b.Join(2).status(), IsOk());
  const absl::Status lost = absl::DeadlineExceededError("recv of 16 bytes from rank 3: timed out");
  EXPECT_EQ(AbortGroup(b, lost), lost);
  EXPECT_EQ(AbortGroup(a, absl::UnavailableError("recv of 16 bytes from rank 1: closed")),
            absl::UnavailableError("recv of 16 bytes from rank 1: closed; first failure in the "
                                   "group: rendezvous Get: group \"cut\" aborted: rank 1: recv "
                                   "of 16 bytes from rank 3: timed out"));
  RendezvousClient never_joined(stub_, "cut", 1, 3);
  EXPECT_EQ(AbortGroup(never_joined, lost), lost);
}

TEST_F(RendezvousFixture, WaitsLongerThanTheServerLimitAreClampedNotRefused) {
  // Gloo may ask its store for a longer wait than the planner serves (1 h).
  RendezvousClient a(stub_, "g", 0, 1);
  ASSERT_EQ(a.Join(1).value(), 1);
  ASSERT_THAT(a.Set("k", "v"), IsOk());
  EXPECT_THAT(a.Get({"k"}, absl::Hours(2)).value(), ElementsAre("v"));
  EXPECT_THAT(a.AwaitMembers(absl::Hours(2)).value(), ElementsAre(0));
}

TEST(WorkerDaemonTest, ControlRequestsBeforeTheGroupForms) {
  NullWorkerObserver observer;
  DaemonOptions o;
  o.world_size = 4;
  o.steps = 0;
  DaemonOptions o1 = o;
  o1.rank = 1;
  const core::RealClock clock;
  WorkerDaemon driver(o, nullptr, nullptr, nullptr, &observer, &clock);
  WorkerDaemon other(o1, nullptr, nullptr, nullptr, &observer, &clock);
  EXPECT_THAT(other.StartRun(5, "", ""),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 1 is not the driver; send StartRun to rank 0")));
  EXPECT_THAT(other.StopRun(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(driver.StartRun(0, "", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps: must be >= 1")));
  EXPECT_THAT(driver.StartRun(5, "nope", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("strategy: unknown")));
  EXPECT_THAT(driver.StartRun(5, "", "nope"), StatusIs(absl::StatusCode::kInvalidArgument));
  // A huge name is quoted short: gRPC carries the message in a header, and
  // an 8 KB one came back RESOURCE_EXHAUSTED (metadata too large) from
  // WorkerControl, not INVALID_ARGUMENT.
  const std::string huge(8192, 'x');
  for (const absl::Status& s : {driver.StartRun(5, huge, ""), driver.StartRun(5, "", huge)}) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"... (8192 bytes)")));
    EXPECT_LT(s.message().size(), 400u) << s;
  }
  EXPECT_THAT(driver.StartRun(5, "llama3", "full_kv"), IsOk());
  EXPECT_THAT(driver.StartRun(5, "", ""),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already going")));
  EXPECT_THAT(driver.StopRun(), IsOk());  // drops the pending run
  EXPECT_THAT(driver.StartRun(5, "", ""), IsOk());
  const v1::WorkerStatus s = driver.Status();
  EXPECT_EQ(s.state(), v1::WorkerStatus::IDLE);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.world_size(), 4);
  EXPECT_EQ(s.group(), "g0");
  EXPECT_EQ(s.device(), "cpu");
  EXPECT_EQ(s.strategy(), "flashcp");
  EXPECT_EQ(s.scheme(), "allgather");
}

// Issue 31 item 5: one Join replacing a waiting rank made the real worker
// exit, though the docs said it takes its rank back. AwaitGroup joins again
// when its wait ends because the rank was replaced, and the group forms with
// the real rank in it.
TEST_F(RendezvousFixture, AReplacedRankJoinsAgainAndTakesItsPlaceBack) {
  const std::string secret = "job-secret";
  RendezvousClient real(stub_, "job", 0, /*incarnation=*/1, secret);
  ASSERT_EQ(real.Join(2).value(), 2);
  core::RealClock clock;
  absl::StatusOr<std::vector<int32_t>> formed;
  std::thread waiting([&] { formed = AwaitGroup(real, 2, clock.Now() + absl::Seconds(30), clock); });
  // Polls (bounded) until `n` waits are registered: the calls are on gRPC's threads.
  const auto waits_reach = [&](size_t n) {
    const absl::Time limit = absl::Now() + absl::Seconds(30);
    while (host().state().waiter_count() != n && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return host().state().waiter_count() == n;
  };
  ASSERT_TRUE(waits_reach(1));
  // A stale or stray process of the same job takes rank 0 while the group forms.
  RendezvousClient rogue(stub_, "job", 0, /*incarnation=*/2, secret);
  ASSERT_EQ(rogue.Join(2).value(), 2);
  // The real rank's wait ended; it joined again and waits again, and the
  // rogue's token is void.
  const absl::Time limit = absl::Now() + absl::Seconds(30);
  while (rogue.Set("k", "v").ok() && absl::Now() < limit) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_THAT(rogue.Set("k", "v"), StatusIs(absl::StatusCode::kPermissionDenied));
  ASSERT_TRUE(waits_reach(1));
  RendezvousClient rank1(stub_, "job", 1, /*incarnation=*/3, secret);
  ASSERT_EQ(rank1.Join(2).value(), 2);
  waiting.join();
  ASSERT_THAT(formed.status(), IsOk());
  EXPECT_THAT(*formed, ElementsAre(0, 1));
  EXPECT_THAT(real.Set("k", "v"), IsOk());  // its token is a member's
}

TEST(WorkerDaemonTest, UnreachablePlannerFailsUnavailableAfterTheTimeout) {
  NullWorkerObserver observer;
  DaemonOptions o;
  o.world_size = 2;
  o.timeout = absl::Seconds(1);
  // A port nobody listens on.
  const absl::StatusOr<int> port = tests::testing::FreeLoopbackPort();
  ASSERT_THAT(port.status(), IsOk());
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port),
                                                          grpc::InsecureChannelCredentials()));
  core::ManualClock clock;
  BackendConfig backend;
  backend.clock = &clock;
  WorkerDaemon daemon(o, std::move(stub), nullptr, MakeCpuRankBackend(backend), &observer,
                      &clock);
  EXPECT_THAT(daemon.Run(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("rendezvous Join")));
  // Joins at 0, 100, 300 and 700 ms of the clock; the next backoff (800 ms)
  // would pass the 1 s timeout, so the daemon gives up after sleeping
  // 100 + 200 + 400 ms and no longer.
  EXPECT_EQ(clock.slept(), absl::Milliseconds(700));
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Milliseconds(700));
  EXPECT_EQ(daemon.Status().state(), v1::WorkerStatus::FAILED);
}

// A rank backend whose steps take exactly `forward` and `backward` of the
// clock's time (it advances the clock), 125 ms of it in collectives, and move
// no bytes; its elements are `dtype_bytes` wide (2, as on CUDA's bf16).
class ClockedEngine final : public RankBackend {
 public:
  ClockedEngine(core::ManualClock* clock, absl::Duration forward, absl::Duration backward,
                int32_t dtype_bytes)
      : clock_(clock), forward_(forward), backward_(backward), dtype_bytes_(dtype_bytes) {}
  int32_t dtype_bytes() const override { return dtype_bytes_; }
  absl::Status Connect(gloo::rendezvous::Store&, int32_t rank, int32_t size,
                       absl::Duration) override {
    connected_as_ = {rank, size};
    return absl::OkStatus();
  }
  absl::StatusOr<StepMeasurement> Run(const core::Plan&, core::CommScheme, uint64_t,
                                      Communicator&) override {
    clock_->Advance(forward_);
    clock_->Advance(backward_);
    ++runs_;
    StepMeasurement m;
    m.forward_seconds = absl::ToDoubleSeconds(forward_);
    m.backward_seconds = absl::ToDoubleSeconds(backward_);
    m.comm_seconds = 0.125;
    m.attention_seconds = m.forward_seconds + m.backward_seconds - m.comm_seconds;
    return m;
  }
  int runs_ = 0;
  std::pair<int32_t, int32_t> connected_as_{-1, -1};

 private:
  core::ManualClock* const clock_;
  const absl::Duration forward_, backward_;
  const int32_t dtype_bytes_;
};

// Sum and count of a histogram series, or {-1, -1} if absent.
std::pair<double, int64_t> Histogram(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name || f.metric.empty()) continue;
    return {f.metric[0].histogram.sample_sum,
            static_cast<int64_t>(f.metric[0].histogram.sample_count)};
  }
  return {-1, -1};
}

// Sum over a counter family's series, or -1 if it has none.
double CounterSum(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name || f.metric.empty()) continue;
    double sum = 0;
    for (const prometheus::ClientMetric& m : f.metric) sum += m.counter.value;
    return sum;
  }
  return -1;
}

// A one-rank group `group` of small batches that runs `steps` steps, one
// plan in flight.
DaemonOptions OneRankOptions(const std::string& group, int64_t steps) {
  DaemonOptions o;
  o.world_size = 1;
  o.group = group;
  o.context = 1024;
  o.heads = 2;
  o.head_dim = 8;
  o.steps = steps;
  o.prefetch = 1;
  return o;
}

TEST_F(RendezvousFixture, StepAndPlanWaitTimesAreExactlyTheClocks) {
  // A one-rank group (Gloo over loopback through the in-process rendezvous),
  // a planner whose first plan takes 2 s of the clock, and an engine with
  // 2-byte elements whose forward and backward take 250 ms and 500 ms of it.
  core::ManualClock clock;
  prometheus::Registry registry;
  PrometheusWorkerMetrics metrics(registry, "test");
  const DaemonOptions o = OneRankOptions("clocked", 3);
  auto planner = std::make_shared<testing::ScriptedPlanner>(&clock, absl::Seconds(2));
  auto engine = std::make_unique<ClockedEngine>(&clock, absl::Milliseconds(250),
                                                absl::Milliseconds(500), /*dtype_bytes=*/2);
  ClockedEngine* const engine_ptr = engine.get();
  WorkerDaemon daemon(o, stub_, planner, std::move(engine), &metrics, &clock);
  ASSERT_THAT(daemon.Run(), IsOk());
  EXPECT_EQ(engine_ptr->runs_, 3);
  EXPECT_EQ(engine_ptr->connected_as_, std::make_pair(0, 1));
  // Plans are asked for at the backend's element size, so that their byte
  // predictions match what the backend moves (the proto's default is 8).
  EXPECT_EQ(planner->request_dtype_bytes(), (std::vector<int32_t>{2, 2, 2}));
  // Step 1 waited 2 s for its plan; steps 2 and 3 found theirs ready (no
  // clock time passes outside the planner's first answer and the engine).
  EXPECT_EQ(Histogram(registry, "flashcp_worker_plan_wait_duration_seconds"),
            std::make_pair(2.0, int64_t{3}));
  EXPECT_EQ(Histogram(registry, "flashcp_worker_step_duration_seconds"),
            std::make_pair(2.0 + 3 * 0.75, int64_t{3}));
  EXPECT_EQ(Histogram(registry, "flashcp_worker_attention_forward_duration_seconds"),
            std::make_pair(3 * 0.25, int64_t{3}));
  EXPECT_EQ(Histogram(registry, "flashcp_worker_attention_backward_duration_seconds"),
            std::make_pair(3 * 0.5, int64_t{3}));
  EXPECT_EQ(Histogram(registry, "flashcp_worker_comm_duration_seconds"),
            std::make_pair(3 * 0.125, int64_t{3}));
  // Attention seconds: forward + backward - comm per step (the engine's own
  // attention_seconds), summed; the plans' pairs for this one rank are all
  // the batches' pairs, s (s + 1) / 2 per document.
  EXPECT_EQ(CounterSum(registry, "flashcp_worker_attention_seconds_total"), 3 * 0.625);
  double pairs = 0;
  for (int64_t batch = 0; batch < 3; ++batch) {
    const absl::StatusOr<std::vector<int64_t>> lens =
        core::SampleBatch(o.dataset, o.context, o.seed, batch);
    ASSERT_THAT(lens.status(), IsOk());
    for (const int64_t d : *lens) pairs += static_cast<double>(d * (d + 1) / 2);
  }
  EXPECT_EQ(CounterSum(registry, "flashcp_worker_predicted_workload_pairs_total"), pairs);
  // Under the pairs profile the predicted cost is the pairs.
  EXPECT_EQ(CounterSum(registry, "flashcp_worker_predicted_cost_total"), pairs);
  // One rank sends nothing, and the plans predict nothing.
  EXPECT_EQ(CounterSum(registry, "flashcp_worker_predicted_bytes_sent_total"), 0);
  // No --cluster: no predicted step.
  EXPECT_EQ(CounterSum(registry, "flashcp_worker_predicted_step_seconds_total"), 0);
  const v1::WorkerStatus s = daemon.Status();
  EXPECT_EQ(s.steps_done(), 3);
  EXPECT_EQ(s.last_step_seconds(), 0.75);
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Seconds(2) + 3 * absl::Milliseconds(750));
}

TEST_F(RendezvousFixture, ExportsThePlansPredictedStepOnTheCluster) {
  // --cluster h200: every plan request asks for the step-time model's
  // prediction, and the rank's counter sums the plans' predicted steps,
  // each the model's for that batch's plan (core::ReportStepTime).
  core::ManualClock clock;
  prometheus::Registry registry;
  PrometheusWorkerMetrics metrics(registry, "test");
  DaemonOptions o = OneRankOptions("predicted-step", 3);
  o.cluster = "h200";
  auto planner = std::make_shared<testing::ScriptedPlanner>(&clock, absl::ZeroDuration());
  auto engine = std::make_unique<ClockedEngine>(&clock, absl::Milliseconds(250),
                                                absl::Milliseconds(500), /*dtype_bytes=*/2);
  WorkerDaemon daemon(o, stub_, planner, std::move(engine), &metrics, &clock);
  ASSERT_THAT(daemon.Run(), IsOk());
  EXPECT_EQ(planner->request_clusters(), (std::vector<std::string>{"h200", "h200", "h200"}));
  const absl::StatusOr<core::Strategy> strategy = core::ParseStrategy(o.strategy);
  ASSERT_THAT(strategy.status(), IsOk());
  const absl::StatusOr<core::ClusterSpec> h200 = core::ClusterPreset("h200");
  ASSERT_THAT(h200.status(), IsOk());
  double want = 0;
  for (int64_t batch = 0; batch < 3; ++batch) {
    absl::StatusOr<std::vector<int64_t>> lens =
        core::SampleBatch(o.dataset, o.context, o.seed, batch);
    ASSERT_THAT(lens.status(), IsOk());
    const absl::StatusOr<core::Plan> plan = core::MakePlan(*strategy, core::Batch{*lens, 1});
    ASSERT_THAT(plan.status(), IsOk());
    core::ClusterSpec cluster = *h200;
    cluster.ranks_per_node = 0;  // the request's (none)
    const absl::StatusOr<core::StepTimeReport> r = core::ReportStepTime(
        *strategy, *plan, core::ModelShape{.heads = 2, .head_dim = 8, .dtype_bytes = 2}, 1,
        cluster);
    ASSERT_THAT(r.status(), IsOk());
    want += r->native().step_seconds;
  }
  EXPECT_GT(want, 0);
  EXPECT_NEAR(CounterSum(registry, "flashcp_worker_predicted_step_seconds_total"), want,
              1e-12 * want);
}

// Issue 31 item 3: a per-item plan error (the planner refused one batch)
// fails the run, not the group: Run() ends OK, the status says why.
TEST_F(RendezvousFixture, APerItemPlanErrorFailsTheRunNotTheGroup) {
  core::ManualClock clock;
  NullWorkerObserver observer;
  const DaemonOptions o = OneRankOptions("item-error", 3);
  auto planner = std::make_shared<testing::ScriptedPlanner>(&clock, absl::ZeroDuration());
  planner->FailAnswer(1, absl::InvalidArgumentError("rank_speed: needs a cost model other than "
                                                    "pairs (cost_profile or cost)"));
  auto engine = std::make_unique<ClockedEngine>(&clock, absl::Milliseconds(10),
                                                absl::Milliseconds(20), 2);
  ClockedEngine* const engine_ptr = engine.get();
  WorkerDaemon daemon(o, stub_, planner, std::move(engine), &observer, &clock);
  ASSERT_THAT(daemon.Run(), IsOk());
  EXPECT_EQ(engine_ptr->runs_, 1);
  const v1::WorkerStatus s = daemon.Status();
  EXPECT_EQ(s.state(), v1::WorkerStatus::IDLE);
  EXPECT_EQ(s.error(),
            "INVALID_ARGUMENT: run failed after 1 of 3 steps: rank_speed: needs a cost model "
            "other than pairs (cost_profile or cost)");
}

// The daemon's observer seam: a recording double.
class RecordingObserver final : public WorkerObserver {
 public:
  void OnRunStart(absl::string_view strategy, absl::string_view scheme) override {
    runs.push_back(absl::StrCat(strategy, "/", scheme));
  }
  void OnStep(absl::string_view strategy, absl::string_view scheme,
              const StepRecord& record) override {
    EXPECT_EQ(absl::StrCat(strategy, "/", scheme), want_run);
    steps.push_back(record);
  }
  void OnGroupEvent(GroupEvent event, const absl::Status& status) override {
    events.push_back(event);
    last_status = status;
  }
  void OnRunEnd(absl::string_view summary) override { summaries.emplace_back(summary); }
  std::string want_run = "llama3/full_kv";  // every step's strategy/scheme
  std::vector<std::string> runs;
  std::vector<std::string> summaries;
  std::vector<StepRecord> steps;
  std::vector<GroupEvent> events;
  absl::Status last_status;
};

TEST_F(RendezvousFixture, TheDaemonReportsThroughItsObserver) {
  core::ManualClock clock;
  RecordingObserver observer;
  DaemonOptions o = OneRankOptions("observed", 2);
  o.strategy = "llama3";
  o.scheme = core::CommScheme::kFullKv;
  auto planner = std::make_shared<testing::ScriptedPlanner>(&clock, absl::Seconds(1));
  WorkerDaemon daemon(o, stub_, planner,
                      std::make_unique<ClockedEngine>(&clock, absl::Milliseconds(250),
                                                      absl::Milliseconds(500), 4),
                      &observer, &clock);
  ASSERT_THAT(daemon.Run(), IsOk());
  // Before the group forms (the configured pair), then the run's start.
  EXPECT_THAT(observer.runs, ElementsAre("llama3/full_kv", "llama3/full_kv"));
  ASSERT_EQ(observer.steps.size(), 2u);
  EXPECT_EQ(observer.steps[0].plan_wait_seconds, 1.0);
  EXPECT_EQ(observer.steps[0].step_seconds, 1.75);
  EXPECT_EQ(observer.steps[1].plan_wait_seconds, 0.0);
  EXPECT_EQ(observer.steps[1].step_seconds, 0.75);
  EXPECT_EQ(observer.steps[1].forward_seconds, 0.25);
  EXPECT_EQ(observer.steps[1].attention_time_ratio, 1.0);  // one rank: its own mean
  using Event = WorkerObserver::GroupEvent;
  EXPECT_THAT(observer.events, ElementsAre(Event::kForming, Event::kFormed, Event::kEnded));
  EXPECT_THAT(observer.last_status, IsOk());
  // The run's summary goes to the observer (flashcp-worker prints it), once.
  ASSERT_EQ(observer.summaries.size(), 1u);
  EXPECT_THAT(observer.summaries[0],
              ::testing::StartsWith("RUN {\"strategy\":\"llama3\",\"scheme\":\"full_kv\","
                                    "\"steps\":2,\"step_seconds\":1.250000,"));

  // A group that cannot form: forming, then failed with the reason.
  RecordingObserver failed;
  DaemonOptions lone = o;
  lone.world_size = 2;
  lone.group = "never";
  lone.timeout = absl::Seconds(1);
  core::ManualClock lone_clock;
  WorkerDaemon never(lone, stub_, planner,
                     std::make_unique<ClockedEngine>(&lone_clock, absl::ZeroDuration(),
                                                     absl::ZeroDuration(), 4),
                     &failed, &lone_clock);
  const absl::Status s = never.Run();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(failed.events, ElementsAre(Event::kForming, Event::kFailed));
  EXPECT_EQ(failed.last_status, s);
  EXPECT_TRUE(failed.steps.empty());
}

// A two-rank group: the follower's status follows the driver's step headers
// (the run's strategy and scheme from the header, its length, every step).
TEST_F(RendezvousFixture, TheFollowerTakesTheRunFromTheDriversHeaders) {
  std::vector<DaemonOptions> options(2, OneRankOptions("pair", 3));
  for (int r = 0; r < 2; ++r) {
    options[r].world_size = 2;
    options[r].rank = r;
    options[r].incarnation = 10 + r;
    options[r].strategy = "zigzag";
    options[r].scheme = core::CommScheme::kFullKv;
  }
  options[1].strategy = "flashcp";  // a follower's own flags do not choose the run
  options[1].scheme = core::CommScheme::kTargeted;
  std::vector<core::ManualClock> clocks(2);
  std::vector<NullWorkerObserver> observers(2);
  auto planner = std::make_shared<testing::ScriptedPlanner>(&clocks[0], absl::ZeroDuration());
  std::vector<std::unique_ptr<WorkerDaemon>> daemons;
  for (int r = 0; r < 2; ++r) {
    daemons.push_back(std::make_unique<WorkerDaemon>(
        options[r], stub_, r == 0 ? planner : nullptr,
        std::make_unique<ClockedEngine>(&clocks[r], absl::Milliseconds(10),
                                        absl::Milliseconds(20), 4),
        &observers[r], &clocks[r]));
  }
  std::vector<absl::Status> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] { results[r] = daemons[r]->Run(); });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_THAT(results[0], IsOk());
  ASSERT_THAT(results[1], IsOk());
  for (int r = 0; r < 2; ++r) {
    const v1::WorkerStatus s = daemons[r]->Status();
    EXPECT_EQ(s.state(), v1::WorkerStatus::IDLE) << r;
    EXPECT_EQ(s.steps_done(), 3) << r;
    EXPECT_EQ(s.steps_total(), 3) << r;
    EXPECT_EQ(s.strategy(), "zigzag") << r;
    EXPECT_EQ(s.scheme(), "full_kv") << r;
    EXPECT_EQ(s.last_step_seconds(), 0.03) << r;
  }
}

// Block diffusion on a real two-rank CPU group (Gloo over loopback, the CPU
// engine) against real plans: every step runs the 2C-row [noisy ; clean]
// plan the requests asked for, and each rank's bytes sent per step are
// AnalyzePlan's prediction for it.
TEST_F(RendezvousFixture, ABlockDiffusionRunStepsTheMaskWithThePredictedBytes) {
  constexpr int64_t kSteps = 2;
  struct Run {
    std::string strategy;
    core::CommScheme scheme;
  };
  for (const Run& run : {Run{"csbp", core::CommScheme::kAllGather},
                         Run{"flashcp", core::CommScheme::kTargeted}}) {
    SCOPED_TRACE(run.strategy);
    std::vector<DaemonOptions> options(2, OneRankOptions("bdlm-" + run.strategy, kSteps));
    for (int r = 0; r < 2; ++r) {
      options[r].world_size = 2;
      options[r].rank = r;
      options[r].incarnation = 20 + r;
      options[r].strategy = run.strategy;
      options[r].scheme = run.scheme;
      options[r].attention_mask = {core::MaskKind::kBlockDiffusion, 4};
      ASSERT_THAT(ValidateDaemonOptions(options[r]), IsOk());
    }
    std::vector<core::ManualClock> clocks(2);
    std::vector<RecordingObserver> observers(2);
    for (RecordingObserver& o : observers) {
      o.want_run = absl::StrCat(run.strategy, "/", core::CommSchemeName(run.scheme));
    }
    auto planner = std::make_shared<testing::ScriptedPlanner>(&clocks[0], absl::ZeroDuration());
    std::vector<std::unique_ptr<WorkerDaemon>> daemons;
    for (int r = 0; r < 2; ++r) {
      daemons.push_back(std::make_unique<WorkerDaemon>(
          options[r], stub_, r == 0 ? planner : nullptr,
          MakeCpuRankBackend({.rank = r,
                              .heads = options[r].heads,
                              .head_dim = options[r].head_dim,
                              .threads = 1,
                              .clock = &clocks[r],
                              .thread_cpu_seconds = nullptr}),
          &observers[r], &clocks[r]));
    }
    std::vector<absl::Status> results(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] { results[r] = daemons[r]->Run(); });
    }
    for (std::thread& t : ranks) t.join();
    ASSERT_THAT(results[0], IsOk());
    ASSERT_THAT(results[1], IsOk());
    // Every plan was asked for under the mask (the planner plans the 2n
    // documents [noisy ; clean]).
    EXPECT_EQ(planner->request_masks(),
              (std::vector<std::pair<std::string, int64_t>>(kSteps, {"block_diffusion", 4})));
    int64_t sent = 0;
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(daemons[r]->Status().steps_done(), kSteps) << r;
      ASSERT_EQ(observers[r].steps.size(), static_cast<size_t>(kSteps)) << r;
      for (const StepRecord& step : observers[r].steps) {
        EXPECT_EQ(step.bytes_sent, step.predicted_bytes_sent) << r;
        sent += step.bytes_sent;
      }
    }
    EXPECT_GT(sent, 0);  // two ranks exchange K/V: the check above compared something
    // Each step's plan is the 2C-row one: its ranks' workloads add up to the
    // block-diffusion workload of the step's batch (batches 0, 1, ...).
    for (int64_t k = 0; k < kSteps; ++k) {
      const absl::StatusOr<std::vector<int64_t>> lens =
          core::SampleBatch(options[0].dataset, options[0].context, options[0].seed, k);
      ASSERT_THAT(lens.status(), IsOk());
      double want = 0;
      for (const int64_t d : *lens) want += core::BlockDiffusionDocWorkload(d, 4);
      EXPECT_DOUBLE_EQ(observers[0].steps[k].predicted_workload +
                           observers[1].steps[k].predicted_workload,
                       want)
          << k;
    }
  }
}

TEST(ValidateDaemonOptionsTest, Table) {
  struct Case {
    void (*edit)(DaemonOptions&);
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](DaemonOptions&) {}, absl::StatusCode::kOk, ""},
      {[](DaemonOptions& o) { o.rank = 4; }, absl::StatusCode::kInvalidArgument, "--rank"},
      {[](DaemonOptions& o) { o.world_size = 0; }, absl::StatusCode::kInvalidArgument,
       "--world_size"},
      {[](DaemonOptions& o) { o.strategy = "nope"; }, absl::StatusCode::kInvalidArgument,
       "--strategy"},
      {[](DaemonOptions& o) { o.prefetch = 0; }, absl::StatusCode::kInvalidArgument, "--prefetch"},
      {[](DaemonOptions& o) { o.cluster = "nope"; }, absl::StatusCode::kInvalidArgument,
       "--cluster: cluster preset \"nope\" is unknown"},
      {[](DaemonOptions& o) { o.cluster = "h100-sxm"; }, absl::StatusCode::kOk, ""},
      {[](DaemonOptions& o) { o.timeout = absl::ZeroDuration(); },
       absl::StatusCode::kInvalidArgument, "--timeout_s"},
      {[](DaemonOptions& o) { o.timeout = absl::Seconds(3601); },
       absl::StatusCode::kInvalidArgument,
       "--timeout_s: must be in [1, 3600] (the planner's rendezvous wait limit), got 3601"},
      {[](DaemonOptions& o) { o.timeout = absl::Seconds(3600); }, absl::StatusCode::kOk, ""},
      {[](DaemonOptions& o) { o.world_size = 1025; o.rank = 0; },
       absl::StatusCode::kInvalidArgument, "--world_size: must be in [1, 1024], got 1025"},
      {[](DaemonOptions& o) { o.context = 2; }, absl::StatusCode::kInvalidArgument, "--context"},
      {[](DaemonOptions& o) { o.steps = -1; }, absl::StatusCode::kInvalidArgument, "--steps"},
      {[](DaemonOptions& o) { o.rank_speed_window = -1; }, absl::StatusCode::kInvalidArgument,
       "--rank_speed_window: must be in [0, 1024], got -1"},
      {[](DaemonOptions& o) { o.rank_speed_window = 1025; }, absl::StatusCode::kInvalidArgument,
       "--rank_speed_window: must be in [0, 1024], got 1025"},
      {[](DaemonOptions& o) { o.rank_speed_window = 0; }, absl::StatusCode::kOk, ""},
      // A bad target was silently the planner's default (only > 0 was sent).
      {[](DaemonOptions& o) { o.target_imbalance = -1; }, absl::StatusCode::kInvalidArgument,
       "--target_imbalance: must be 0 (the planner's default) or a finite ratio >= 1, got -1"},
      {[](DaemonOptions& o) { o.target_imbalance = std::nan(""); },
       absl::StatusCode::kInvalidArgument, "--target_imbalance: must be 0 (the planner's "
       "default) or a finite ratio >= 1, got nan"},
      {[](DaemonOptions& o) { o.target_imbalance = 0.99; }, absl::StatusCode::kInvalidArgument,
       "--target_imbalance"},
      {[](DaemonOptions& o) { o.target_imbalance = HUGE_VAL; },
       absl::StatusCode::kInvalidArgument, "--target_imbalance"},
      {[](DaemonOptions& o) { o.target_imbalance = 1; }, absl::StatusCode::kOk, ""},
      {[](DaemonOptions& o) { o.target_imbalance = 1.05; }, absl::StatusCode::kOk, ""},
      {[](DaemonOptions& o) { o.heads = 0; }, absl::StatusCode::kInvalidArgument,
       "--heads: must be in [1, 1024], got 0"},
      {[](DaemonOptions& o) { o.head_dim = 1025; }, absl::StatusCode::kInvalidArgument,
       "--head_dim: must be in [1, 1024], got 1025"},
      {[](DaemonOptions& o) { o.attention_mask = {core::MaskKind::kBlockDiffusion, 4}; },
       absl::StatusCode::kOk, ""},
      {[](DaemonOptions& o) { o.attention_mask = {core::MaskKind::kBlockDiffusion, 0}; },
       absl::StatusCode::kInvalidArgument,
       "--block_size: must be in [1, 2^40] with attention_mask block_diffusion, got 0"},
      {[](DaemonOptions& o) { o.attention_mask = {core::MaskKind::kCausalDocument, 4}; },
       absl::StatusCode::kInvalidArgument,
       "--block_size: only with attention_mask block_diffusion, got 4 with causal_document"},
      {[](DaemonOptions& o) {
         o.attention_mask = {core::MaskKind::kBlockDiffusion, 4};
         o.strategy = "magi";
       },
       absl::StatusCode::kInvalidArgument,
       "--strategy: \"magi\" does not plan --attention_mask=block_diffusion"},
  };
  for (const Case& c : cases) {
    DaemonOptions o;
    o.world_size = 4;
    c.edit(o);
    const absl::Status s = ValidateDaemonOptions(o);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

TEST(ValidateDaemonOptionsTest, Device) {
  // Whether cuda:K is usable is MakeRankBackend's to say.
  for (const char* good : {"cpu", "cuda:0", "cuda:4095"}) {
    DaemonOptions o;
    o.device = good;
    EXPECT_THAT(ValidateDaemonOptions(o), IsOk()) << good;
  }
  for (const char* bad :
       {"gpu", "cuda:x", "cuda:-1", "cuda:", "cuda:+1", "cuda: 1", "cuda:4096", "cuda:0x1"}) {
    DaemonOptions o;
    o.device = bad;
    EXPECT_THAT(ValidateDaemonOptions(o),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("--device: want cpu or cuda:K (K a device index, "
                                      "0..4095), got \"",
                                      bad, "\"")));
  }
}

TEST(PrometheusWorkerMetricsTest, EverySeriesCarriesDeviceGpuAndLocalRank) {
  prometheus::Registry registry;
  PrometheusWorkerMetrics metrics(registry, "test", LabelsForDevice("cuda:3", "1"));
  metrics.SetWorldSize(8);
  metrics.OnRunStart("flashcp", "targeted");
  metrics.OnStep("flashcp", "targeted", StepRecord{});  // the two last-step gauges too
  const std::vector<prometheus::MetricFamily> families = registry.Collect();
  // 5 histograms, 9 counters, 3 gauges and build_info.
  ASSERT_EQ(families.size(), 18u);
  for (const prometheus::MetricFamily& f : families) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> labels;
      for (const prometheus::ClientMetric::Label& l : m.label) labels[l.name] = l.value;
      EXPECT_EQ(labels["device"], "cuda") << f.name;
      EXPECT_EQ(labels["gpu"], "3") << f.name;
      EXPECT_EQ(labels["local_rank"], "1") << f.name;
    }
  }
  const WorkerLabels cpu = LabelsForDevice("cpu", "");
  EXPECT_EQ(cpu.device, "cpu");
  EXPECT_EQ(cpu.gpu, "");
  EXPECT_EQ(cpu.local_rank, "");
}

TEST(WorkerDaemonTest, RunWithoutABackendIsRefused) {
  NullWorkerObserver observer;
  const core::RealClock clock;
  WorkerDaemon daemon(DaemonOptions{}, nullptr, nullptr, nullptr, &observer, &clock);
  EXPECT_THAT(daemon.Run(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     "the daemon has no rank backend"));
}

TEST(MakeRankBackendTest, PicksTheBackendForTheDevice) {
  const core::RealClock clock;
  BackendConfig config;
  config.heads = 2;
  config.head_dim = 8;
  config.clock = &clock;
  EXPECT_THAT(MakeRankBackend("cpu", config, nullptr).status(), IsOk());
  EXPECT_EQ(MakeRankBackend("cpu", config, nullptr).value()->dtype_bytes(), 4);
  // A build without CUDA has no factory.
  EXPECT_THAT(MakeRankBackend("cuda:0", config, nullptr).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "--device cuda:0: this flashcp-worker was built without CUDA; use "
                       "--device cpu"));
  std::vector<int32_t> asked;
  const CudaBackendFactory cuda = [&](int32_t device, const BackendConfig&)
      -> absl::StatusOr<std::unique_ptr<RankBackend>> {
    asked.push_back(device);
    return absl::FailedPreconditionError("no device here");
  };
  EXPECT_THAT(MakeRankBackend("cuda:3", config, cuda).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no device here"));
  EXPECT_THAT(MakeRankBackend("cuda:x", config, cuda).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--device")));
  EXPECT_THAT(MakeRankBackend("cuda:-1", config, cuda).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--device")));
  EXPECT_THAT(asked, ElementsAre(3));
}

TEST(SummaryLineTest, Exact) {
  EXPECT_EQ(SummaryLine("flashcp", "allgather", 3, 0.5, 0.25, 0.125, 0.001, 1.0625, 1.02, 96, 128),
            "RUN {\"strategy\":\"flashcp\",\"scheme\":\"allgather\",\"steps\":3,"
            "\"step_seconds\":0.500000,\"attention_seconds\":0.250000,\"comm_seconds\":0.125000,"
            "\"plan_wait_seconds\":0.001000,\"measured_imbalance\":1.0625,"
            "\"predicted_imbalance\":1.0200,\"bytes_sent\":96,\"full_kv_bytes\":128}");
}

}  // namespace
}  // namespace flashcp::worker
