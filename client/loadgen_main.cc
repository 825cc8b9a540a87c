// flashcp-loadgen: drives a flashcp-planner server and reports throughput and
// latency. Bounded in time (--duration) and count (--max_requests). Unary mode
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

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "client/internal/tool_flags.h"
#include "client/pipelined_planner.h"
#include "core/cli.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/plan_json.h"
#include "core/status_macros.h"

namespace fc = flashcp::client;
namespace core = flashcp::core;

namespace {

constexpr char kPrefix[] = "flashcp-loadgen: ";
constexpr char kUsage[] = R"(Usage: flashcp-loadgen --server HOST:PORT [--flag=value ...]

Drives a flashcp-planner server with --batches distinct sampled batches, sent
round robin, for --duration seconds or --max_requests requests, and reports
throughput and latency. Exit status 0 when no request failed, 1 otherwise, 2
for a bad flag.)";

}  // namespace

ABSL_FLAG(double, duration, 10, "seconds to run, in [0.001, 86400]");
ABSL_FLAG(int64_t, max_requests, INT64_MAX, "stop after this many requests");
ABSL_FLAG(bool, stream, false, "use PlanStream instead of unary Plan calls");
ABSL_FLAG(int64_t, concurrency, 1, "client threads, each with its own call(s)");
ABSL_FLAG(int64_t, inflight, 64, "batches in flight per stream with --stream");
ABSL_FLAG(std::string, dataset, "pile", "wlbllm, pile or redpajama");
ABSL_FLAG(int64_t, batches, 64, "distinct batches, sent round robin");
ABSL_FLAG(double, timeout, 10, "deadline per unary call, seconds");
ABSL_FLAG(bool, json, false, "print one JSON object instead of the text report");

namespace {

using Clock = std::chrono::steady_clock;

// Errors reported with their messages; the rest are only counted by code.
constexpr size_t kFirstErrors = 5;

struct Options {
  fc::internal::ToolFlags tool;
  double duration_s = 10;
  int64_t max_requests = INT64_MAX;
  bool stream = false;
  int concurrency = 1;
  int inflight = 64;
  core::Dataset dataset = core::Dataset::kPile;
  int64_t batches = 64;
  absl::Duration timeout = absl::Seconds(10);
  bool json = false;
};

absl::StatusOr<Options> ParseOptions(const core::CommandLine& line) {
  Options o;
  FLASHCP_ASSIGN_OR_RETURN(o.tool, fc::internal::ToolFlagsFromCommandLine(line));
  FLASHCP_ASSIGN_OR_RETURN(
      o.duration_s, core::DoubleFlagIn("duration", absl::GetFlag(FLAGS_duration), 0.001, 86400));
  FLASHCP_ASSIGN_OR_RETURN(
      o.max_requests,
      core::IntFlagIn("max_requests", absl::GetFlag(FLAGS_max_requests), 1, INT64_MAX));
  FLASHCP_ASSIGN_OR_RETURN(
      const int64_t concurrency,
      core::IntFlagIn("concurrency", absl::GetFlag(FLAGS_concurrency), 1, 1024));
  FLASHCP_ASSIGN_OR_RETURN(const int64_t inflight,
                           core::IntFlagIn("inflight", absl::GetFlag(FLAGS_inflight), 1, 4096));
  FLASHCP_ASSIGN_OR_RETURN(o.batches,
                           core::IntFlagIn("batches", absl::GetFlag(FLAGS_batches), 1, 100'000));
  FLASHCP_ASSIGN_OR_RETURN(const double timeout,
                           core::DoubleFlagIn("timeout", absl::GetFlag(FLAGS_timeout), 0.001, 1e7));
  FLASHCP_ASSIGN_OR_RETURN(o.dataset, core::DatasetFromFlag(absl::GetFlag(FLAGS_dataset)));
  o.stream = absl::GetFlag(FLAGS_stream);
  o.concurrency = static_cast<int>(concurrency);
  o.inflight = static_cast<int>(inflight);
  o.timeout = absl::Seconds(timeout);
  o.json = absl::GetFlag(FLAGS_json);
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
      core::Percentile(lat, 1.0), o.concurrency, o.stream ? o.inflight : 1, o.tool.cp_size,
      o.tool.context, core::DatasetName(o.dataset), o.tool.strategy, codes_json, first_json);
}

int Run(const Options& o) {
  std::vector<fc::v1::PlanRequest> requests;
  for (int64_t k = 0; k < o.batches; ++k) {
    auto docs = core::SampleBatch(o.dataset, o.tool.context, o.tool.seed, k);
    if (!docs.ok()) {
      std::cerr << kPrefix << docs.status().message() << "\n";
      return 2;
    }
    fc::v1::PlanRequest r;
    r.set_batch_id(static_cast<uint64_t>(k));
    for (int64_t len : *docs) r.add_doc_lens(len);
    r.set_cp_size(o.tool.cp_size);
    r.set_strategy(o.tool.strategy);
    requests.push_back(std::move(r));
  }

  // One channel per thread: gRPC multiplexes calls on a channel's single
  // connection, which would otherwise serialize the client's threads.
  absl::StatusOr<fc::ChannelOptions> channel_options = fc::ChannelOptions{.own_connection = true};
  if (o.tool.tls.has_value()) channel_options = fc::WithTls(*channel_options, *o.tool.tls);
  if (!channel_options.ok()) {
    std::cerr << kPrefix << channel_options.status().message() << "\n";
    return 1;
  }
  std::vector<std::shared_ptr<fc::PlannerClient>> clients;
  for (int t = 0; t < o.concurrency; ++t) {
    clients.push_back(
        std::make_shared<fc::GrpcPlannerClient>(fc::MakeChannel(o.tool.server, *channel_options)));
  }
  if (auto info = fc::WaitForServer(*clients[0], o.tool.connect_timeout); !info.ok()) {
    std::cerr << kPrefix << "cannot reach " << o.tool.server << ": " << info.status().ToString()
              << "\n";
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
  std::cout.flush();
  if (!std::cout) {
    std::cerr << kPrefix << "error writing the output\n";
    return 1;
  }
  return errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  core::CommandLine line;
  if (std::optional<int> rc = core::ParseMain(argc, argv, kUsage, line, std::cout, std::cerr)) {
    return *rc;
  }
  absl::StatusOr<Options> options = ParseOptions(line);
  if (!options.ok()) return core::UsageError("flashcp-loadgen", options.status(), std::cerr);
  return Run(*options);
}
