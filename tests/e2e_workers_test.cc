// End to end with the real parts on loopback: flashcp-planner, a group of 4
// flashcp-worker processes (CPU, Gloo over TCP) and Debian's Prometheus
// scraping them with deploy/prometheus's config and rules. Every port is
// picked by the OS (or bound-checked, for Prometheus); every wait polls with
// a deadline.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "flashcp/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/testing/grpc_probes.h"
#include "tests/testing/http.h"
#include "tests/testing/idle_connections.h"
#include "tests/testing/metrics_text.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/ports.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/worker_process.h"

namespace flashcp {
namespace {

using core::testing::IsOk;
using tests::testing::PlannerProcess;
using tests::testing::Subprocess;
using ::testing::Contains;
using ::testing::Each;
using ::testing::Gt;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kRanks = 4;
constexpr int64_t kContext = 4096;
constexpr int kHeads = 2, kHeadDim = 32;
const char kSource[] = FLASHCP_SOURCE_DIR;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// ---- workers ---------------------------------------------------------------
using Worker = tests::testing::WorkerProcess;

absl::StatusOr<Worker> StartWorker(int rank, const std::string& group, const std::string& planner,
                                   std::vector<std::string> extra) {
  std::vector<std::string> args = {"--rank",       absl::StrCat(rank),
                                   "--world_size", absl::StrCat(kRanks),
                                   "--group",      group,
                                   "--planner",    planner,
                                   "--context",    absl::StrCat(kContext),
                                   "--heads",      absl::StrCat(kHeads),
                                   "--head_dim",   absl::StrCat(kHeadDim),
                                   "--local_rank", absl::StrCat(rank)};
  args.insert(args.end(), extra.begin(), extra.end());
  return Worker::Start(FLASHCP_WORKER_BIN, args, In(absl::Seconds(60)));
}

std::unique_ptr<v1::WorkerControl::Stub> Control(const Worker& w) {
  return v1::WorkerControl::NewStub(
      grpc::CreateChannel(w.control, grpc::InsecureChannelCredentials()));
}

absl::StatusOr<v1::WorkerStatus> GetStatus(const Worker& w) {
  grpc::ClientContext c;
  c.set_deadline(absl::ToChronoTime(In(absl::Seconds(5))));
  v1::WorkerStatus s;
  const grpc::Status g = Control(w)->GetStatus(&c, v1::GetStatusRequest(), &s);
  if (!g.ok()) return absl::UnavailableError(g.error_message());
  return s;
}

// Polls rank `w`'s status until `pred` holds.
template <typename Pred>
absl::StatusOr<v1::WorkerStatus> AwaitStatus(const Worker& w, Pred pred, absl::Time deadline) {
  for (;;) {
    absl::StatusOr<v1::WorkerStatus> s = GetStatus(w);
    if (s.ok() && pred(*s)) return s;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("worker status: ", s.ok() ? s->ShortDebugString() : s.status().ToString()));
    }
    absl::SleepFor(absl::Milliseconds(50));  // poll interval, bounded by the deadline
  }
}

std::vector<Worker> StartGroup(const std::string& group, const std::string& planner,
                               const std::vector<std::string>& extra) {
  std::vector<Worker> ws;
  for (int r = 0; r < kRanks; ++r) {
    absl::StatusOr<Worker> w = StartWorker(r, group, planner, extra);
    EXPECT_THAT(w.status(), IsOk());
    if (!w.ok()) return {};
    ws.push_back(*std::move(w));
  }
  return ws;
}

// ---- Prometheus ------------------------------------------------------------

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

class Prometheus {
 public:
  // Renders deploy/prometheus for these targets (1 s scrape and evaluation)
  // and starts Prometheus on a free loopback port, retrying if it is taken.
  static absl::StatusOr<std::unique_ptr<Prometheus>> Start(
      const std::string& planner_metrics, const std::vector<std::string>& worker_targets) {
    if (access("/usr/bin/prometheus", X_OK) != 0 || access("/usr/bin/promtool", X_OK) != 0) {
      return absl::FailedPreconditionError(
          "/usr/bin/prometheus and promtool are needed (Debian's prometheus package; "
          "scripts/install-deps.sh installs it)");
    }
    auto p = std::unique_ptr<Prometheus>(new Prometheus());
    char tmpl[] = "/tmp/flashcp-e2e-prom-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp");
    p->dir_ = tmpl;
    std::vector<std::string> render = {"/bin/bash",
                                       absl::StrCat(kSource, "/deploy/prometheus/render-local.sh"),
                                       p->dir_ + "/p", "--interval", "1s", "--planner",
                                       planner_metrics};
    for (const std::string& w : worker_targets) {
      render.push_back("--worker");
      render.push_back(w);
    }
    auto r = tests::testing::RunCommand(render, "", In(absl::Seconds(30)));
    if (!r.ok()) return r.status();
    if (r->exit_code != 0) return absl::InternalError("render-local.sh: " + r->output);
    for (int attempt = 0; attempt < 3; ++attempt) {
      const absl::StatusOr<int> port = tests::testing::FreeLoopbackPort();
      if (!port.ok()) return port.status();
      p->address_ = absl::StrCat("127.0.0.1:", *port);
      auto proc = Subprocess::Start(
          {"/usr/bin/prometheus", "--config.file=" + p->dir_ + "/p/prometheus.yml",
           "--storage.tsdb.path=" + p->dir_ + "/data", "--web.listen-address=" + p->address_,
           "--log.level=warn"},
          {.pipe_stdin = false, .merge_stderr = true});
      if (!proc.ok()) return proc.status();
      p->process_ = *std::move(proc);
      const absl::Time deadline = In(absl::Seconds(30));
      while (absl::Now() < deadline) {
        auto ready = tests::testing::HttpGet(p->address_, "/-/ready", In(absl::Seconds(2)));
        if (ready.ok() && ready->status == 200) return p;
        if (p->process_->Wait(absl::Now()).ok()) break;  // exited: port taken?
        absl::SleepFor(absl::Milliseconds(100));
      }
    }
    return absl::UnavailableError("prometheus did not become ready");
  }
  ~Prometheus() {
    if (process_ != nullptr) {
      (void)process_->Signal(SIGTERM);
      (void)process_->Wait(In(absl::Seconds(30)));
    }
    (void)tests::testing::RunCommand({"/bin/rm", "-rf", dir_}, "", In(absl::Seconds(30)));
  }

  // The values of an instant query (one per series); empty: no data.
  absl::StatusOr<std::vector<double>> Query(const std::string& expr) const {
    auto r = tests::testing::HttpGet(address_, "/api/v1/query?query=" + UrlEncode(expr),
                                     In(absl::Seconds(10)));
    if (!r.ok()) return r.status();
    if (r->status != 200 || !absl::StrContains(r->body, "\"status\":\"success\"")) {
      return absl::InternalError(absl::StrCat("query ", expr, ": HTTP ", r->status, " ", r->body));
    }
    std::vector<double> values;
    static const std::regex value("\"value\":\\[[0-9.e+]+,\"([^\"]+)\"\\]");
    for (auto it = std::sregex_iterator(r->body.begin(), r->body.end(), value);
         it != std::sregex_iterator(); ++it) {
      double v = 0;
      if (!absl::SimpleAtod((*it)[1].str(), &v)) return absl::DataLossError(r->body);
      values.push_back(v);
    }
    return values;
  }

  // Polls until `expr` has exactly one series whose value satisfies `pred`.
  template <typename Pred>
  absl::StatusOr<double> AwaitValue(const std::string& expr, Pred pred, absl::Time deadline) {
    std::string last;
    for (;;) {
      auto v = Query(expr);
      if (v.ok() && v->size() == 1 && pred((*v)[0])) return (*v)[0];
      last = v.ok() ? absl::StrCat(v->size(), " series") : v.status().ToString();
      if (v.ok() && v->size() == 1) last = absl::StrCat("value ", (*v)[0]);
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(expr, ": ", last));
      }
      absl::SleepFor(absl::Milliseconds(250));  // poll interval, bounded by the deadline
    }
  }

  absl::StatusOr<std::string> Get(const std::string& path) const {
    auto r = tests::testing::HttpGet(address_, path, In(absl::Seconds(10)));
    if (!r.ok()) return r.status();
    return r->body;
  }

 private:
  Prometheus() = default;
  std::string dir_, address_;
  std::unique_ptr<Subprocess> process_;
};

std::vector<std::string> RecordingRules() {
  std::set<std::string> names;
  for (const char* f : {"flashcp-recording.yml", "flashcp-alerts.yml"}) {
    std::ifstream in(absl::StrCat(kSource, "/deploy/prometheus/rules/", f));
    std::string line;
    static const std::regex re("^\\s*- record:\\s*(\\S+)\\s*$");
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_match(line, m, re)) names.insert(m[1]);
    }
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> DashboardQueries() {
  auto r = tests::testing::RunCommand(
      {"/usr/bin/python3", "-c",
       "import json,sys\n"
       "d=json.load(open(sys.argv[1]))\n"
       "for p in d['panels']:\n"
       "  for t in p.get('targets',[]):\n"
       "    e=t['expr'].replace('\\n',' ')\n"
       "    for v in ('namespace','group','strategy','cp_size'): e=e.replace('$'+v,'.*')\n"
       "    print(e)\n",
       absl::StrCat(kSource, "/deploy/grafana/flashcp.json")},
      "", In(absl::Seconds(30)));
  if (!r.ok() || r->exit_code != 0) return {};
  return absl::StrSplit(r->output, '\n', absl::SkipEmpty());
}

absl::Status PromtoolCheck(const std::string& metrics_address) {
  auto body = tests::testing::HttpGet(metrics_address, "/metrics", In(absl::Seconds(10)));
  if (!body.ok()) return body.status();
  auto r = tests::testing::RunCommand({"/usr/bin/promtool", "check", "metrics"}, body->body,
                                      In(absl::Seconds(30)));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0 || !r->output.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(metrics_address, ": ", r->output));
  }
  return absl::OkStatus();
}

// ---- the tests ---------------------------------------------------------------

// The predicted comm saving (allgather vs full KV) of the run's plans, planned
// here through the same planner (which also makes its plan series exist
// before Prometheus first scrapes it; the mean over twice the same plans is
// the same mean).
double PlanRunAndMeanSaving(const PlannerProcess& planner, int64_t steps, uint64_t seed) {
  auto stub = v1::Planner::NewStub(planner.NewChannel());
  double sum = 0;
  for (int64_t i = 0; i < steps; ++i) {
    auto lens = core::SampleBatch(core::Dataset::kPile, kContext, seed, i);
    EXPECT_THAT(lens.status(), IsOk());
    const v1::PlanRequest req = proto::RequestToProto(
        0, core::Batch{*lens, kRanks}, core::Strategy::kFlashCp, core::PlanOptions{},
        core::ModelShape{kHeads, kHeadDim, 4}, false);
    grpc::ClientContext c;
    c.set_deadline(absl::ToChronoTime(In(absl::Seconds(30))));
    v1::PlanResponse resp;
    EXPECT_TRUE(stub->Plan(&c, req, &resp).ok());
    sum += resp.metrics().comm_saving_ratio();
  }
  return sum / steps;
}

TEST(E2eWorkersTest, RunThroughPrometheusRulesDashboardAndCommSaving) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  constexpr int64_t kSteps = 12;
  const double expected = PlanRunAndMeanSaving(**planner, kSteps, /*seed=*/1);
  ASSERT_GT(expected, 0.0);

  // --cluster: the plans carry a predicted step, so that the predicted-vs-measured
  // rules and panels have data too.
  std::vector<Worker> ws =
      StartGroup("e2e", (*planner)->grpc_address(),
                 {"--steps", "0", "--timeout_s", "20", "--seed", "1", "--cluster", "h100-sxm"});
  ASSERT_EQ(ws.size(), static_cast<size_t>(kRanks));
  std::vector<std::string> targets;
  for (int r = 0; r < kRanks; ++r) targets.push_back(absl::StrCat(ws[r].metrics, "=e2e/", r));
  auto prom = Prometheus::Start((*planner)->metrics_address(), targets);
  ASSERT_THAT(prom.status(), IsOk());
  Prometheus& p = **prom;

  // Every series exists at zero before the run (so rates see the whole run).
  const absl::Time setup = In(absl::Seconds(60));
  ASSERT_THAT(p.AwaitValue(absl::StrCat("sum(flashcp_planner_plan_comm_saving_ratio_count{"
                                        "strategy=\"flashcp\",scheme=\"allgather\"})"),
                           [&](double v) { return v == kSteps; }, setup)
                  .status(),
              IsOk());
  ASSERT_THAT(p.AwaitValue("count(flashcp_worker_bytes_sent_total{strategy=\"flashcp\","
                           "scheme=\"allgather\"} == 0)",
                           [](double v) { return v == kRanks; }, setup)
                  .status(),
              IsOk());
  for (const Worker& w : ws) {
    ASSERT_THAT(AwaitStatus(w, [](const v1::WorkerStatus& s) {
                  return s.state() == v1::WorkerStatus::IDLE;
                }, setup).status(), IsOk());
  }

  // Non-drivers refuse StartRun; the driver runs the group.
  {
    grpc::ClientContext c;
    v1::StartRunRequest req;
    req.set_steps(kSteps);
    v1::StartRunResponse resp;
    EXPECT_EQ(Control(ws[1])->StartRun(&c, req, &resp).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
    grpc::ClientContext c0;
    ASSERT_TRUE(Control(ws[0])->StartRun(&c0, req, &resp).ok());
  }
  const absl::Time run = In(absl::Seconds(120));
  for (const Worker& w : ws) {
    auto s = AwaitStatus(w, [](const v1::WorkerStatus& s) { return s.steps_done() == kSteps; },
                         run);
    ASSERT_THAT(s.status(), IsOk());
    EXPECT_EQ(s->steps_total(), kSteps);
    EXPECT_EQ(s->strategy(), "flashcp");
    EXPECT_EQ(s->scheme(), "allgather");
    EXPECT_EQ(s->world_size(), kRanks);
  }
  ASSERT_THAT(p.AwaitValue("sum(flashcp_worker_steps_total)",
                           [&](double v) { return v == kRanks * kSteps; }, run)
                  .status(),
              IsOk());
  ASSERT_THAT(p.AwaitValue("sum(flashcp_planner_plan_comm_saving_ratio_count{"
                           "strategy=\"flashcp\",scheme=\"allgather\"})",
                           [&](double v) { return v == 2 * kSteps; }, run)
                  .status(),
              IsOk());

  // Every recording rule and every dashboard query returns data.
  std::vector<std::string> exprs = RecordingRules();
  ASSERT_GE(exprs.size(), 10u);
  const std::vector<std::string> panels = DashboardQueries();
  ASSERT_GE(panels.size(), 10u);
  exprs.insert(exprs.end(), panels.begin(), panels.end());
  const absl::Time data = In(absl::Seconds(60));
  for (const std::string& e : exprs) {
    EXPECT_THAT(p.AwaitValue(absl::StrCat("count(", e, ")"), [](double v) { return v >= 1; }, data)
                    .status(),
                IsOk())
        << e;
  }
  auto rules = p.Get("/api/v1/rules");
  ASSERT_THAT(rules.status(), IsOk());
  EXPECT_THAT(*rules, Not(HasSubstr("\"health\":\"err\"")));

  // The comm saving Prometheus shows is the plans' predicted saving. Rules are
  // evaluated every second: poll until an evaluation has seen every target's
  // final scrape (the value is then constant).
  const absl::Time settle = In(absl::Seconds(30));
  const auto near = [&](double v) { return std::abs(v - expected) < 1e-9; };
  EXPECT_THAT(p.AwaitValue("flashcp:worker_comm_saving:ratio", near, settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp:planner_predicted_comm_saving:ratio_avg{scheme=\"allgather\"}",
                           near, settle)
                  .status(),
              IsOk());
  // Per group: the bytes sent are the plans' prediction for the same steps;
  // all 4 ranks answer; the rendezvous formed one group of 4 (4 joins); plan
  // series carry cp_size and worker series device.
  const auto exactly = [](double want) { return [want](double v) { return v == want; }; };
  EXPECT_THAT(p.AwaitValue("flashcp:worker_bytes_vs_predicted:ratio{group=\"e2e\"}", exactly(1),
                           settle)
                  .status(),
              IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp:worker_ranks_up:count{group=\"e2e\"}", exactly(kRanks),
                           settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp:worker_world_size:max{group=\"e2e\"}", exactly(kRanks),
                           settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp_planner_rendezvous_events_total{event=\"join\"}",
                           exactly(kRanks), settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp_planner_rendezvous_events_total{event=\"formed\"}",
                           exactly(1), settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp_planner_rendezvous_events_total{event=\"abort\"}",
                           exactly(0), settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp_planner_rendezvous_members", exactly(kRanks), settle).status(),
              IsOk());
  EXPECT_THAT(p.AwaitValue(absl::StrCat("sum(flashcp_planner_plan_imbalance_ratio_count{cp_size=\"",
                                        kRanks, "\"})"),
                           exactly(2 * kSteps), settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("count(flashcp_worker_attention_seconds_total{device=\"cpu\","
                           "strategy=\"flashcp\"})", exactly(kRanks), settle).status(), IsOk());
  EXPECT_THAT(p.AwaitValue("count(flashcp_worker_world_size{local_rank=\"3\",rank=\"3\"})",
                           exactly(1), settle).status(), IsOk());
  auto gpu = p.Query("flashcp_worker_world_size{gpu!=\"\"}");  // CPU ranks have no GPU
  ASSERT_THAT(gpu.status(), IsOk());
  EXPECT_TRUE(gpu->empty());
  // Measured and predicted imbalance of the same steps, from the counters.
  // The measured one depends on the machine; both exist and are >= 1.
  const auto at_least_one = [](double v) { return v >= 1.0; };
  auto measured = p.AwaitValue("flashcp:worker_measured_imbalance:ratio{group=\"e2e\"}",
                               at_least_one, settle);
  auto predicted = p.AwaitValue("flashcp:worker_predicted_imbalance:ratio{group=\"e2e\"}",
                                at_least_one, settle);
  EXPECT_THAT(measured.status(), IsOk());
  EXPECT_THAT(predicted.status(), IsOk());
  if (measured.ok() && predicted.ok()) {
    std::printf("measured imbalance %.4f, predicted %.4f (flashcp, N = %d, C = %ld)\n", *measured,
                *predicted, kRanks, static_cast<long>(kContext));
  }
  // Bytes sent per step are the plan analysis's, exactly (raw counters, no rate).
  auto sent = p.Query("sum(flashcp_worker_bytes_sent_total) / sum(flashcp_worker_full_kv_bytes_total)");
  ASSERT_THAT(sent.status(), IsOk());
  ASSERT_EQ(sent->size(), 1u);
  EXPECT_NEAR((*sent)[0], 1 - expected, 1e-9);

  // promtool accepts every binary's scrape.
  EXPECT_THAT(PromtoolCheck((*planner)->metrics_address()), IsOk());
  for (const Worker& w : ws) EXPECT_THAT(PromtoolCheck(w.metrics), IsOk());

  // SIGTERM on one rank: the whole group stops cleanly.
  ASSERT_THAT(ws[2].process->Signal(SIGTERM), IsOk());
  for (Worker& w : ws) {
    auto code = w.Finish(In(absl::Seconds(30)));
    ASSERT_THAT(code.status(), IsOk());
    EXPECT_EQ(*code, 0) << w.output;
  }
  EXPECT_THAT(ws[0].output, HasSubstr("RUN {\"strategy\":\"flashcp\",\"scheme\":\"allgather\","
                                      "\"steps\":12,"));
  // Every rank left: the rendezvous holds no member and no group.
  EXPECT_THAT(p.AwaitValue("flashcp_planner_rendezvous_members", exactly(0), In(absl::Seconds(30)))
                  .status(),
              IsOk());
  EXPECT_THAT(p.AwaitValue("flashcp_planner_rendezvous_groups", exactly(0), In(absl::Seconds(30)))
                  .status(),
              IsOk());
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// The sum of a counter family's samples in a /metrics exposition.
double SumSamples(const std::string& exposition, const std::string& name) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, name + "{")) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
  }
  return sum;
}

// Waits for every rank of `ws` to finish `steps` steps, checks each rank's
// bytes sent (its own counters) equal the plans' prediction for it, then
// stops the group and checks every rank exits 0 without a byte mismatch.
// Returns each rank's bytes sent.
std::vector<double> AwaitRunWithPredictedBytes(std::vector<Worker>& ws, int64_t steps) {
  std::vector<double> sent_by_rank;
  for (const Worker& w : ws) {
    EXPECT_THAT(AwaitStatus(
                    w,
                    [steps](const v1::WorkerStatus& s) {
                      return s.state() == v1::WorkerStatus::IDLE && s.steps_done() == steps;
                    },
                    In(absl::Seconds(120)))
                    .status(),
                IsOk());
    auto scrape = tests::testing::HttpGet(w.metrics, "/metrics", In(absl::Seconds(10)));
    EXPECT_THAT(scrape.status(), IsOk());
    if (!scrape.ok()) continue;
    const double sent = SumSamples(scrape->body, "flashcp_worker_bytes_sent_total");
    sent_by_rank.push_back(sent);
    EXPECT_EQ(sent, SumSamples(scrape->body, "flashcp_worker_predicted_bytes_sent_total"))
        << w.metrics;
  }
  EXPECT_THAT(ws[1].process->Signal(SIGTERM), IsOk());
  for (Worker& w : ws) {
    auto code = w.Finish(In(absl::Seconds(30)));
    EXPECT_THAT(code.status(), IsOk());
    if (code.ok()) {
      EXPECT_EQ(*code, 0) << w.output;
    }
    EXPECT_THAT(w.output, Not(HasSubstr("the plan predicts")));
  }
  return sent_by_rank;
}

// Block diffusion through the real binaries: the flags reach the real
// planner's requests, the group steps the 2C-row plans, and every rank's
// bytes sent are the plans' prediction for it (its own counters).
TEST(E2eWorkersTest, ABlockDiffusionRunMovesThePredictedBytes) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  constexpr int64_t kSteps = 3;
  std::vector<Worker> ws = StartGroup(
      "bdlm", (*planner)->grpc_address(),
      {"--steps", absl::StrCat(kSteps), "--strategy", "csbp", "--scheme", "allgather",
       "--attention_mask", "block_diffusion", "--block_size", "4", "--linger", "--timeout_s",
       "30"});
  ASSERT_EQ(ws.size(), static_cast<size_t>(kRanks));
  EXPECT_THAT(AwaitRunWithPredictedBytes(ws, kSteps), Each(Gt(0)));
  EXPECT_THAT(ws[0].output, HasSubstr("RUN {\"strategy\":\"csbp\",\"scheme\":\"allgather\","
                                      "\"steps\":3,"));
  // The plans cover 2C rows: full_kv would have every rank send its 2C/N
  // rows of K and V (fp32) to the N - 1 others forward, and their gradients
  // back, every step (the causal mask's C rows give half).
  const int64_t full_kv = kSteps * 2 * kRanks * (kRanks - 1) * (2 * kContext / kRanks) * 2 *
                          kHeads * kHeadDim * 4;
  EXPECT_THAT(ws[0].output, HasSubstr(absl::StrCat("\"full_kv_bytes\":", full_kv)));
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// The all-to-all (Ulysses) scheme through the real binaries: the group steps
// flashcp's plans with heads spread over each rank group, and every rank's
// bytes sent are the plans' bytes[all_to_all] for it (its own counters).
// 12 heads: every group size a plan of 4 ranks can have (1 to 4) divides it.
TEST(E2eWorkersTest, AnAllToAllRunMovesThePredictedBytes) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  constexpr int64_t kSteps = 3;
  std::vector<Worker> ws = StartGroup("a2a", (*planner)->grpc_address(),
                                      {"--steps", absl::StrCat(kSteps), "--strategy", "flashcp",
                                       "--scheme", "all_to_all", "--heads", "12", "--linger",
                                       "--timeout_s", "30"});
  ASSERT_EQ(ws.size(), static_cast<size_t>(kRanks));
  // A rank alone in its group sends nothing; the group as a whole does.
  EXPECT_THAT(AwaitRunWithPredictedBytes(ws, kSteps), Contains(Gt(0)));
  EXPECT_THAT(ws[0].output, HasSubstr("RUN {\"strategy\":\"flashcp\",\"scheme\":\"all_to_all\","
                                      "\"steps\":3,"));
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

TEST(E2eWorkersTest, KilledWorkerFailsTheOthersWithinTheTimeout) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  std::vector<Worker> ws = StartGroup("kill", (*planner)->grpc_address(),
                                      {"--steps", "100000", "--timeout_s", "10"});
  ASSERT_EQ(ws.size(), static_cast<size_t>(kRanks));
  ASSERT_THAT(AwaitStatus(ws[0], [](const v1::WorkerStatus& s) { return s.steps_done() >= 2; },
                          In(absl::Seconds(60)))
                  .status(),
              IsOk());
  ASSERT_THAT(ws[2].process->Signal(SIGKILL), IsOk());
  const absl::Time start = absl::Now();
  for (int r : {0, 1, 3}) {
    auto code = ws[r].Finish(In(absl::Seconds(10 + 20)));
    ASSERT_THAT(code.status(), IsOk()) << "rank " << r;
    EXPECT_EQ(*code, 1) << ws[r].output;
    // The reason names the failed collective: a closed connection, or the timeout.
    EXPECT_THAT(ws[r].output,
                ::testing::AnyOf(HasSubstr(absl::StrCat("flashcp-worker rank ", r,
                                                        ": UNAVAILABLE: gloo ")),
                                 HasSubstr(absl::StrCat("flashcp-worker rank ", r,
                                                        ": DEADLINE_EXCEEDED: gloo "))));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(10 + 20));
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

TEST(E2eWorkersTest, PlannerRestartMidRunWorkersReconnectAndFinish) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  const std::string address = (*planner)->grpc_address();
  constexpr int64_t kSteps = 40;
  std::vector<Worker> ws = StartGroup(
      "restart", address,
      {"--steps", absl::StrCat(kSteps), "--prefetch", "2", "--timeout_s", "20"});
  ASSERT_EQ(ws.size(), static_cast<size_t>(kRanks));
  ASSERT_THAT(AwaitStatus(ws[0], [](const v1::WorkerStatus& s) { return s.steps_done() >= 3; },
                          In(absl::Seconds(60)))
                  .status(),
              IsOk());
  ASSERT_THAT((*planner)->process().Signal(SIGKILL), IsOk());
  ASSERT_THAT((*planner)->process().Wait(In(absl::Seconds(30))).status(), IsOk());
  planner->reset();
  // The same address: the workers' channel reconnects to it.
  auto again = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1", "--listen", address});
  ASSERT_THAT(again.status(), IsOk());
  for (Worker& w : ws) {
    auto code = w.Finish(In(absl::Seconds(120)));
    ASSERT_THAT(code.status(), IsOk());
    EXPECT_EQ(*code, 0) << w.output;
  }
  EXPECT_THAT(ws[0].output, HasSubstr("plan stream broke"));
  EXPECT_THAT(ws[0].output, HasSubstr("\"steps\":40,"));
  auto m = (*again)->ScrapeMetrics();
  ASSERT_THAT(m.status(), IsOk());
  auto planned = tests::testing::FindSample(
      *m, "flashcp_planner_plan_comm_saving_ratio_count",
      {{"strategy", "flashcp"}, {"scheme", "allgather"}, {"cp_size", absl::StrCat(kRanks)}});
  ASSERT_THAT(planned.status(), IsOk());
  EXPECT_GE(*planned, 1);  // the restarted planner served the rest of the run
  EXPECT_THAT((*again)->Terminate(), core::testing::IsOk());
}

TEST(E2eWorkersTest, LateAndDuplicateRanksGiveClearErrors) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  std::vector<Worker> ws;
  for (int r : {0, 1, 2, 1}) {  // rank 3 never comes; rank 1 twice
    auto w = StartWorker(r, "late", (*planner)->grpc_address(), {"--timeout_s", "5"});
    ASSERT_THAT(w.status(), IsOk());
    ws.push_back(*std::move(w));
  }
  for (Worker& w : ws) {
    auto code = w.Finish(In(absl::Seconds(30)));
    ASSERT_THAT(code.status(), IsOk());
    EXPECT_EQ(*code, 1) << w.output;
  }
  // The group never formed, so the later rank-1 process replaced the earlier
  // one, whose token is then void (a stray pre-join cannot hold a rank). Each
  // joins again when replaced (AwaitGroup) until one gives up after
  // kMaxRejoins (PERMISSION_DENIED) and the other waits out its timeout.
  int replaced = 0;
  for (int i : {1, 3}) {
    replaced +=
        absl::StrContains(ws[i].output, "PERMISSION_DENIED: rendezvous AwaitMembers: group \"late\"")
            ? 1
            : 0;
  }
  EXPECT_EQ(replaced, 1);
  for (int i : {0, 2}) {
    // Rank 3 is missing for all; ranks that gave up earlier have left, so a
    // later waiter names them too.
    EXPECT_THAT(ws[i].output,
                HasSubstr("DEADLINE_EXCEEDED: rendezvous AwaitMembers: group \"late\": ranks "));
    EXPECT_THAT(ws[i].output, HasSubstr("3 of 4 have not joined"));
  }
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// Issue 12 item 11 and issue 31 item 8, the worker's side: its /metrics had
// one civetweb thread, so one silent TCP connection stopped every scrape for
// 30 s; later 8 threads and a 2 s request timeout, so 40 of them held a scrape
// for about 10 s. A rank waiting for its group serves /metrics, answered at
// once with 40 silent connections open.
TEST(E2eWorkersTest, IdleConnectionsDoNotStopTheWorkersScrape) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  auto w = StartWorker(0, "idle-metrics", (*planner)->grpc_address(),
                       {"--timeout_s", "20"});
  ASSERT_THAT(w.status(), IsOk());
  tests::testing::IdleConnections idle;
  ASSERT_THAT(idle.Open(w->metrics, 40, In(absl::Seconds(30))), IsOk());
  auto scrape = tests::testing::HttpGet(w->metrics, "/metrics", In(absl::Seconds(4)));
  ASSERT_THAT(scrape.status(), IsOk());
  EXPECT_EQ(scrape->status, 200);
  EXPECT_THAT(scrape->body, HasSubstr("flashcp_worker_build_info{"));
  idle.CloseAll();
  auto code = w->Finish(In(absl::Seconds(60)));
  ASSERT_THAT(code.status(), IsOk());
  EXPECT_EQ(*code, 1) << w->output;  // rank 1 never came
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// A stray word (a rank typed without its flag, a command a container runtime
// appended) is refused before anything starts, exactly as flashcp-planner
// refuses it, instead of the rank running on defaults.
// The pod's probes call grpc.health.v1 on the control port (deploy/k8s): it
// answers SERVING while the worker serves and turns NOT_SERVING as it ends.
TEST(E2eWorkersTest, ControlPortServesGrpcHealth) {
  using tests::testing::HealthStatus;
  const absl::Duration timeout = absl::Seconds(60);
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  absl::StatusOr<Worker> w = StartWorker(0, "health", (*planner)->grpc_address(),
                                         {"--world_size", "1", "--steps", "0"});
  ASSERT_THAT(w.status(), IsOk());
  auto channel = grpc::CreateChannel(w->control, grpc::InsecureChannelCredentials());
  for (const std::string service : {"", "flashcp.v1.WorkerControl"}) {
    absl::StatusOr<HealthStatus> h = tests::testing::CheckHealth(channel, service, In(timeout));
    ASSERT_THAT(h.status(), IsOk()) << service;
    EXPECT_EQ(*h, HealthStatus::kServing) << service;
  }
  EXPECT_EQ(tests::testing::CheckHealth(channel, "flashcp.v1.Planner", In(timeout)).status().code(),
            absl::StatusCode::kNotFound);
  auto watch = tests::testing::HealthWatch::Start(channel, "", In(timeout));
  ASSERT_THAT(watch.status(), IsOk());
  absl::StatusOr<HealthStatus> first = (*watch)->Next(In(timeout));
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(*first, HealthStatus::kServing);
  ASSERT_THAT(w->process->Signal(SIGTERM), IsOk());
  absl::StatusOr<HealthStatus> last = (*watch)->Next(In(timeout));
  ASSERT_THAT(last.status(), IsOk());
  EXPECT_EQ(*last, HealthStatus::kNotServing);
  absl::StatusOr<int> code = w->Finish(In(timeout));
  ASSERT_THAT(code.status(), IsOk());
  EXPECT_EQ(*code, 0) << w->output;
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// Open fds of process `pid` (its /proc/PID/fd entries); -1 if unreadable.
int OpenFds(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

// Issue 31 item 7: the worker's control port, which carries the pod's
// liveness probe, had no connection bounds, and after one accept4() EMFILE
// gRPC 1.51's listener never accepted again (a probe would restart the pod).
// It now serves through the planner's ResilientServer: the stall is seen and
// the server rebuilt on its port, and new clients get health again within
// seconds, while the flood's sockets are still open on this side.
TEST(E2eWorkersTest, TheControlPortComesBackAfterAnFdFlood) {
  using tests::testing::HealthStatus;
  const absl::Duration timeout = absl::Seconds(60);
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  absl::StatusOr<Worker> w = StartWorker(0, "flooded", (*planner)->grpc_address(),
                                         {"--world_size", "1", "--steps", "0"});
  ASSERT_THAT(w.status(), IsOk());
  const auto fresh = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    return grpc::CreateCustomChannel(w->control, grpc::InsecureChannelCredentials(), args);
  };
  ASSERT_EQ(tests::testing::CheckHealth(fresh(), "", In(timeout)).value_or(HealthStatus::kUnknown),
            HealthStatus::kServing);
  // The flood comes once the group has formed (Gloo's connect needs fds too).
  const auto state = [&] {
    v1::WorkerStatus status;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(In(timeout)));
    const grpc::Status s = v1::WorkerControl::NewStub(fresh())->GetStatus(
        &context, v1::GetStatusRequest(), &status);
    return s.ok() ? status.state() : v1::WorkerStatus::STATE_UNSPECIFIED;
  };
  const absl::Time formed_by = In(timeout);
  while (state() != v1::WorkerStatus::IDLE && absl::Now() < formed_by) {
    absl::SleepFor(absl::Milliseconds(50));  // a bounded poll: the group forms on its own
  }
  ASSERT_EQ(state(), v1::WorkerStatus::IDLE);
  const pid_t pid = w->process->pid();
  const int held = OpenFds(pid);
  ASSERT_GT(held, 0);
  const rlimit low{static_cast<rlim_t>(held + 16), static_cast<rlim_t>(held + 16)};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &low, nullptr), 0);
  tests::testing::IdleConnections idle;
  ASSERT_THAT(idle.Open(w->control, 32, In(timeout)), IsOk());
  // Issue 31 item 7: the pod's liveness probe is GET /healthz on the metrics
  // port, which answers with the process out of fds (its reserve fd).
  const absl::Time full_by = In(timeout);
  while (OpenFds(pid) < held + 16 && absl::Now() < full_by) {
    absl::SleepFor(absl::Milliseconds(20));  // a bounded poll: gRPC accepts on its own
  }
  auto live = tests::testing::HttpGet(w->metrics, "/healthz", In(absl::Seconds(10)));
  ASSERT_THAT(live.status(), IsOk());
  EXPECT_EQ(live->status, 200);
  EXPECT_EQ(live->body, "ok\n");
  // Each probe has 2 s, all of them 30 s (detection takes 5 checks 1 s apart).
  const absl::Time served_by = In(absl::Seconds(30));
  absl::StatusOr<HealthStatus> h = tests::testing::CheckHealth(fresh(), "", In(absl::Seconds(2)));
  while (!(h.ok() && *h == HealthStatus::kServing) && absl::Now() < served_by) {
    h = tests::testing::CheckHealth(fresh(), "", In(absl::Seconds(2)));
  }
  EXPECT_EQ(h.value_or(HealthStatus::kUnknown), HealthStatus::kServing) << h.status();
  v1::GetStatusRequest request;
  v1::WorkerStatus status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(In(timeout)));
  EXPECT_TRUE(v1::WorkerControl::NewStub(fresh())->GetStatus(&context, request, &status).ok());
  idle.CloseAll();
  ASSERT_THAT(w->process->Signal(SIGTERM), IsOk());
  absl::StatusOr<int> code = w->Finish(In(timeout));
  ASSERT_THAT(code.status(), IsOk());
  EXPECT_EQ(*code, 0) << w->output;
  EXPECT_THAT(w->output, HasSubstr("health NOT_SERVING; rebuilding the server on the same port"))
      << w->output;
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// Issue 31 item 8: a WorkerControl request that does not parse got an error
// with an empty message. Each method now answers INVALID_ARGUMENT naming the
// message type.
TEST(E2eWorkersTest, AMalformedControlRequestIsInvalidArgumentNamingItsType) {
  const absl::Duration timeout = absl::Seconds(60);
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  absl::StatusOr<Worker> w = StartWorker(0, "malformed", (*planner)->grpc_address(),
                                         {"--world_size", "1", "--steps", "0"});
  ASSERT_THAT(w.status(), IsOk());
  auto channel = grpc::CreateChannel(w->control, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  const std::string garbage("\xff\x01", 2);  // field 31, wire type 7: no such thing
  for (const char* method : {"GetStatus", "StartRun", "StopRun"}) {
    grpc::Slice slice(garbage);
    const grpc::Status s = tests::testing::RawUnaryCall(
        stub, absl::StrCat("/flashcp.v1.WorkerControl/", method), grpc::ByteBuffer(&slice, 1),
        In(timeout));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(s.error_message(), absl::StrCat("could not parse flashcp.v1.", method, "Request"))
        << method;
  }
  v1::WorkerStatus status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(In(timeout)));
  EXPECT_TRUE(
      v1::WorkerControl::NewStub(channel)->GetStatus(&context, v1::GetStatusRequest(), &status).ok());
  ASSERT_THAT(w->process->Signal(SIGTERM), IsOk());
  absl::StatusOr<int> code = w->Finish(In(timeout));
  ASSERT_THAT(code.status(), IsOk());
  EXPECT_EQ(*code, 0) << w->output;
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// Issue 31 item 7: StartRun(strategy "ilp") against a planner without
// --allow_ilp ended the whole worker group (the plan feed's UNIMPLEMENTED was
// fatal). The run ends with the error; the group goes on and runs the next.
TEST(E2eWorkersTest, ARunThePlannerRefusesEndsTheRunNotTheGroup) {
  const absl::Duration timeout = absl::Seconds(60);
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  absl::StatusOr<Worker> w = StartWorker(0, "ilp", (*planner)->grpc_address(),
                                         {"--world_size", "1", "--steps", "0"});
  ASSERT_THAT(w.status(), IsOk());
  auto control = v1::WorkerControl::NewStub(
      grpc::CreateChannel(w->control, grpc::InsecureChannelCredentials()));
  const auto start = [&](const std::string& strategy, int64_t steps) {
    v1::StartRunRequest request;
    request.set_steps(steps);
    request.set_strategy(strategy);
    v1::StartRunResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(In(timeout)));
    return control->StartRun(&context, request, &response);
  };
  const auto status = [&] {
    v1::WorkerStatus s;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(In(timeout)));
    (void)control->GetStatus(&context, v1::GetStatusRequest(), &s);
    return s;
  };
  // Polls (bounded) until the worker is idle with `error` set or not.
  const auto idle_with_error = [&](bool with_error) {
    const absl::Time limit = In(timeout);
    v1::WorkerStatus s = status();
    while (!(s.state() == v1::WorkerStatus::IDLE && s.error().empty() != with_error) &&
           absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(50));
      s = status();
    }
    return s;
  };
  ASSERT_TRUE(idle_with_error(false).state() == v1::WorkerStatus::IDLE);
  ASSERT_TRUE(start("ilp", 2).ok());
  const v1::WorkerStatus failed = idle_with_error(true);
  EXPECT_EQ(failed.state(), v1::WorkerStatus::IDLE);
  EXPECT_THAT(failed.error(), HasSubstr("UNIMPLEMENTED: run failed after 0 of 2 steps"));
  // The group is still there: the next run goes through.
  ASSERT_TRUE(start("ring", 2).ok());
  const absl::Time limit = In(timeout);
  v1::WorkerStatus s = status();
  while (s.steps_done() < 2 && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(50));
    s = status();
  }
  EXPECT_EQ(s.steps_done(), 2);
  EXPECT_EQ(s.error(), "");
  ASSERT_THAT(w->process->Signal(SIGTERM), IsOk());
  absl::StatusOr<int> code = w->Finish(In(timeout));
  ASSERT_THAT(code.status(), IsOk());
  EXPECT_EQ(*code, 0) << w->output;
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

// The WORKER and RUN lines are the run's report: when stdout cannot take
// them (/dev/full) the worker says so and exits 1; it exited 0, the report lost.
TEST(E2eWorkersTest, AnUnwritableStdoutFailsTheRunSayingSo) {
  auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  // sh runs the worker ($0, with "$@"), stderr to the pipe, stdout on /dev/full.
  auto r = tests::testing::RunCommand(
      {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1 >/dev/full", FLASHCP_WORKER_BIN, "--planner",
       (*planner)->grpc_address(), "--group", "full", "--steps", "1", "--context", "1024",
       "--heads", "1", "--head_dim", "8"},
      "", In(absl::Seconds(60)));
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->exit_code, 1) << r->output;
  EXPECT_THAT(r->output, HasSubstr("flashcp-worker rank 0: DATA_LOSS: error writing the output "
                                   "(the WORKER and RUN lines) to stdout"));
  EXPECT_THAT((*planner)->Terminate(), core::testing::IsOk());
}

TEST(E2eWorkersTest, StrayPositionalArgumentIsRefused) {
  struct Case {
    std::vector<std::string> args;
    std::string word;
  };
  const std::vector<Case> cases = {
      {{"1"}, "1"},
      {{"--rank", "0", "--planner", "127.0.0.1:1", "g0"}, "g0"},
      {{"--steps=3", "--", "--rank=1"}, "--rank=1"},  // after "--" every word is positional
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {FLASHCP_WORKER_BIN};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = tests::testing::RunCommand(argv, "", In(absl::Seconds(30)));
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_EQ(r->exit_code, 2) << c.word;
    EXPECT_EQ(r->output, absl::StrCat("flashcp-worker: unexpected argument \"", c.word,
                                      "\"; every option is a --flag\n"));
  }
}

TEST(E2eWorkersTest, LocalRankOutOfRangeIsRefused) {
  for (const int local_rank : {-2, 4096}) {
    auto r = tests::testing::RunCommand({FLASHCP_WORKER_BIN, "--local_rank",
                                         absl::StrCat(local_rank), "--planner", "127.0.0.1:1"},
                                        "", In(absl::Seconds(30)));
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_EQ(r->exit_code, 2) << local_rank;
    EXPECT_EQ(r->output, absl::StrCat("flashcp-worker: --local_rank: must be in [-1, 4095], got ",
                                      local_rank,
                                      "\nRun 'flashcp-worker --help' for the flags.\n"));
  }
}

// A cuda device this machine cannot use fails before the worker joins
// anything: without CUDA in the build, or (a build with CUDA) no usable
// device, or no device 4095.
TEST(E2eWorkersTest, CudaDeviceIsRefusedClearly) {
  struct Case {
    std::string device;
    int exit_code;                  // 2: a usage error; 1: a run that cannot start
    std::vector<std::string> want;  // any one of these
  };
  const std::vector<Case> cases = {
#ifdef FLASHCP_E2E_WORKER_CUDA
      {"cuda:4095", 1,
       {"FAILED_PRECONDITION: --device cuda:4095: cudaGetDeviceCount",
        "FAILED_PRECONDITION: --device cuda:4095: this machine has "}},
#else
      {"cuda:0", 1,
       {"FAILED_PRECONDITION: --device cuda:0: this flashcp-worker was built without CUDA; use "
        "--device cpu"}},
#endif
      {"cuda:x", 2, {"flashcp-worker: --device: want cpu or cuda:K"}},
      {"cuda:-1", 2, {"flashcp-worker: --device: want cpu or cuda:K"}},
  };
  for (const Case& c : cases) {
    auto r = tests::testing::RunCommand(
        {FLASHCP_WORKER_BIN, "--device", c.device, "--planner", "127.0.0.1:1"}, "",
        In(absl::Seconds(30)));
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_EQ(r->exit_code, c.exit_code) << c.device;
    bool found = false;
    for (const std::string& w : c.want) found |= absl::StrContains(r->output, w);
    EXPECT_TRUE(found) << c.device << ": " << r->output;
  }
}

}  // namespace
}  // namespace flashcp
