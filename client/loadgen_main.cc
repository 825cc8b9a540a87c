// flashcp-loadgen: drives a flashcp-planner server and reports throughput and
// latency. Bounded in time (--duration) and count (--max-requests). Unary mode
// (default): --concurrency threads each make blocking Plan calls, one at a
// time. --stream: each thread keeps --inflight batches in flight on one
// PlanStream (client/pipelined_planner.h); an item's latency runs from its
// send to its in-order delivery.
//
// Batches: --batches distinct Pile-like 128K batches at N = 8 by default,
// sent round robin. Output: a text report, or with --json one JSON object
// {"mode","requests","errors","duration_s","qps","p50_ms","p90_ms","p99_ms",
//  "p999_ms","max_ms","concurrency","inflight","error_codes":{...},
//  "first_errors":[{"code","message"},...]}: errors counted by code, and the
// first kFirstErrors of them (in the order they happened) with their messages.
// Exit status 0 when no request failed, 1 otherwise, 2 for a bad flag.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "client/internal/tool_args.h"
#include "client/pipelined_planner.h"
#include "core/cli.h"
#include "core/datasets.h"
#include "core/plan_json.h"

namespace fc = flashcp::client;
namespace core = flashcp::core;

namespace {

constexpr char kPrefix[] = "flashcp-loadgen: ";
constexpr char kUsage[] = R"(Usage: flashcp-loadgen --server HOST:PORT [flags]

Flags:
  --server HOST:PORT   the planner (required)
  --duration S         seconds to run (default 10)
  --max-requests N     stop after N requests (default: no limit but the duration)
  --stream             use PlanStream instead of unary Plan calls
  --concurrency C      client threads, each with its own call(s) (default 1)
  --inflight K         batches in flight per stream with --stream (default 64)
  --dataset NAME       wlbllm, pile or redpajama (default pile)
  --context C          tokens per batch (default 131072)
  --cp N               ranks in the CP group (default 8)
  --strategy NAME      strategy to ask for (default: the server's)
  --batches B          distinct batches, sent round robin (default 64)
  --seed S             sampling seed (default 1)
  --timeout S          deadline per unary call, seconds (default 10)
  --connect-timeout S  how long to wait for the server first (default 10)
  --tls_ca FILE        TLS: PEM CA bundle the server's certificate must chain to;
                       plaintext without it
  --tls_cert FILE, --tls_key FILE
                       mTLS: PEM client certificate and key; need --tls_ca
  --tls_server_name N  TLS: the name the server's certificate must carry, when
                       it is not the host of --server
  --json               print one JSON object instead of the text report
)";

using Clock = std::chrono::steady_clock;

// Errors reported with their messages; the rest are only counted by code.
constexpr size_t kFirstErrors = 5;

struct Options {
  std::string server;
  double duration_s = 10;
  int64_t max_requests = INT64_MAX;
  bool stream = false;
  int concurrency = 1;
  int inflight = 64;
  core::Dataset dataset = core::Dataset::kPile;
  int64_t context = 131072;
  int32_t cp_size = 8;
  std::string strategy;
  int64_t batches = 64;
  uint64_t seed = 1;
  absl::Duration timeout = absl::Seconds(10);
  absl::Duration connect_timeout = absl::Seconds(10);
  std::optional<fc::TlsOptions> tls;  // nullopt: plaintext
  bool json = false;
};

absl::StatusOr<Options> ParseOptions(const std::vector<std::string>& args, bool* help) {
  auto a = fc::internal::ToolArgs::Parse(
      args,
      {"server", "duration", "max-requests", "concurrency", "inflight", "dataset", "context",
       "cp", "strategy", "batches", "seed", "timeout", "connect-timeout", "tls_ca", "tls_cert",
       "tls_key", "tls_server_name"},
      {"stream", "json", "help"});
  if (!a.ok()) return a.status();
  Options o;
  *help = a->Has("help");
  if (*help) return o;
  o.server = a->String("server", "");
  if (o.server.empty()) return absl::InvalidArgumentError("--server HOST:PORT is required");
  auto duration = a->Double("duration", 10, 0.001, 86400);
  auto max_requests = a->Int("max-requests", INT64_MAX, 1, INT64_MAX);
  auto concurrency = a->Int("concurrency", 1, 1, 1024);
  auto inflight = a->Int("inflight", 64, 1, 4096);
  auto context = a->Int("context", 131072, 1, core::kMaxTokens);
  auto cp = a->Int("cp", 8, 1, core::kMaxCpSize);
  auto batches = a->Int("batches", 64, 1, 100'000);
  auto seed = a->Int("seed", 1, 0, INT64_MAX);
  auto timeout = a->Double("timeout", 10, 0.001, 1e7);
  auto connect = a->Double("connect-timeout", 10, 0, 1e7);
  auto tls = fc::internal::TlsOptionsFromArgs(*a);
  for (const absl::Status& s :
       {duration.status(), max_requests.status(), concurrency.status(), inflight.status(),
        context.status(), cp.status(), batches.status(), seed.status(), timeout.status(),
        connect.status(), tls.status()}) {
    if (!s.ok()) return s;
  }
  auto dataset = core::ParseDataset(a->String("dataset", "pile"));
  if (!dataset.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--dataset: ", dataset.status().message()));
  }
  o.duration_s = *duration;
  o.max_requests = *max_requests;
  o.stream = a->Has("stream");
  o.concurrency = static_cast<int>(*concurrency);
  o.inflight = static_cast<int>(*inflight);
  o.dataset = *dataset;
  o.context = *context;
  o.cp_size = static_cast<int32_t>(*cp);
  o.strategy = a->String("strategy", "");
  o.batches = *batches;
  o.seed = static_cast<uint64_t>(*seed);
  o.timeout = absl::Seconds(*timeout);
  o.connect_timeout = absl::Seconds(*connect);
  o.tls = *std::move(tls);
  o.json = a->Has("json");
  return o;
}

// An error as it happened: when, and the status.
struct SeenError {
  Clock::time_point at;
  absl::Status status;
};

// Latencies and error codes of one thread.
struct ThreadStats {
  std::vector<double> latency_ms;  // successful requests
  std::map<std::string, int64_t> errors;  // by code name
  std::vector<SeenError> first_errors;    // this thread's first kFirstErrors

  // Counts `n` failed requests with `status`.
  void AddError(const absl::Status& status, int64_t n = 1) {
    errors[absl::StatusCodeToString(status.code())] += n;
    if (first_errors.size() < kFirstErrors) first_errors.push_back({Clock::now(), status});
  }
};

// Hands out request slots until the count or the time is up.
class Budget {
 public:
  Budget(int64_t max_requests, Clock::time_point end) : max_(max_requests), end_(end) {}
  bool Take() {
    if (Clock::now() >= end_) return false;
    return taken_.fetch_add(1, std::memory_order_relaxed) < max_;
  }

 private:
  const int64_t max_;
  const Clock::time_point end_;
  std::atomic<int64_t> taken_{0};
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void UnaryWorker(fc::PlannerClient& client, const std::vector<fc::v1::PlanRequest>& requests,
                 const Options& o, Budget& budget, size_t offset, ThreadStats& stats) {
  for (size_t i = offset; budget.Take(); ++i) {
    const Clock::time_point t0 = Clock::now();
    fc::PlanResult r = client.Plan(requests[i % requests.size()], {.timeout = o.timeout});
    const double ms = Ms(Clock::now() - t0);
    if (r.ok()) {
      stats.latency_ms.push_back(ms);
    } else {
      stats.AddError(r.status());
    }
  }
}

void StreamWorker(fc::PlannerClient& client, const std::vector<fc::v1::PlanRequest>& requests,
                  const Options& o, Budget& budget, size_t offset, ThreadStats& stats) {
  std::deque<Clock::time_point> sent;  // send times of requests not yet delivered
  size_t i = offset;
  auto source = [&]() -> std::optional<fc::v1::PlanRequest> {
    if (!budget.Take()) return std::nullopt;
    sent.push_back(Clock::now());
    return requests[i++ % requests.size()];
  };
  auto sink = [&](int64_t, fc::PlanResult r) {
    const double ms = Ms(Clock::now() - sent.front());
    sent.pop_front();
    if (r.ok()) {
      stats.latency_ms.push_back(ms);
    } else {
      stats.AddError(r.status());
    }
  };
  const absl::Duration stream_deadline = absl::Seconds(o.duration_s) + absl::Seconds(60);
  const absl::Status status = fc::PlanPipelined(
      client, {.inflight = o.inflight, .call = {.timeout = stream_deadline}}, std::ref(source),
      std::ref(sink));
  if (!status.ok()) {
    // Items sent but never answered count as errors with the stream's code.
    stats.AddError(status, std::max<int64_t>(1, static_cast<int64_t>(sent.size())));
    std::cerr << kPrefix << "stream failed: " << status.ToString() << "\n";
  }
}

std::string Json(const Options& o, int64_t requests, int64_t errors, double seconds,
                 const std::vector<double>& lat, const std::map<std::string, int64_t>& codes,
                 const std::vector<SeenError>& first_errors) {
  std::string codes_json;
  for (const auto& [code, n] : codes) {
    absl::StrAppend(&codes_json, codes_json.empty() ? "" : ",", "\"", code, "\":", n);
  }
  std::string first_json;
  for (const SeenError& e : first_errors) {
    absl::StrAppend(&first_json, first_json.empty() ? "" : ",", "{\"code\":\"",
                    absl::StatusCodeToString(e.status.code()),
                    "\",\"message\":", core::JsonString(e.status.message()), "}");
  }
  return absl::StrFormat(
      "{\"mode\":\"%s\",\"requests\":%d,\"errors\":%d,\"duration_s\":%.3f,\"qps\":%.1f,"
      "\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,\"p999_ms\":%.4f,\"max_ms\":%.4f,"
      "\"concurrency\":%d,\"inflight\":%d,\"cp_size\":%d,\"context\":%d,\"dataset\":\"%s\","
      "\"strategy\":\"%s\",\"error_codes\":{%s},\"first_errors\":[%s]}",
      o.stream ? "stream" : "unary", requests, errors, seconds,
      seconds > 0 ? static_cast<double>(requests) / seconds : 0.0, core::Percentile(lat, 0.5),
      core::Percentile(lat, 0.9), core::Percentile(lat, 0.99), core::Percentile(lat, 0.999),
      core::Percentile(lat, 1.0), o.concurrency, o.stream ? o.inflight : 1, o.cp_size, o.context,
      core::DatasetName(o.dataset), o.strategy, codes_json, first_json);
}

int Run(const Options& o) {
  std::vector<fc::v1::PlanRequest> requests;
  for (int64_t k = 0; k < o.batches; ++k) {
    auto docs = core::SampleBatch(o.dataset, o.context, o.seed, k);
    if (!docs.ok()) {
      std::cerr << kPrefix << docs.status().message() << "\n";
      return 2;
    }
    fc::v1::PlanRequest r;
    r.set_batch_id(static_cast<uint64_t>(k));
    for (int64_t len : *docs) r.add_doc_lens(len);
    r.set_cp_size(o.cp_size);
    r.set_strategy(o.strategy);
    requests.push_back(std::move(r));
  }

  // One channel per thread: gRPC multiplexes calls on a channel's single
  // connection, which would otherwise serialize the client's threads.
  absl::StatusOr<fc::ChannelOptions> channel_options = fc::ChannelOptions{.own_connection = true};
  if (o.tls.has_value()) channel_options = fc::WithTls(*channel_options, *o.tls);
  if (!channel_options.ok()) {
    std::cerr << kPrefix << channel_options.status().message() << "\n";
    return 1;
  }
  std::vector<std::shared_ptr<fc::PlannerClient>> clients;
  for (int t = 0; t < o.concurrency; ++t) {
    clients.push_back(
        std::make_shared<fc::GrpcPlannerClient>(fc::MakeChannel(o.server, *channel_options)));
  }
  if (auto info = fc::WaitForServer(*clients[0], o.connect_timeout); !info.ok()) {
    std::cerr << kPrefix << "cannot reach " << o.server << ": " << info.status().ToString() << "\n";
    return 1;
  }

  const Clock::time_point start = Clock::now();
  Budget budget(o.max_requests,
                start + std::chrono::microseconds(static_cast<int64_t>(o.duration_s * 1e6)));
  std::vector<ThreadStats> stats(o.concurrency);
  std::vector<std::thread> threads;
  for (int t = 0; t < o.concurrency; ++t) {
    const size_t offset = static_cast<size_t>(t) * requests.size() / o.concurrency;
    threads.emplace_back([&, t, offset] {
      if (o.stream) {
        StreamWorker(*clients[t], requests, o, budget, offset, stats[t]);
      } else {
        UnaryWorker(*clients[t], requests, o, budget, offset, stats[t]);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> lat;
  std::map<std::string, int64_t> codes;
  std::vector<SeenError> first_errors;
  int64_t errors = 0;
  for (const ThreadStats& s : stats) {
    lat.insert(lat.end(), s.latency_ms.begin(), s.latency_ms.end());
    for (const auto& [code, n] : s.errors) {
      codes[code] += n;
      errors += n;
    }
    first_errors.insert(first_errors.end(), s.first_errors.begin(), s.first_errors.end());
  }
  std::stable_sort(first_errors.begin(), first_errors.end(),
                   [](const SeenError& a, const SeenError& b) { return a.at < b.at; });
  if (first_errors.size() > kFirstErrors) first_errors.resize(kFirstErrors);
  const int64_t requests_done = static_cast<int64_t>(lat.size()) + errors;
  if (o.json) {
    std::cout << Json(o, requests_done, errors, seconds, lat, codes, first_errors) << std::endl;
  } else {
    std::cout << absl::StrFormat(
        "%s: %d requests (%d errors) in %.2f s: %.1f per second\n"
        "latency ms: p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f\n",
        o.stream ? "stream" : "unary", requests_done, errors, seconds,
        seconds > 0 ? static_cast<double>(requests_done) / seconds : 0.0,
        core::Percentile(lat, 0.5), core::Percentile(lat, 0.9), core::Percentile(lat, 0.99),
        core::Percentile(lat, 0.999), core::Percentile(lat, 1.0));
    for (const auto& [code, n] : codes) std::cout << "  " << code << ": " << n << "\n";
    if (!first_errors.empty()) std::cout << "first errors:\n";
    for (const SeenError& e : first_errors) {
      std::cout << "  " << absl::StatusCodeToString(e.status.code()) << ": "
                << e.status.message() << "\n";
    }
  }
  return errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  bool help = false;
  absl::StatusOr<Options> options = ParseOptions(args, &help);
  if (!options.ok()) {
    std::cerr << kPrefix << options.status().message() << "\ntry --help\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  return Run(*options);
}
