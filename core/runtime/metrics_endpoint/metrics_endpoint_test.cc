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
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared

TEST(EndpointOptionsTest, ValidatesEachBoundNamingItsFlag) {
  EXPECT_THAT(ValidateEndpointOptions({}), IsOk());
  EXPECT_THAT(ValidateEndpointOptions({.max_connections = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_max_connections: must be in [1, 65536], got 0"));
  EXPECT_THAT(ValidateEndpointOptions({.max_connections = 65537}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_max_connections: must be in [1, 65536], got 65537"));
  EXPECT_THAT(ValidateEndpointOptions({.request_timeout = absl::ZeroDuration()}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_request_timeout: must be in [1ms, 10m], got 0"));
  EXPECT_THAT(MetricsServer::Start("127.0.0.1:0", {.max_connections = 0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--metrics_max_connections: must be in [1, 65536], got 0"));
}

// A served registry with one counter, and its address.
struct Served {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<MetricsServer> server;
  std::string address;
};

std::unique_ptr<Served> Serve(const EndpointOptions& options) {
  auto s = std::make_unique<Served>();
  prometheus::BuildCounter().Name("served_total").Help("a counter").Register(*s->registry)
      .Add({}).Increment(3);
  absl::StatusOr<std::unique_ptr<MetricsServer>> e = MetricsServer::Start("127.0.0.1:0", options);
  EXPECT_THAT(e, IsOk());
  if (!e.ok()) return nullptr;
  s->server = *std::move(e);
  s->server->RegisterCollectable(s->registry);
  s->address = absl::StrCat("127.0.0.1:", s->server->port());
  return s;
}

void ExpectScrape(const std::string& address, absl::Duration timeout) {
  absl::StatusOr<HttpResponse> r = HttpGet(address, "/metrics", absl::Now() + timeout);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("# TYPE served_total counter\nserved_total 3\n"));
}

// Issue 12 item 11, issue 31 item 8: civetweb held a thread per connection
// until its request came (or the request timeout passed), so silent
// connections beyond its threads delayed a scrape by a timeout per round of
// threads (40 of them: ~10 s at 8 threads, 2 s). Polled here, they delay
// nothing: with a 10 min request timeout none is closed, and the scrape is
// answered (the 20 s only bounds the test on a loaded machine).
TEST(MetricsEndpointTest, SilentConnectionsDoNotDelayAScrape) {
  auto served = Serve({.request_timeout = absl::Minutes(10)});
  ASSERT_NE(served, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(served->address, 40, absl::Now() + kTimeout), IsOk());
  ExpectScrape(served->address, absl::Seconds(20));
  EXPECT_EQ(idle.AwaitClosedByPeer(absl::Now() + absl::Seconds(1)), 0);
}

// More silent connections than max_connections: each new one closes the
// oldest, so a flood cannot keep a scrape out.
TEST(MetricsEndpointTest, AConnectionBeyondTheBoundClosesTheOldest) {
  auto served = Serve({.max_connections = 4, .request_timeout = absl::Minutes(10)});
  ASSERT_NE(served, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(served->address, 10, absl::Now() + kTimeout), IsOk());
  ExpectScrape(served->address, absl::Seconds(20));
  // The scrape's connection pushed out one more: 7 of the 10 are closed.
  EXPECT_EQ(idle.AwaitClosedByPeer(absl::Now() + absl::Seconds(1)), 7);
}

TEST(MetricsEndpointTest, SilentConnectionsAreClosedAfterTheRequestTimeout) {
  auto served = Serve({.request_timeout = absl::Milliseconds(200)});
  ASSERT_NE(served, nullptr);
  IdleConnections idle;
  ASSERT_THAT(idle.Open(served->address, 6, absl::Now() + kTimeout), IsOk());
  EXPECT_EQ(idle.AwaitClosedByPeer(absl::Now() + absl::Seconds(20)), 6);
  ExpectScrape(served->address, absl::Seconds(20));
}

TEST(MetricsEndpointTest, HealthzAnswersTheLivenessCheck) {
  auto served = Serve({});
  ASSERT_NE(served, nullptr);
  absl::StatusOr<HttpResponse> r = HttpGet(served->address, "/healthz", absl::Now() + kTimeout);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok\n");
  served->server->SetLivenessCheck([] { return absl::UnavailableError("no listener for 61s"); });
  r = HttpGet(served->address, "/healthz", absl::Now() + kTimeout);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, "UNAVAILABLE: no listener for 61s\n");
  r = HttpGet(served->address, "/other", absl::Now() + kTimeout);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->status, 404);
}

// A collectable that is gone is no longer collected (and the scrape works).
TEST(MetricsEndpointTest, AnExpiredCollectableIsDropped) {
  auto served = Serve({});
  ASSERT_NE(served, nullptr);
  served->registry.reset();
  absl::StatusOr<HttpResponse> r = HttpGet(served->address, "/metrics", absl::Now() + kTimeout);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "");
}

TEST(MetricsEndpointTest, AnAddressInUseIsUnavailableNamingTheFlag) {
  auto served = Serve({});
  ASSERT_NE(served, nullptr);
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(served->address, {});
  EXPECT_THAT(second.status(), StatusIs(absl::StatusCode::kUnavailable,
                                        HasSubstr(absl::StrCat("--metrics: cannot listen on ",
                                                               served->address))));
}

}  // namespace
}  // namespace flashcp::core::runtime::metrics_endpoint
