#include "worker/run_worker.h"

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "worker/testing/gloo_ranks.h"

namespace flashcp::worker {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ValidateWorkerOptionsTest, DaemonOptionsAndLocalRank) {
  WorkerOptions o;
  EXPECT_THAT(ValidateWorkerOptions(o), IsOk());
  o.local_rank = 4095;
  EXPECT_THAT(ValidateWorkerOptions(o), IsOk());
  o.local_rank = 4096;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--local_rank: must be in [-1, 4095], got 4096"));
  o.local_rank = -2;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--local_rank: must be in [-1, 4095], got -2"));
  o.local_rank = -1;
  o.daemon.rank = 1;  // of a one-rank group
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--rank")));
}

// A malformed listen address is refused naming the flag before anything
// binds; --control 127.0.0.1:99999 was accepted (gRPC bound another port).
TEST(ValidateWorkerOptionsTest, ListenAddressesAreHostAndPort) {
  for (const auto& [control, metrics, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"127.0.0.1:99999", "127.0.0.1:0",
            "--control: the port must be 0..65535, got \"127.0.0.1:99999\""},
           {"127.0.0.1:-1", "127.0.0.1:0",
            "--control: the port must be 0..65535, got \"127.0.0.1:-1\""},
           {"127.0.0.1", "127.0.0.1:0", "--control: want HOST:PORT, got \"127.0.0.1\""},
           {"127.0.0.1:0", "bogus", "--metrics: want HOST:PORT, got \"bogus\""},
           {"127.0.0.1:0", ":9464", "--metrics: want HOST:PORT, got \":9464\""},
       }) {
    WorkerOptions o;
    o.control = control;
    o.metrics = metrics;
    EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, message));
  }
  WorkerOptions o;
  o.control = "[::1]:0";
  o.metrics = "0.0.0.0:65535";
  EXPECT_THAT(ValidateWorkerOptions(o), IsOk());
}

// Setup failures come back as the Status naming the flag, before the daemon
// runs (no planner is needed to see them).
TEST(RunWorkerTest, AnAddressItCannotListenOnIsUnavailableNamingTheFlag) {
  WorkerOptions o;
  o.control = "192.0.2.1:0";  // TEST-NET-1: not an address of this machine
  EXPECT_THAT(RunWorker(o, std::make_shared<prometheus::Registry>()),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("--control: cannot listen on 192.0.2.1:0")));
  o.control = "127.0.0.1:0";
  o.metrics = "192.0.2.1:0";
  EXPECT_THAT(RunWorker(o, std::make_shared<prometheus::Registry>()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("--metrics")));
  o.metrics = "127.0.0.1:0";
  o.daemon.device = "cuda:0";  // o.cuda is empty: built without CUDA
  EXPECT_THAT(RunWorker(o, std::make_shared<prometheus::Registry>()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("built without CUDA")));
}

}  // namespace
}  // namespace flashcp::worker
