#include "core/runtime/metrics_endpoint/metrics_endpoint.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/testing/http.h"
#include "tests/testing/idle_connections.h"

namespace flashcp::core::runtime::metrics_endpoint {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::flashcp::tests::testing::HttpGet;
using ::flashcp::tests::testing::HttpResponse;
using ::flashcp::tests::testing::IdleConnections;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared

TEST(EndpointOptionsTest, ValidatesEachBoundNamingItsFlag) {
  EXPECT_THAT(ValidateEndpointOptions({}), IsOk());
  EXPECT_THAT(ValidateEndpointOptions({.threads = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_threads: must be in [1, 256], got 0"));
  EXPECT_THAT(ValidateEndpointOptions({.threads = 257}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_threads: must be in [1, 256], got 257"));
  EXPECT_THAT(ValidateEndpointOptions({.request_timeout = absl::ZeroDuration()}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_request_timeout: must be in [1ms, 10m], got 0"));
  EXPECT_THAT(StartExposer("127.0.0.1:0", {.threads = 0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_threads: must be in [1, 256], got 0"));
}

TEST(EndpointOptionsTest, CivetwebOptionsCarryTheBounds) {
  EXPECT_THAT(CivetwebOptions("127.0.0.1:0", {.threads = 3, .request_timeout = absl::Seconds(4)}),
              ElementsAre("listening_ports", "127.0.0.1:0", "num_threads", "3",
                          "request_timeout_ms", "4000"));
}

// A served registry with one counter, and its address.
struct Served {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string address;
};

std::unique_ptr<Served> Serve(const EndpointOptions& options) {
  auto s = std::make_unique<Served>();
  prometheus::BuildCounter().Name("served_total").Help("a counter").Register(*s->registry)
      .Add({}).Increment(3);
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> e = StartExposer("127.0.0.1:0", options);
  EXPECT_THAT(e, IsOk());
  if (!e.ok()) return nullptr;
  s->exposer = *std::move(e);
  s->exposer->RegisterCollectable(s->registry);
  s->address = absl::StrCat("127.0.0.1:", s->exposer->GetListeningPorts().front());
  return s;
}

void ExpectScrape(const std::string& address, absl::Duration timeout) {
  absl::StatusOr<HttpResponse> r = HttpGet(address, "/metrics", absl::Now() + timeout);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("\nserved_total 3\n"));
}

// Issue 12 item 11: prometheus-cpp's default two threads let two silent TCP
// connections stop every scrape for civetweb's 30 s request timeout. With the
// defaults here, threads - 1 of them leave a thread to serve the scrape at once
// (the 10 min request timeout shows that no timeout is what frees it).
TEST(MetricsEndpointTest, IdleConnectionsBelowTheThreadsDoNotStopAScrape) {
  const EndpointOptions options{.request_timeout = absl::Minutes(10)};
  auto served = Serve(options);
  ASSERT_NE(served, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(served->address, options.threads - 1, absl::Now() + kTimeout), IsOk());
  ExpectScrape(served->address, absl::Seconds(20));
}

// More silent connections than threads: each is closed after the request
// timeout, so the scrape queued behind them is answered.
TEST(MetricsEndpointTest, SilentConnectionsAreClosedAfterTheRequestTimeout) {
  auto served = Serve({.threads = 2, .request_timeout = absl::Milliseconds(200)});
  ASSERT_NE(served, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(served->address, 6, absl::Now() + kTimeout), IsOk());
  ExpectScrape(served->address, absl::Seconds(20));
  EXPECT_EQ(idle.AwaitClosedByPeer(absl::Now() + absl::Seconds(20)), 6);
}

TEST(MetricsEndpointTest, AnAddressInUseIsUnavailableNamingTheFlag) {
  auto served = Serve({});
  ASSERT_NE(served, nullptr);
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> second = StartExposer(served->address, {});
  EXPECT_THAT(second.status(), StatusIs(absl::StatusCode::kUnavailable,
                                        HasSubstr(absl::StrCat("--metrics: cannot listen on ",
                                                               served->address))));
}

}  // namespace
}  // namespace flashcp::core::runtime::metrics_endpoint
