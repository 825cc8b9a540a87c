// In-process tests of the service adapter with an injected clock and a
// recording observer: exact planning_seconds and latencies, no sleeps.
#include "planner_service/service.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/step_choice.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "core/testing/ticking_clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "planner_service/metrics.h"
#include "proto/plan_batch.h"
#include "planner_service/server.h"
#include "proto/convert.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "proto/rpc/grpc_status.h"
#include "tests/testing/expected_plans.h"

namespace flashcp::planner_service {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::flashcp::tests::testing::PlanRequestOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Each clock reading 1 ms after the previous one.
constexpr absl::Duration kTick = absl::Milliseconds(1);

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
    max_inflight = std::max(max_inflight, inflight);
  }
  void OnQueueDepth(int64_t depth) override {
    absl::MutexLock lock(&mu_);
    depths.push_back(depth);
  }
  void OnStreamHeldBytes(int64_t bytes) override {
    absl::MutexLock lock(&mu_);
    max_held_bytes = std::max(max_held_bytes, bytes);
    held_bytes = bytes;
  }
  void OnPlanned(core::Strategy strategy, double seconds, const core::PlanMetrics& m) override {
    absl::MutexLock lock(&mu_);
    planned.push_back({std::string(core::StrategyName(strategy)), absl::StatusCode::kOk, seconds});
    imbalances.push_back(m.imbalance);
  }

  // Requests that ended with `code`, by method.
  int Count(absl::string_view method, absl::StatusCode code) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const Event& e : requests) n += e.method == method && e.code == code;
    return n;
  }

  absl::Mutex mu_;
  std::vector<Event> requests;
  std::vector<Event> planned;
  std::vector<double> imbalances;
  std::vector<int64_t> depths;
  int inflight = 0;
  int max_inflight = 0;
  int64_t held_bytes = 0;
  int64_t max_held_bytes = 0;
};

TEST(PlannerServiceTest, UnaryLatencyAndInflightAreReported) {
  core::testing::TickingClock clock{kTick};
  RecordingObserver observer;
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics = "";
  absl::StatusOr<std::unique_ptr<PlannerServer>> server =
      PlannerServer::Start(options, &observer, &clock);
  ASSERT_THAT(server, IsOk());
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  v1::PlanRequest request = PlanRequestOf(9, {5, 3}, 2);
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
  struct Case {
    void (*set)(ServerOptions&);  // one bad field on the defaults
    std::string error;
  };
  const Case cases[] = {
      {[](ServerOptions& o) { o.threads = 0; },
       "--threads: must be in [1, 1024], got 0"},
      {[](ServerOptions& o) { o.listen = "nohost"; },
       "--listen: want HOST:PORT, got \"nohost\""},
      {[](ServerOptions& o) { o.metrics = "127.0.0.1:70000"; },
       "--metrics: the port must be 0..65535, got \"127.0.0.1:70000\""},
      {[](ServerOptions& o) { o.tls_cert = "cert.pem"; },
       "--tls_cert, --tls_key: set both or neither"},
      {[](ServerOptions& o) { o.rendezvous.max_total_bytes = 0; },
       "--rendezvous_max_bytes: must be at least 1, got 0"},
      // the rest of the --rendezvous_* flags: rendezvous_service_test.cc
      {[](ServerOptions& o) { o.rendezvous.idle_timeout = absl::Milliseconds(999); },
       "--rendezvous_idle_timeout: must be at least 1s, got 999ms"},
      {[](ServerOptions& o) { o.queue_per_client = 300; },
       "--queue_per_client: must be in [0, --queue_size = 256] (0: queue_size / 4), got 300"},
      {[](ServerOptions& o) { o.stream_window_bytes = 1000; },
       "--stream_window_bytes: must be at least --max_response_bytes = 67108864, got 1000"},
      {[](ServerOptions& o) { o.stream_buffer_bytes = 1000; },
       "--stream_buffer_bytes: must be at least --stream_window_bytes = 134217728, got 1000"},
      {[](ServerOptions& o) { o.bounds.max_shard_ranks = 0; },
       "--max_shard_ranks: must be at least 1, got 0"},
      {[](ServerOptions& o) { o.ilp_threads = 0; },
       "--ilp_threads: must be in [1, 64], got 0"},
      {[](ServerOptions& o) { o.ilp_time_limit = -absl::Seconds(1); },
       "--ilp_time_limit: must not be negative"},
  };
  for (const Case& c : cases) {
    ServerOptions o;
    c.set(o);
    EXPECT_EQ(ValidateOptions(o), absl::InvalidArgumentError(c.error));
  }
  EXPECT_EQ(ListeningLine("127.0.0.1:1", "127.0.0.1:2"),
            "LISTENING grpc=127.0.0.1:1 metrics=127.0.0.1:2");
  EXPECT_EQ(ListeningLine("[::]:1", ""), "LISTENING grpc=[::]:1 metrics=-");
}

// The library's defaults are the binary's: its flags default to these, and
// a server started on ServerOptions{} bounds batches as flashcp-planner does.
TEST(ServerOptionsTest, DefaultsAreTheProductionLimits) {
  const ServerOptions o;
  EXPECT_EQ(o.limits.max_docs, 65536);
  EXPECT_EQ(o.limits.max_tokens, int64_t{1} << 24);
  EXPECT_EQ(o.limits.max_cp_size, 1024);
  const ServiceConfig c;
  EXPECT_EQ(c.limits.max_docs, o.limits.max_docs);
  EXPECT_EQ(c.limits.max_tokens, o.limits.max_tokens);
  EXPECT_EQ(c.limits.max_cp_size, o.limits.max_cp_size);
  EXPECT_EQ(c.stream_window, o.stream_window);
  EXPECT_EQ(c.stream_window_bytes, o.stream_window_bytes);
  EXPECT_EQ(c.ilp_time_limit, o.ilp_time_limit);
  // The largest Rendezvous request, above the largest PlanRequest at these
  // limits (337,381 bytes), not one at core::BatchLimits{}.
  EXPECT_EQ(MaxMessageBytes(o), (1 << 20) + 4096 * 259 + 4096);
}

TEST(ServerOptionsTest, MissingTlsFilesAreNotFound) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.tls_cert = "/nonexistent/cert.pem";
  o.tls_key = "/nonexistent/key.pem";
  NullObserver observer;
  core::RealClock clock;
  EXPECT_EQ(PlannerServer::Start(o, &observer, &clock).status(),
            absl::NotFoundError(
                "--tls_cert: cannot open \"/nonexistent/cert.pem\": No such file or directory"));
}

// A TLS file that is not PEM is INVALID_ARGUMENT naming the flag, as the
// clients say it; it was UNAVAILABLE "--listen: cannot listen on ...
// (address in use?)" once gRPC refused the credentials.
TEST(ServerOptionsTest, TlsFilesThatAreNotPemAreInvalidArgumentNamingTheFlag) {
  NullObserver observer;
  core::RealClock clock;
  const std::string not_pem = ::testing::TempDir() + "/not_pem.txt";
  {
    std::ofstream f(not_pem, std::ios::binary | std::ios::trunc);
    f << "not a certificate\n";
  }
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics = "";
  o.tls_cert = not_pem;
  o.tls_key = not_pem;
  EXPECT_THAT(PlannerServer::Start(o, &observer, &clock).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("--tls_cert: \"", not_pem, "\" holds no PEM CERTIFICATE")));
  unlink(not_pem.c_str());
  // Read to a bound: /dev/zero was read until memory ran out (bad_alloc).
  o.tls_cert = "/dev/zero";
  EXPECT_THAT(PlannerServer::Start(o, &observer, &clock).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--tls_cert: \"/dev/zero\" is larger than 16777216 bytes"));
  o.tls_cert = ::testing::TempDir();  // a directory opens, and reading it fails
  EXPECT_THAT(PlannerServer::Start(o, &observer, &clock).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("--tls_cert: cannot read \"", o.tls_cert,
                                    "\": Is a directory")));
}

// ---------------------------------------------------------------------------
// Abuse and bounds (issue 12): real in-process servers on loopback, raw
// bytes through a generic stub where the typed one cannot send them.

constexpr absl::Duration kWait = absl::Seconds(60);  // generous: the box is shared

// The binary's defaults (main.cc's flags default to ServerOptions{}'s), on
// loopback without /metrics.
ServerOptions LoopbackOptions() {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics = "";
  return o;
}

std::unique_ptr<PlannerServer> StartServer(const ServerOptions& o, ServiceObserver* observer,
                                           const core::Clock* clock) {
  absl::StatusOr<std::unique_ptr<PlannerServer>> s = PlannerServer::Start(o, observer, clock);
  EXPECT_THAT(s, IsOk());
  return s.ok() ? *std::move(s) : nullptr;
}

// A channel of its own (its own connection, so its own client for the pool).
std::shared_ptr<grpc::Channel> NewChannel(const PlannerServer& server, int id = 0) {
  grpc::ChannelArguments args;
  args.SetInt("flashcp.test.channel", id);
  args.SetMaxReceiveMessageSize(-1);
  return grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args);
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status UnaryPlan(v1::Planner::Stub& stub, const v1::PlanRequest& request,
                       v1::PlanResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  return proto::rpc::FromGrpcStatus(stub.Plan(&context, request, response));
}

// A PlanStream that writes raw messages in order, then half-closes, and
// reads every response (unless `read` is false: a client that never reads),
// or cancels the call once it has read `cancel_after` responses (0: never).
class RawStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawStream(grpc::GenericStub& stub, std::vector<std::string> items, bool read = true,
            size_t cancel_after = 0)
      : items_(std::move(items)), read_(read), cancel_after_(cancel_after) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    stub.PrepareBidiStreamingCall(&context_, "/flashcp.v1.Planner/PlanStream",
                                  grpc::StubOptions(), this);
    if (read_) StartRead(&in_);
    WriteNext();
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;
    WriteNext();
  }
  void OnWritesDoneDone(bool) override {}
  void OnReadDone(bool ok) override {
    if (!ok) return;
    v1::PlanResponse r;
    EXPECT_TRUE(grpc::SerializationTraits<v1::PlanResponse>::Deserialize(&in_, &r).ok());
    size_t n;
    {
      absl::MutexLock lock(&mu_);
      responses_.push_back(std::move(r));
      n = responses_.size();
    }
    if (n == cancel_after_) {
      context_.TryCancel();
      return;
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    done_.Notify();
  }

  void Cancel() { context_.TryCancel(); }
  // The final status, once done (within kWait).
  grpc::Status Wait() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(kWait));
    return status_;
  }
  int written() const { return written_.load(); }
  std::vector<v1::PlanResponse> responses() {
    absl::MutexLock lock(&mu_);
    return responses_;
  }

 private:
  void WriteNext() {
    if (next_ == items_.size()) {
      StartWritesDone();
      return;
    }
    out_ = Bytes(items_[next_++]);
    written_.store(static_cast<int>(next_));
    StartWrite(&out_);
  }

  grpc::ClientContext context_;
  const std::vector<std::string> items_;
  const bool read_;
  const size_t cancel_after_;
  size_t next_ = 0;
  std::atomic<int> written_{0};
  grpc::ByteBuffer out_, in_;
  absl::Mutex mu_;
  std::vector<v1::PlanResponse> responses_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_;
  absl::Notification done_;
};

// Waits (polling in 1 ms steps, with a deadline) until `ready` holds.
bool WaitUntil(const std::function<bool()>& ready) {
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline) {
    if (ready()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return ready();
}

// Item 10: bytes that are not a PlanRequest are INVALID_ARGUMENT, unary or per
// stream item; the stream answers every item and ends OK.
TEST(RawMessagesTest, UnparsableBytesAreInvalidArgumentAndTheStreamGoesOn) {
  core::RealClock clock;
  NullObserver observer;
  std::unique_ptr<PlannerServer> server = StartServer(LoopbackOptions(), &observer, &clock);
  ASSERT_NE(server, nullptr);
  grpc::GenericStub stub(NewChannel(*server));
  // Field 2 (doc_lens), length-delimited, 5 bytes long, 1 byte present.
  const std::string garbage("\x12\x05\x01", 3);
  for (const auto& [method, type] : std::vector<std::pair<std::string, std::string>>{
           {"Plan", "PlanRequest"},
           {"ListStrategies", "ListStrategiesRequest"},
           {"GetServerInfo", "GetServerInfoRequest"}}) {
    grpc::ClientContext context;
    grpc::ByteBuffer request = Bytes(garbage), response;
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(&context, "/flashcp.v1.Planner/" + method, grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) {
                     status = s;
                     done.Notify();
                   });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(status.error_message(), "could not parse flashcp.v1." + type);
  }
  std::vector<std::string> items;
  for (int i = 0; i < 40; ++i) {
    items.push_back(i % 10 == 3 ? garbage : PlanRequestOf(100 + i, {5, 3}, 2).SerializeAsString());
  }
  RawStream stream(stub, items);
  const grpc::Status status = stream.Wait();
  EXPECT_TRUE(status.ok()) << status.error_message();
  const std::vector<v1::PlanResponse> responses = stream.responses();
  ASSERT_EQ(responses.size(), 40u);
  int errors = 0;
  std::set<uint64_t> ids;
  for (const v1::PlanResponse& r : responses) {
    if (r.has_error()) {
      ++errors;
      EXPECT_EQ(r.batch_id(), 0u);
      EXPECT_EQ(r.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
      EXPECT_EQ(r.error().message(), "could not parse flashcp.v1.PlanRequest");
    } else {
      ids.insert(r.batch_id());
      EXPECT_EQ(r.shards_size(), 3);  // ring: [0,4) | [4,5) + [0,3)
    }
  }
  EXPECT_EQ(errors, 4);
  EXPECT_EQ(ids.size(), 36u);
}

// Items 12 and 13: an 8 KB strategy is INVALID_ARGUMENT with a short message
// (not RESOURCE_EXHAUSTED for a header too large); a request above the
// largest valid one is refused unparsed, naming the bound; the receive limit
// follows the limits.
TEST(RawMessagesTest, HugeFieldsAreEchoedShortAndOversizedRequestsRefusedUnparsed) {
  core::RealClock clock;
  NullObserver observer;
  ServerOptions o = LoopbackOptions();
  std::unique_ptr<PlannerServer> server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(NewChannel(*server));
  v1::PlanResponse response;
  v1::PlanRequest r = PlanRequestOf(1, {5, 3}, 2, std::string(8192, 's'));
  EXPECT_EQ(UnaryPlan(*stub, r, &response),
            absl::InvalidArgumentError(absl::StrCat(
                "strategy: unknown strategy \"", std::string(64, 's'),
                "\"... (8192 bytes) (llama3, per_doc, ring, zigzag, whole_doc, flashcp_paper, "
                "flashcp, ilp, magi, csbp, basp)")));
  // 337,381 bytes at the default limits (proto/convert_test.cc); 400,000 here.
  r = PlanRequestOf(2, {5, 3}, 2, std::string(400'000, 's'));
  EXPECT_EQ(UnaryPlan(*stub, r, &response),
            absl::ResourceExhaustedError(absl::StrCat(
                "request: ", r.ByteSizeLong(),
                " bytes, above the largest valid flashcp.v1.PlanRequest at this server's "
                "--max_docs, --max_tokens and --max_cp_size (337381 bytes)")));
  // The receive limit: the larger of that and the largest Rendezvous
  // request (1 MiB value; 4,096 keys of 256 bytes), not 64 MiB.
  EXPECT_EQ(MaxMessageBytes(o), (1 << 20) + 4096 * 259 + 4096);
  o.max_message_bytes = 1000;
  EXPECT_EQ(MaxMessageBytes(o), 1000);
  r = PlanRequestOf(3, {5, 3}, 2, std::string(3 << 20, 's'));
  EXPECT_THAT(UnaryPlan(*stub, r, &response),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("larger than max")));
  ASSERT_THAT(UnaryPlan(*stub, PlanRequestOf(4, {5, 3}, 2), &response), IsOk());
}

// Item 3: the work and the answer are bounded before planning, from the
// request alone; the message names the bound and its flag.
TEST(PlanBoundsTest, WorkAndResponseBytesAreBoundedBeforePlanning) {
  core::RealClock clock;
  RecordingObserver observer;
  ServerOptions o = LoopbackOptions();
  o.bounds.max_shard_ranks = 100;
  std::unique_ptr<PlannerServer> server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(NewChannel(*server));
  v1::PlanResponse response;
  // per_doc, 2 documents of 100 at N = 4: at most 8 + 8 shards, x 4 = 64.
  ASSERT_THAT(UnaryPlan(*stub, PlanRequestOf(1, {100, 100}, 4, "per_doc"), &response), IsOk());
  // At N = 8: 16 + 16 = 32 shards, x 8 = 256 > 100.
  EXPECT_EQ(UnaryPlan(*stub, PlanRequestOf(2, {100, 100}, 8, "per_doc"), &response),
            absl::ResourceExhaustedError(
                "planner: per_doc may cut this batch into up to 32 shards; x 8 ranks = 256, "
                "above --max_shard_ranks = 100; plan fewer documents or tokens, or a smaller "
                "cp_size"));
  server->Shutdown();
  {
    absl::MutexLock lock(&observer.mu_);
    EXPECT_EQ(observer.planned.size(), 1u);  // the refused one was never planned
  }
  // The case: per_doc over 2,000 documents at N = 512 with the
  // layout made a 510 MB answer; at the default bounds it is refused.
  o = LoopbackOptions();
  server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  stub = v1::Planner::NewStub(NewChannel(*server));
  v1::PlanRequest r = PlanRequestOf(3, std::vector<int64_t>(2000, 8000), 512, "per_doc");
  r.set_include_layout(true);
  EXPECT_THAT(UnaryPlan(*stub, r, &response),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("planner: the response may take up to "),
                                        HasSubstr(" bytes with include_layout, above "
                                                  "--max_response_bytes = 67108864; plan a "
                                                  "smaller batch or leave include_layout off"))));
}

// Item 4: ilp is off unless allowed; allowed, it runs on its own pool (a
// 2-document flashcp plan is not queued behind it), and a cancelled ILP call
// stops its plan and frees its thread.
TEST(IlpServiceTest, OffByDefaultOwnPoolAndCancellable) {
  core::RealClock clock;
  RecordingObserver observer;
  ServerOptions o = LoopbackOptions();
  o.threads = 1;
  std::unique_ptr<PlannerServer> server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(NewChannel(*server));
  v1::PlanResponse response;
  EXPECT_EQ(UnaryPlan(*stub, PlanRequestOf(1, {5, 3}, 2, "ilp"), &response),
            absl::UnimplementedError(
                "strategy: ilp is disabled on this server (start it with --allow_ilp)"));
  server->Shutdown();

  o.allow_ilp = true;
  o.ilp_time_limit = absl::Seconds(600);  // far beyond the test: only a cancel ends it
  server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  stub = v1::Planner::NewStub(NewChannel(*server));
  const std::vector<int64_t> docs = tests::testing::SlowIlpBatch();
  grpc::ClientContext ilp_context;
  v1::PlanRequest ilp = PlanRequestOf(2, docs, 8, "ilp");
  v1::PlanResponse ilp_response;
  absl::Notification ilp_done;
  stub->async()->Plan(&ilp_context, &ilp, &ilp_response, [&](grpc::Status) { ilp_done.Notify(); });
  // The ILP job runs once it left its queue; it plans the heuristics first.
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&observer.mu_);
    return observer.inflight == 1;
  }));
  for (int i = 0; i < 5; ++i) {
    ASSERT_THAT(UnaryPlan(*stub, PlanRequestOf(10 + i, {5, 3}, 2, "flashcp"), &response), IsOk());
    EXPECT_FALSE(response.has_ilp());  // only strategy ilp carries it
  }
  EXPECT_FALSE(ilp_done.HasBeenNotified());  // still planning
  const absl::Time cancelled = absl::Now();
  ilp_context.TryCancel();
  // The server's side ends when the plan stops: at CBC's next event.
  ASSERT_TRUE(WaitUntil([&] { return observer.Count("Plan", absl::StatusCode::kCancelled) == 1; }));
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(10));  // its limit is 600 s
  // Its thread is free: a small ILP plan runs now.
  ASSERT_THAT(UnaryPlan(*stub, PlanRequestOf(3, {50, 30, 20}, 2, "ilp"), &response), IsOk());
  EXPECT_EQ(response.strategy(), "ilp");
  // The solver's result, as flashcp-plan prints it: 25 blocks of
  // ceil(100 / (16 * 2)) = 4 tokens, proven optimal.
  ASSERT_TRUE(response.has_ilp());
  EXPECT_TRUE(response.ilp().optimal());
  EXPECT_EQ(response.ilp().gap(), 0.0);
  EXPECT_EQ(response.ilp().granularity(), 4);
  ASSERT_TRUE(ilp_done.WaitForNotificationWithTimeout(kWait));
}

// Item 4: the ILP's time limit counts the whole call (the LP before CBC's
// search included): at 1 s, the 100-document ILP answers with a plan in
// about 1 s; CBC's own limit counted from its start only, after seconds of LP.
TEST(IlpServiceTest, TheTimeLimitCoversTheWholeCall) {
  core::RealClock clock;
  NullObserver observer;
  ServerOptions o = LoopbackOptions();
  o.allow_ilp = true;
  o.ilp_time_limit = absl::Seconds(1);
  std::unique_ptr<PlannerServer> server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(NewChannel(*server));
  const std::vector<int64_t> docs = tests::testing::SlowIlpBatch();
  v1::PlanResponse response;
  const absl::Time start = absl::Now();
  ASSERT_THAT(UnaryPlan(*stub, PlanRequestOf(1, docs, 8, "ilp"), &response), IsOk());
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(response.strategy(), "ilp");
  EXPECT_EQ(response.doc_lens_size(), 100);
  EXPECT_LT(took, absl::Milliseconds(2500)) << took;
}

// Item 5: a client that never reads holds at most the stream's byte window:
// with planning held, every item read reserves its response bound, and the
// stream stops reading once the window is full.
TEST(StreamWindowTest, AClientThatNeverReadsHoldsAtMostTheByteWindow) {
  core::RealClock clock;
  RecordingObserver observer;
  ServerOptions o = LoopbackOptions();
  o.testing_hold_planning = true;
  proto::PlanInput in;
  in.batch = core::Batch{std::vector<int64_t>(100, 1000), 16};
  in.strategy = core::Strategy::kPerDoc;
  in.include_layout = true;
  const int64_t bound = proto::MaxResponseBytes(in, core::MaxPlanShards(in.strategy, in.batch));
  o.bounds.max_response_bytes = bound;
  o.stream_window_bytes = 3 * bound;  // reached at the third item
  std::unique_ptr<PlannerServer> server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  grpc::GenericStub stub(NewChannel(*server));
  std::vector<std::string> items;
  for (int i = 0; i < 20; ++i) {
    v1::PlanRequest r = PlanRequestOf(i, in.batch.doc_lens, 16, "per_doc");
    r.set_include_layout(true);
    items.push_back(r.SerializeAsString());
  }
  RawStream stream(stub, items, /*read=*/false);
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&observer.mu_);
    return !observer.depths.empty() && observer.depths.back() == 3;
  }));
  // 20 items sent (they fit the transport's window); 3 read, as the window says.
  ASSERT_TRUE(WaitUntil([&] { return stream.written() == 20; }));
  {
    absl::MutexLock lock(&observer.mu_);
    EXPECT_EQ(observer.inflight, 3);
    EXPECT_EQ(observer.held_bytes, 3 * bound);  // each reserved at its bound
  }
  // Released, the plans run; the cancel drops whatever is left unread.
  server->ReleasePlanning();
  stream.Cancel();
  stream.Wait();
  server->Shutdown();
  absl::MutexLock lock(&observer.mu_);
  EXPECT_EQ(observer.inflight, 0);
  EXPECT_EQ(observer.held_bytes, 0);  // all given back
  // The window, passed by at most the one item read while below it.
  EXPECT_LE(observer.max_held_bytes, o.stream_window_bytes + bound);
}

// A client that cancels its stream while plans are being written: the
// reactor must not start a read after another thread finished the call (it
// did: a planning thread's Do() wrote, the write failed on the cancelled call,
// OnWriteDone finished and deleted the reactor, then the same Do() called
// StartRead on it: SIGSEGV or a pure virtual call, the planner gone). Each
// round's responses are a few MB, so that cancels land mid-write.
TEST(StreamCancelTest, CancellingWhileResponsesAreWrittenNeitherCrashesNorLosesCounts) {
  core::RealClock clock;
  RecordingObserver observer;
  std::unique_ptr<PlannerServer> server = StartServer(LoopbackOptions(), &observer, &clock);
  ASSERT_NE(server, nullptr);
  grpc::GenericStub stub(NewChannel(*server));
  v1::PlanRequest heavy = PlanRequestOf(0, std::vector<int64_t>(1024, 1 << 14), 64, "flashcp");
  heavy.set_include_layout(true);
  const std::vector<std::string> items(64, heavy.SerializeAsString());
  constexpr int kRounds = 60;
  for (int round = 0; round < kRounds; ++round) {
    RawStream stream(stub, items, /*read=*/true, /*cancel_after=*/1 + round % 2);
    EXPECT_EQ(stream.Wait().error_code(), grpc::StatusCode::CANCELLED) << round;
  }
  // Every item read was answered or dropped exactly once, and the server
  // still plans.
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&observer.mu_);
    return observer.inflight == 0;
  }));
  v1::Planner::Stub planner(NewChannel(*server, 1));
  v1::PlanResponse response;
  EXPECT_THAT(UnaryPlan(planner, PlanRequestOf(1, {5, 3}, 2), &response), IsOk());
  server->Shutdown();
  absl::MutexLock lock(&observer.mu_);
  EXPECT_EQ(observer.held_bytes, 0);
}

TEST(HeldBytesTest, WakesWaitersWhenBelowTheLimit) {
  HeldBytes held(100);
  EXPECT_EQ(held.BelowOrWait([] {}), 0u);
  held.Add(150);
  int woken = 0;
  const HeldBytes::WaitId a = held.BelowOrWait([&] { ++woken; });
  const HeldBytes::WaitId b = held.BelowOrWait([&] { woken += 10; });
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  EXPECT_TRUE(held.CancelWait(b));
  held.Sub(40);  // 110: still at or above
  EXPECT_EQ(woken, 0);
  held.Sub(20);  // 90
  EXPECT_EQ(woken, 1);
  EXPECT_FALSE(held.CancelWait(a));
  EXPECT_EQ(held.held(), 90);
}

// Item 6: ten greedy streams (each its own connection, keeping its window
// full) and a unary client: every unary call is served, since streams wait
// for room and leave --queue_per_client slots to the others.
TEST(FairAdmissionTest, GreedyStreamsDoNotStarveAUnaryClient) {
  core::RealClock clock;
  RecordingObserver observer;
  ServerOptions o = LoopbackOptions();
  o.threads = 1;
  o.queue_size = 16;
  o.queue_per_client = 4;
  std::unique_ptr<PlannerServer> server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::vector<std::unique_ptr<RawStream>> streams;
  std::vector<std::string> items;
  for (int i = 0; i < 200; ++i) {
    items.push_back(
        PlanRequestOf(i, std::vector<int64_t>(200, 300 + i), 8, "flashcp").SerializeAsString());
  }
  for (int s = 0; s < 10; ++s) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(NewChannel(*server, 1 + s)));
    streams.push_back(std::make_unique<RawStream>(*stubs.back(), items));
  }
  auto unary = v1::Planner::NewStub(NewChannel(*server, 100));
  v1::PlanResponse response;
  int served = 0;
  for (int i = 0; i < 20; ++i) {
    absl::Status s = UnaryPlan(*unary, PlanRequestOf(1000 + i, {5, 3}, 2), &response);
    EXPECT_THAT(s, IsOk()) << i;
    served += s.ok();
  }
  EXPECT_EQ(served, 20);
  for (auto& stream : streams) stream->Cancel();
  for (auto& stream : streams) stream->Wait();
  server->Shutdown();
  absl::MutexLock lock(&observer.mu_);
  int64_t max_depth = 0;
  for (int64_t d : observer.depths) max_depth = std::max(max_depth, d);
  EXPECT_LE(max_depth, 16);  // the bound held, streams included
  EXPECT_GE(max_depth, 12);  // and the streams were greedy: their whole share taken
}


// The planner's series as /metrics serves them (labels sorted by name).
std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

TEST(PrometheusMetricsTest, PlanQualityCarriesCpSizeAndEachSchemesPhaseBottleneck) {
  prometheus::Registry registry;
  PrometheusMetrics m(registry, "test");
  core::PlanMetrics pm;
  pm.rank_workload = {1, 1, 1, 1};  // N = 4
  pm.tokens_per_rank = 100;
  pm.imbalance = 1.25;
  pm.comm_saving = 0.5;
  pm.targeted_saving = 0.75;
  pm.bytes[static_cast<int>(core::CommScheme::kAllGather)].phase.max_sent_tokens = 150;
  pm.bytes[static_cast<int>(core::CommScheme::kAllGather)].phase.max_received_tokens = 150;
  pm.bytes[static_cast<int>(core::CommScheme::kTargeted)].phase.max_sent_tokens = 50;
  pm.bytes[static_cast<int>(core::CommScheme::kTargeted)].phase.max_received_tokens = 75;
  m.OnPlanned(core::Strategy::kFlashCp, 0.5, pm);
  pm.rank_workload.resize(8);  // the same plan quality at N = 8 is another series
  m.OnPlanned(core::Strategy::kFlashCp, 0.5, pm);
  const std::string text = Scrape(registry);
  for (const char* line : {
           "flashcp_planner_planning_duration_seconds_sum{cp_size=\"4\",strategy=\"flashcp\"} 0.5",
           "flashcp_planner_plan_imbalance_ratio_sum{cp_size=\"4\",strategy=\"flashcp\"} 1.25",
           "flashcp_planner_plan_imbalance_ratio_sum{cp_size=\"8\",strategy=\"flashcp\"} 1.25",
           "flashcp_planner_plan_comm_saving_ratio_sum{cp_size=\"4\",scheme=\"allgather\","
           "strategy=\"flashcp\"} 0.5",
           "flashcp_planner_plan_comm_saving_ratio_sum{cp_size=\"4\",scheme=\"targeted\","
           "strategy=\"flashcp\"} 0.75",
           "flashcp_planner_plan_phase_bottleneck_ratio_sum{cp_size=\"4\",direction=\"send\","
           "scheme=\"allgather\",strategy=\"flashcp\"} 1.5",
           "flashcp_planner_plan_phase_bottleneck_ratio_sum{cp_size=\"4\",direction=\"send\","
           "scheme=\"targeted\",strategy=\"flashcp\"} 0.5",
           "flashcp_planner_plan_phase_bottleneck_ratio_sum{cp_size=\"4\",direction=\"receive\","
           "scheme=\"targeted\",strategy=\"flashcp\"} 0.75",
       }) {
    EXPECT_THAT(text, HasSubstr(std::string(line) + "\n")) << line;
  }
  EXPECT_THAT(text, Not(HasSubstr("scheme=\"full_kv\"")));
}

// The series are found once per label set and kept (PlanSeriesFor, the
// method cache): repeated and interleaved calls still land each in its own
// series, with exact counts.
TEST(PrometheusMetricsTest, RepeatedPlansAndRequestsCountInTheirOwnSeries) {
  prometheus::Registry registry;
  PrometheusMetrics m(registry, "test");
  core::PlanMetrics pm;
  pm.rank_workload = {1, 1};  // N = 2
  pm.tokens_per_rank = 10;
  pm.imbalance = 1.5;
  for (int i = 0; i < 3; ++i) {
    m.OnPlanned(core::Strategy::kFlashCp, 0.25, pm);
    m.OnPlanned(core::Strategy::kRing, 0.125, pm);
    m.OnRequestDone("Plan", absl::StatusCode::kOk, 0.5);
    m.OnRequestDone("PlanStream", absl::StatusCode::kOk, 0.25);
  }
  m.OnRequestDone("Plan", absl::StatusCode::kInvalidArgument, 1.0);
  const std::string text = Scrape(registry);
  for (const char* line : {
           "flashcp_planner_planning_duration_seconds_count{cp_size=\"2\",strategy=\"flashcp\"} 3",
           "flashcp_planner_planning_duration_seconds_sum{cp_size=\"2\",strategy=\"flashcp\"} 0.75",
           "flashcp_planner_planning_duration_seconds_sum{cp_size=\"2\",strategy=\"ring\"} 0.375",
           "flashcp_planner_plan_imbalance_ratio_sum{cp_size=\"2\",strategy=\"ring\"} 4.5",
           "flashcp_planner_requests_total{code=\"OK\",method=\"Plan\"} 3",
           "flashcp_planner_requests_total{code=\"INVALID_ARGUMENT\",method=\"Plan\"} 1",
           "flashcp_planner_requests_total{code=\"OK\",method=\"PlanStream\"} 3",
           "flashcp_planner_request_duration_seconds_count{method=\"Plan\"} 4",
           "flashcp_planner_request_duration_seconds_sum{method=\"Plan\"} 2.5",
           "flashcp_planner_request_duration_seconds_sum{method=\"PlanStream\"} 0.75",
       }) {
    EXPECT_THAT(text, HasSubstr(std::string(line) + "\n")) << line;
  }
}

TEST(PrometheusMetricsTest, RendezvousAndQueueSeries) {
  prometheus::Registry registry;
  PrometheusMetrics m(registry, "test");
  // Every event's series exists at 0 before the first event.
  std::string text = Scrape(registry);
  for (const char* e : {"join", "formed", "abort", "reform", "expired"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("flashcp_planner_rendezvous_events_total{event=\"", e,
                                             "\"} 0\n")));
  }
  m.OnRendezvousEvent(RendezvousObserver::Event::kJoin);
  m.OnRendezvousEvent(RendezvousObserver::Event::kJoin);
  m.OnRendezvousEvent(RendezvousObserver::Event::kAbort);
  m.OnRendezvousSize(3, 7);
  m.SetQueueCapacity(64);
  text = Scrape(registry);
  EXPECT_THAT(text, HasSubstr("flashcp_planner_rendezvous_events_total{event=\"join\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("flashcp_planner_rendezvous_events_total{event=\"abort\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("flashcp_planner_rendezvous_events_total{event=\"reform\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("flashcp_planner_rendezvous_groups 3\n"));
  EXPECT_THAT(text, HasSubstr("flashcp_planner_rendezvous_members 7\n"));
  EXPECT_THAT(text, HasSubstr("flashcp_planner_queue_capacity 64\n"));
}

}  // namespace
}  // namespace flashcp::planner_service

namespace flashcp::planner_service {
namespace {

absl::Status Report(v1::Planner::Stub& stub, const v1::ReportStepTimesRequest& request,
                    v1::ReportStepTimesResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  return proto::rpc::FromGrpcStatus(stub.ReportStepTimes(&context, request, response));
}

// `steps` steps of 4 ranks, features spread over a CPU-sized range (a fixed
// LCG), times exactly `truth`'s.
std::vector<core::CostSample> SyntheticSteps(const core::CostCoefficients& truth, int steps) {
  uint64_t x = 12345;
  const auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(x >> 11) * 0x1.0p-53;
  };
  std::vector<core::CostSample> v;
  for (int i = 0; i < 4 * steps; ++i) {
    core::RankFeatures f{1e5 + 4e5 * next(), 1e5 + 6e5 * next(), std::floor(1 + 12 * next()),
                         1000 + std::floor(24 * next())};
    v.push_back({f, core::PredictRankCost(truth, f)});
  }
  return v;
}

TEST(CalibrationServiceTest, BadReportsChangeNothingGoodOnesCalibrateLaterPlans) {
  core::RealClock clock;
  RecordingObserver observer;
  std::unique_ptr<PlannerServer> server = StartServer(LoopbackOptions(), &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(NewChannel(*server));
  v1::PlanRequest plan_request =
      PlanRequestOf(1, {900, 1500, 200, 700, 300, 96, 400}, 4, "flashcp");
  plan_request.set_cost_profile("cpu-fp32");
  const core::CostCoefficients shipped = *core::CostProfile("cpu-fp32");
  const auto plan_with = [&](v1::PlanResponse* response) {
    ASSERT_THAT(UnaryPlan(*stub, plan_request, response), IsOk());
    absl::StatusOr<proto::PlanResult> result = proto::ResponseFromProto(*response);
    ASSERT_THAT(result, IsOk());
    // The prediction is the plan's, under the coefficients reported.
    const core::CostPrediction p =
        core::PredictPlanCost(result->cost.coefficients, result->plan);
    EXPECT_EQ(result->cost.prediction.rank_cost, p.rank_cost);
    EXPECT_EQ(result->cost.prediction.imbalance, p.imbalance);
    EXPECT_EQ(result->cost.profile, "cpu-fp32");
  };
  v1::PlanResponse before;
  plan_with(&before);
  EXPECT_FALSE(before.metrics().cost_calibrated());
  EXPECT_EQ(proto::CostFromProto(before.metrics().cost()), shipped);
  EXPECT_EQ(before.metrics().rank_predicted_cost_size(), 4);

  // A host 2.2x slower than cpu-fp32's, its shape within core::CheckFitNearProfile.
  const core::CostCoefficients truth{1.2e-7, 1.3e-7, 1.5e-4, 3e-6};
  const std::vector<core::CostSample> samples = SyntheticSteps(truth, 10);
  v1::ReportStepTimesResponse response;
  struct Bad {
    v1::ReportStepTimesRequest request;
    absl::Status want;
  };
  std::vector<Bad> bad;
  bad.push_back({proto::StepTimesToProto("", 4, samples),
                 absl::InvalidArgumentError("cost_profile: required")});
  bad.push_back({proto::StepTimesToProto("pairs", 4, samples),
                 absl::InvalidArgumentError(
                     "cost_profile: \"pairs\" counts pairs, not time, and is not calibrated; "
                     "report under a time profile (h200-cudnn, cpu-fp32)")});
  bad.push_back({proto::StepTimesToProto("tpu", 4, samples),
                 absl::NotFoundError("cost profile \"tpu\" is unknown; known: pairs, "
                                     "h200-cudnn, cpu-fp32")});
  bad.push_back({proto::StepTimesToProto("cpu-fp32", 1, SyntheticSteps(truth, 17)),
                 absl::ResourceExhaustedError("steps: 68 steps, at most 64 per call")});
  bad.push_back({proto::StepTimesToProto("cpu-fp32", 80, SyntheticSteps(truth, 1040)),
                 absl::ResourceExhaustedError("steps: 4160 rank entries, at most 4096 per call")});
  {
    v1::ReportStepTimesRequest r = proto::StepTimesToProto("cpu-fp32", 4, samples);
    r.mutable_steps(2)->mutable_ranks()->RemoveLast();
    bad.push_back({r, absl::InvalidArgumentError("steps[2].ranks: 3 entries for cp_size 4")});
  }
  {
    v1::ReportStepTimesRequest r = proto::StepTimesToProto("cpu-fp32", 4, samples);
    r.mutable_steps(1)->mutable_ranks(2)->set_seconds(std::nan(""));
    bad.push_back({r, absl::InvalidArgumentError(
                          "steps[1].ranks[2].seconds: must be finite and > 0, got nan")});
  }
  {
    v1::ReportStepTimesRequest r = proto::StepTimesToProto("cpu-fp32", 4, samples);
    r.mutable_steps(9)->mutable_ranks(0)->set_seconds(-0.5);
    bad.push_back({r, absl::InvalidArgumentError(
                          "steps[9].ranks[0].seconds: must be finite and > 0, got -0.5")});
  }
  {
    v1::ReportStepTimesRequest r = proto::StepTimesToProto("cpu-fp32", 4, samples);
    r.set_cost_profile(std::string(300 * 1024, 'x'));
    bad.push_back({r, absl::ResourceExhaustedError(absl::StrCat(
                          "request: ", r.ByteSizeLong(), " bytes, above the largest valid "
                          "flashcp.v1.ReportStepTimesRequest (262144 bytes)"))});
  }
  for (const Bad& b : bad) EXPECT_EQ(Report(*stub, b.request, &response), b.want);
  // None of them changed anything.
  v1::PlanResponse still;
  plan_with(&still);
  EXPECT_FALSE(still.metrics().cost_calibrated());
  still.mutable_metrics()->clear_planning_seconds();  // real time: differs
  before.mutable_metrics()->clear_planning_seconds();
  EXPECT_EQ(still.SerializeAsString(), before.SerializeAsString());

  // 9 steps x 4 ranks = 36 samples, above the 32 a fit needs.
  ASSERT_THAT(Report(*stub, proto::StepTimesToProto("cpu-fp32", 4, SyntheticSteps(truth, 9)),
                     &response),
              IsOk());
  EXPECT_EQ(response.accepted_samples(), 36);
  EXPECT_EQ(response.profile_samples(), 36);
  ASSERT_TRUE(response.calibrated()) << response.fit_status();
  EXPECT_EQ(response.fit_status(), "");
  const core::CostCoefficients fit = proto::CostFromProto(response.fit());
  EXPECT_NEAR(fit.whole_pair, truth.whole_pair, 1e-9 * truth.whole_pair);
  EXPECT_NEAR(fit.prefixed_pair, truth.prefixed_pair, 1e-9 * truth.prefixed_pair);
  EXPECT_NEAR(fit.sequence, truth.sequence, 1e-9 * truth.sequence);
  EXPECT_NEAR(fit.token, truth.token, 1e-9 * truth.token);
  v1::PlanResponse after;
  plan_with(&after);
  EXPECT_TRUE(after.metrics().cost_calibrated());
  EXPECT_EQ(proto::CostFromProto(after.metrics().cost()), fit);
  // Requests without a profile still plan on pairs.
  v1::PlanResponse pairs;
  ASSERT_THAT(UnaryPlan(*stub, PlanRequestOf(2, {900, 1500, 200, 700, 300, 96, 400}, 4,
                                             "flashcp"),
                        &pairs),
              IsOk());
  EXPECT_EQ(pairs.metrics().cost_profile(), "pairs");
  EXPECT_FALSE(pairs.metrics().cost_calibrated());
  EXPECT_EQ(pairs.metrics().predicted_cost_imbalance(), pairs.metrics().imbalance_ratio());
  EXPECT_EQ(observer.Count("ReportStepTimes", absl::StatusCode::kOk), 1);
  EXPECT_EQ(observer.Count("ReportStepTimes", absl::StatusCode::kInvalidArgument), 5);
}

TEST(CalibrationServiceTest, PlanRequestCostIsValidated) {
  core::RealClock clock;
  RecordingObserver observer;
  std::unique_ptr<PlannerServer> server = StartServer(LoopbackOptions(), &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(NewChannel(*server));
  v1::PlanResponse response;
  v1::PlanRequest r = PlanRequestOf(1, {100, 50}, 2, "flashcp");
  r.set_cost_profile("tpu");
  EXPECT_EQ(UnaryPlan(*stub, r, &response),
            absl::InvalidArgumentError("cost_profile: cost profile \"tpu\" is unknown; known: "
                                       "pairs, h200-cudnn, cpu-fp32"));
  r.set_cost_profile("cpu-fp32");
  r.mutable_cost()->set_whole_pair(1e-9);
  EXPECT_EQ(UnaryPlan(*stub, r, &response),
            absl::InvalidArgumentError(
                "cost_profile: give a profile or cost coefficients, not both"));
  r.clear_cost_profile();
  EXPECT_EQ(UnaryPlan(*stub, r, &response),
            absl::InvalidArgumentError("cost.prefixed_pair: must be > 0"));
  r.mutable_cost()->set_prefixed_pair(2e-9);
  r.mutable_cost()->set_sequence(-1);
  EXPECT_EQ(UnaryPlan(*stub, r, &response),
            absl::InvalidArgumentError(
                "cost.sequence: must be finite and in [0, 1000], got -1"));
  r.mutable_cost()->set_sequence(1e-5);
  ASSERT_THAT(UnaryPlan(*stub, r, &response), IsOk());
  EXPECT_EQ(response.metrics().cost_profile(), "");
  EXPECT_EQ(proto::CostFromProto(response.metrics().cost()),
            (core::CostCoefficients{1e-9, 2e-9, 1e-5, 0}));
  r.set_cost_profile(std::string(65, 'p'));
  r.clear_cost();
  EXPECT_EQ(UnaryPlan(*stub, r, &response),
            absl::InvalidArgumentError("cost_profile: at most 64 bytes, got 65"));
}

}  // namespace
}  // namespace flashcp::planner_service

namespace flashcp::planner_service {
namespace {

// Issue 31 items 2, 3 and 8: calibration per tenant, no accept-then-refuse,
// the report rate limit.
class CalibrationTenantTest : public ::testing::Test {
 protected:
  static v1::PlanRequest CpuRequest() {
    v1::PlanRequest r = PlanRequestOf(1, {900, 1500, 200, 700, 300, 96, 400}, 4, "flashcp");
    r.set_cost_profile("cpu-fp32");
    return r;
  }
  static v1::PlanResponse PlanOn(v1::Planner::Stub& stub, const v1::PlanRequest& r) {
    v1::PlanResponse response;
    EXPECT_THAT(UnaryPlan(stub, r, &response), IsOk());
    response.mutable_metrics()->clear_planning_seconds();  // real time: differs
    return response;
  }
};

TEST_F(CalibrationTenantTest, AReporterCannotMoveAnotherConnectionsPlans) {
  core::RealClock clock;
  RecordingObserver observer;
  std::unique_ptr<PlannerServer> server = StartServer(LoopbackOptions(), &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto victim = v1::Planner::NewStub(NewChannel(*server, 1));
  auto attacker = v1::Planner::NewStub(NewChannel(*server, 2));
  const v1::PlanResponse before = PlanOn(*victim, CpuRequest());
  EXPECT_FALSE(before.metrics().cost_calibrated());
  // A fit the rule accepts, reported by another connection.
  const core::CostCoefficients other{1.2e-7, 1.3e-7, 1.5e-4, 3e-6};
  v1::ReportStepTimesResponse response;
  ASSERT_THAT(Report(*attacker, proto::StepTimesToProto("cpu-fp32", 4, SyntheticSteps(other, 64)),
                     &response),
              IsOk());
  ASSERT_TRUE(response.calibrated()) << response.fit_status();
  // The reporter's own plans use it; the victim's are byte for byte as before.
  EXPECT_TRUE(PlanOn(*attacker, CpuRequest()).metrics().cost_calibrated());
  EXPECT_EQ(PlanOn(*victim, CpuRequest()).SerializeAsString(), before.SerializeAsString());
}

TEST_F(CalibrationTenantTest, APairsFitIsRefusedAndRankSpeedRequestsStillPlan) {
  core::RealClock clock;
  RecordingObserver observer;
  std::unique_ptr<PlannerServer> server = StartServer(LoopbackOptions(), &observer, &clock);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Planner::NewStub(NewChannel(*server, 1));
  v1::PlanRequest speeds = CpuRequest();
  for (double v : {1.0, 1.1, 0.9, 1.0}) speeds.add_rank_speed(v);
  ASSERT_FALSE(PlanOn(*stub, speeds).has_error());
  // The probe's 33 reports: times equal to the pairs count.
  v1::ReportStepTimesResponse response;
  for (int i = 0; i < 3; ++i) {
    ASSERT_THAT(Report(*stub,
                       proto::StepTimesToProto("cpu-fp32", 4, SyntheticSteps({1, 1, 0, 0}, 16)),
                       &response),
                IsOk());
  }
  EXPECT_FALSE(response.calibrated());
  EXPECT_THAT(response.fit_status(), ::testing::StartsWith("refused: "));
  // Validated once, against the coefficients used: still plans.
  const v1::PlanResponse after = PlanOn(*stub, speeds);
  EXPECT_FALSE(after.has_error()) << after.error().message();
  EXPECT_FALSE(after.metrics().cost_calibrated());
  EXPECT_EQ(after.metrics().rank_speed_size(), 4);
}

TEST_F(CalibrationTenantTest, ReportsAreRateLimitedPerClient) {
  core::ManualClock clock;
  RecordingObserver observer;
  ServerOptions o = LoopbackOptions();
  o.report_rate = {.per_second = 1, .burst = 2, .max_keys = 16};
  std::unique_ptr<PlannerServer> server = StartServer(o, &observer, &clock);
  ASSERT_NE(server, nullptr);
  // Two connections from one host share the host's bucket.
  auto a = v1::Planner::NewStub(NewChannel(*server, 1));
  auto b = v1::Planner::NewStub(NewChannel(*server, 2));
  const v1::ReportStepTimesRequest r =
      proto::StepTimesToProto("cpu-fp32", 4, SyntheticSteps({1.2e-7, 1.3e-7, 1.5e-4, 3e-6}, 9));
  v1::ReportStepTimesResponse response;
  EXPECT_THAT(Report(*a, r, &response), IsOk());
  EXPECT_THAT(Report(*b, r, &response), IsOk());
  EXPECT_EQ(Report(*a, r, &response),
            absl::ResourceExhaustedError(
                "ReportStepTimes: rate limit: at most 1 reports per second (bursts of 2) per "
                "client (mTLS identity, else host); retry later"));
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(Report(*b, r, &response), IsOk());
  EXPECT_EQ(observer.Count("ReportStepTimes", absl::StatusCode::kResourceExhausted), 1);
}

}  // namespace
}  // namespace flashcp::planner_service
