// The CUDA rank backend: device checks anywhere the CUDA code builds, and (on
// a machine with a GPU) a whole one-rank flashcp-worker group on cuda:0 (NCCL
// refuses two ranks on one GPU): a real planner on a loopback port 0, the
// group formed through its Rendezvous service, the NCCL unique id through the
// group's store, three planned steps of Forward + Backward on the device.
#include "worker/cuda/cuda_rank_backend.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/grpc_planner_client.h"
#include "core/analysis.h"
#include "core/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/observer.h"
#include "planner_service/server.h"
#include "prometheus/registry.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/gpu_test_util.h"
#include "worker/daemon.h"
#include "worker/metrics.h"
#include "worker/gloo_communicator.h"

namespace flashcp::worker::cuda {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using ::testing::HasSubstr;

// Gloo (the group's control messages) needs SIGPIPE ignored, as in main().
class IgnoreSigpipeEnvironment final : public ::testing::Environment {
 public:
  void SetUp() override { IgnoreSigpipe(); }
};
[[maybe_unused]] ::testing::Environment* const kIgnoreSigpipe =
    ::testing::AddGlobalTestEnvironment(new IgnoreSigpipeEnvironment);

BackendConfig Config(const core::WaitClock* clock) {
  BackendConfig c;
  c.heads = 4;
  c.head_dim = 64;
  c.clock = clock;
  return c;
}

// Runs without a GPU too: the exact refusal where no device is usable, and
// the device count where one is.
TEST(CudaRankBackendTest, DeviceChecks) {
  const core::RealClock clock;
  if (!CudaDeviceAvailable().ok()) {
    EXPECT_THAT(MakeCudaRankBackend(0, Config(&clock)).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("--device cuda:0: cudaGetDeviceCount")));
    return;
  }
  EXPECT_THAT(MakeCudaRankBackend(4095, Config(&clock)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--device cuda:4095: this machine has")));
  BackendConfig odd = Config(&clock);
  odd.head_dim = 12;  // not a multiple of 8
  EXPECT_THAT(MakeCudaRankBackend(0, odd).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--heads, --head_dim")));
}

// Sum and count of a histogram series; {-1, -1} if absent.
std::pair<double, double> Series(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name || f.metric.empty()) continue;
    if (f.type == prometheus::MetricType::Histogram) {
      return {f.metric[0].histogram.sample_sum,
              static_cast<double>(f.metric[0].histogram.sample_count)};
    }
    return {f.metric[0].counter.value, 0};
  }
  return {-1, -1};
}

TEST(CudaRankBackendTest, OneRankGroupOnCuda0RunsPlannedSteps) {
  FLASHCP_SKIP_WITHOUT_GPU();
  const core::RealClock clock;
  planner_service::NullObserver observer;
  planner_service::ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  server_options.metrics = "";
  absl::StatusOr<std::unique_ptr<planner_service::PlannerServer>> planner =
      planner_service::PlannerServer::Start(server_options, &observer, &clock);
  ASSERT_THAT(planner.status(), IsOk());
  auto channel =
      grpc::CreateChannel((*planner)->address(), grpc::InsecureChannelCredentials());

  for (const core::CommScheme scheme : core::kKvCommSchemes) {
    SCOPED_TRACE(core::CommSchemeName(scheme));
    DaemonOptions o;
    o.world_size = 1;
    o.group = absl::StrCat("cuda-", core::CommSchemeName(scheme));
    o.device = "cuda:0";
    o.context = 8192;
    o.heads = 4;
    o.head_dim = 64;
    o.steps = 3;
    o.scheme = scheme;
    o.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<RankBackend>> backend = MakeCudaRankBackend(0, Config(&clock));
    ASSERT_THAT(backend.status(), IsOk());
    prometheus::Registry registry;
    PrometheusWorkerMetrics metrics(registry, "test");
    WorkerDaemon daemon(o, v1::Rendezvous::NewStub(channel),
                        std::make_shared<client::GrpcPlannerClient>(channel), *std::move(backend),
                        &metrics, &clock);
    ASSERT_THAT(daemon.Run(), IsOk());
    EXPECT_EQ(daemon.Status().steps_done(), 3);
    const auto forward = Series(registry, "flashcp_worker_attention_forward_duration_seconds");
    EXPECT_EQ(forward.second, 3);
    EXPECT_GT(forward.first, 0);  // CUDA events of real attention launches
    EXPECT_GT(Series(registry, "flashcp_worker_attention_backward_duration_seconds").first, 0);
    // One rank exchanges nothing, and the plans (2-byte elements) say so.
    EXPECT_EQ(Series(registry, "flashcp_worker_bytes_sent_total").first, 0);
  }
}

}  // namespace
}  // namespace flashcp::worker::cuda
