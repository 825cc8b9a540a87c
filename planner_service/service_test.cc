// In-process tests of the service adapter with an injected clock and a
// recording observer: exact planning_seconds and latencies, no sleeps.
#include "planner_service/service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/plan_batch.h"
#include "planner_service/server.h"

namespace flashcp::planner_service {
namespace {

using ::flashcp::core::testing::IsOk;
using ::testing::ElementsAre;

// Every Now() returns the previous value plus 1 ms: each reading is a tick, so
// durations count the clock readings between two points exactly.
class TickingClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    now_ += absl::Milliseconds(1);
    return now_;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::UnixEpoch();
};

struct Event {
  std::string method;
  absl::StatusCode code;
  double seconds;
};

class RecordingObserver final : public ServiceObserver {
 public:
  void OnRequestDone(absl::string_view method, absl::StatusCode code, double seconds) override {
    absl::MutexLock lock(&mu_);
    requests.push_back({std::string(method), code, seconds});
  }
  void OnInflightChange(int delta) override {
    absl::MutexLock lock(&mu_);
    inflight += delta;
  }
  void OnQueueDepth(int64_t depth) override {
    absl::MutexLock lock(&mu_);
    depths.push_back(depth);
  }
  void OnPlanned(core::Strategy strategy, double seconds, const core::PlanMetrics& m) override {
    absl::MutexLock lock(&mu_);
    planned.push_back({std::string(core::StrategyName(strategy)), absl::StatusCode::kOk, seconds});
    imbalances.push_back(m.imbalance);
  }

  absl::Mutex mu_;
  std::vector<Event> requests;
  std::vector<Event> planned;
  std::vector<double> imbalances;
  std::vector<int64_t> depths;
  int inflight = 0;
};

TEST(PlanBatchTest, PlanningSecondsComeFromTheInjectedClock) {
  TickingClock clock;
  RecordingObserver observer;
  proto::PlanInput in;
  in.batch_id = 5;
  in.batch = core::Batch{{5, 3}, 2};
  in.strategy = core::Strategy::kRing;
  absl::StatusOr<v1::PlanResponse> r = PlanBatch(in, clock, observer);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->batch_id(), 5u);
  EXPECT_EQ(r->metrics().planning_seconds(), 0.001);  // two readings, one tick apart
  ASSERT_EQ(observer.planned.size(), 1u);
  EXPECT_EQ(observer.planned[0].method, "ring");
  EXPECT_EQ(observer.planned[0].seconds, 0.001);
  EXPECT_DOUBLE_EQ(observer.imbalances[0], 11.0 / 10.5);
}

TEST(PlanBatchTest, CoreErrorsPassThroughUnchanged) {
  TickingClock clock;
  RecordingObserver observer;
  proto::PlanInput in;
  in.batch = core::Batch{{5, 3}, 2};
  in.strategy = core::Strategy::kRing;
  in.options.target_imbalance = 0.5;  // RequestFromProto would refuse; MakePlan does too
  EXPECT_EQ(PlanBatch(in, clock, observer).status(),
            absl::InvalidArgumentError("target_imbalance: must be a finite ratio >= 1, got 0.5"));
  EXPECT_TRUE(observer.planned.empty());
}

TEST(PlannerServiceTest, UnaryLatencyAndInflightAreReported) {
  TickingClock clock;
  RecordingObserver observer;
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics = "";
  absl::StatusOr<std::unique_ptr<PlannerServer>> server =
      PlannerServer::Start(options, &observer, &clock);
  ASSERT_THAT(server, IsOk());
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  v1::PlanRequest request;
  request.set_batch_id(9);
  request.add_doc_lens(5);
  request.add_doc_lens(3);
  request.set_cp_size(2);
  request.set_strategy("ring");
  v1::PlanResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Plan(&context, request, &response).ok());
  }
  EXPECT_EQ(response.metrics().planning_seconds(), 0.001);
  request.set_cp_size(0);
  {
    grpc::ClientContext context;
    const grpc::Status s = stub->Plan(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "cp_size: must be at least 1, got 0");
  }
  (*server)->Shutdown();
  absl::MutexLock lock(&observer.mu_);
  // A good call reads the clock 4 times (received, plan start and end,
  // finish): 3 ms. A refused one twice: 1 ms.
  ASSERT_EQ(observer.requests.size(), 2u);
  EXPECT_EQ(observer.requests[0].method, "Plan");
  EXPECT_EQ(observer.requests[0].code, absl::StatusCode::kOk);
  EXPECT_DOUBLE_EQ(observer.requests[0].seconds, 0.003);
  EXPECT_EQ(observer.requests[1].code, absl::StatusCode::kInvalidArgument);
  EXPECT_DOUBLE_EQ(observer.requests[1].seconds, 0.001);
  EXPECT_EQ(observer.inflight, 0);
  EXPECT_THAT(observer.depths, ElementsAre(1, 0));
}

TEST(ServerOptionsTest, BadOptionsNameTheFlag) {
  ServerOptions o;
  o.threads = 0;
  EXPECT_EQ(ValidateOptions(o), absl::InvalidArgumentError("--threads: must be in [1, 1024], got 0"));
  o = ServerOptions{};
  o.listen = "nohost";
  EXPECT_EQ(ValidateOptions(o),
            absl::InvalidArgumentError("--listen: want HOST:PORT, got \"nohost\""));
  o = ServerOptions{};
  o.metrics = "127.0.0.1:70000";
  EXPECT_EQ(ValidateOptions(o), absl::InvalidArgumentError(
                                    "--metrics: the port must be 0..65535, got \"127.0.0.1:70000\""));
  o = ServerOptions{};
  o.tls_cert = "cert.pem";
  EXPECT_EQ(ValidateOptions(o), absl::InvalidArgumentError("--tls_cert, --tls_key: set both or neither"));
  o = ServerOptions{};
  o.rendezvous.max_total_bytes = 0;
  EXPECT_EQ(ValidateOptions(o),
            absl::InvalidArgumentError("--rendezvous_max_bytes: must be at least 1, got 0"));
  o = ServerOptions{};  // the rest of the --rendezvous_* flags: rendezvous_service_test.cc
  o.rendezvous.idle_timeout = absl::Milliseconds(999);
  EXPECT_EQ(ValidateOptions(o), absl::InvalidArgumentError(
                                    "--rendezvous_idle_timeout: must be at least 1s, got 999ms"));
  EXPECT_EQ(ListeningLine("127.0.0.1:1", "127.0.0.1:2"),
            "LISTENING grpc=127.0.0.1:1 metrics=127.0.0.1:2");
  EXPECT_EQ(ListeningLine("[::]:1", ""), "LISTENING grpc=[::]:1 metrics=-");
}

TEST(ServerOptionsTest, MissingTlsFilesAreNotFound) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.tls_cert = "/nonexistent/cert.pem";
  o.tls_key = "/nonexistent/key.pem";
  NullObserver observer;
  RealClock clock;
  EXPECT_EQ(PlannerServer::Start(o, &observer, &clock).status(),
            absl::NotFoundError("--tls_cert: cannot open \"/nonexistent/cert.pem\""));
}

}  // namespace
}  // namespace flashcp::planner_service
