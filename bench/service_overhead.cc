// service_overhead: the planner service against the in-process planner on
// the same batches (issue 29, "Service speed"; issue 3's targets). For each
// cell (data set, context, N) a pool of --batches batches (seed 1) is planned
//   in process: proto::RequestFromProto + proto::PlanBatch (the
//     service's own planning step: MakePlan, AnalyzePlan, the cost model and
//     the conversion to a PlanResponse) + SerializeResponse, on this thread,
//     the objects' destruction included (the server's CPU includes its own);
//     its thread CPU time per plan and the wall-time percentiles;
//   unary: one real flashcp-planner process on loopback (port 0), one Plan
//     call at a time; the server process's CPU time per plan (every live
//     thread's /proc/PID/task/TID/schedstat run time over the pass, in
//     nanoseconds; /proc/PID/stat's total, in clock ticks, is printed beside
//     it as a check) and the calls' wall-time percentiles seen by the client;
//   stream: one PlanStream keeping --window requests in flight; the server's
//     CPU time per plan and plans per second;
//   many: ManyPlanner.PlanMany, --per_call requests per call (the pool's
//     batches in order), --many_window calls in flight (1: one at a time,
//     through client::ManyPlannerClient; more: gRPC's async stub, as a
//     Prefetcher keeps them); the server's CPU time per plan and plans per
//     second.
// Each mode makes one warm-up pass, then --passes timed passes over the
// pool, the modes interleaved pass by pass (in process, unary, stream, many,
// in process, ...), so that a shared machine's drifting load weighs on all
// of them alike.
// Targets (issue 29): server CPU per plan <= 1.3 x in process; unary p99 <=
// 3 x p50. Markdown on stdout: the main table; the server's CPU per plan by
// thread name (schedstat; which of the pool's and gRPC's threads spend it);
// and the tails in CPU time beside wall time (in process: each call's thread
// CPU; unary: the server's CPU while each call was in flight), which tell the
// machine's scheduling noise from the service's own tail.
//
//   build/bin/service_overhead --planner_bin build/bin/flashcp-planner
//       [--cells pile:131072:8,...] [--batches 64] [--passes 3] [--window 64]
//       [--per_call 8] [--many_window 1] [--unary=false] [--stream=false] [--many=false]
//       (to profile one mode)
#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/thread_cpu.h"
#include "client/many_planner_client.h"
#include "core/cli.h"
#include "core/clock.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/strategies.h"
#include "flashcp/v1/plan_many.grpc.pb.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/observer.h"
#include "planner_service/plan_many_service.h"
#include "proto/convert.h"
#include "proto/plan_batch.h"
#include "tests/testing/planner_process.h"

ABSL_FLAG(std::string, planner_bin, "build/bin/flashcp-planner", "the flashcp-planner binary");
ABSL_FLAG(std::vector<std::string>, planner_args, {"--threads=1"},
          "flags for the planner, comma-separated");
ABSL_FLAG(std::string, cells, "wlbllm:131072:8,pile:131072:8,pile:131072:32,pile:1048576:64",
          "cells DATASET:CONTEXT:N, comma-separated");
ABSL_FLAG(std::string, strategy, "flashcp", "the strategy planned");
ABSL_FLAG(int64_t, batches, 64, "batches per cell's pool, 1 to 10000");
ABSL_FLAG(int64_t, passes, 10, "timed passes over the pool per mode, 1 to 1000");
ABSL_FLAG(int64_t, window, 64, "stream: requests in flight, 1 to 4096");
ABSL_FLAG(bool, unary, true, "run the unary mode (false: its columns read 0; for profiling)");
ABSL_FLAG(bool, stream, true, "run the stream mode (false: its columns read 0; for profiling)");
ABSL_FLAG(bool, many, true, "run the PlanMany mode (false: its columns read 0; for profiling)");
ABSL_FLAG(int64_t, per_call, 8, "PlanMany: requests per call, 1 to 256");
ABSL_FLAG(int64_t, many_window, 1, "PlanMany: calls in flight, 1 to 64");

namespace {

namespace v1 = flashcp::v1;
namespace core = flashcp::core;
namespace tt = flashcp::tests::testing;
using Clock = std::chrono::steady_clock;

// utime + stime of every thread of `pid`, seconds (/proc/PID/stat fields 14
// and 15, clock ticks); -1 if unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU time of each live thread of `pid` summed by thread name (comm),
// seconds: /proc/PID/task/TID/schedstat's first field (nanoseconds on CPU).
// Threads that exited in between are missing: the breakdown, not the total.
std::map<std::string, double> ThreadCpuByName(pid_t pid) {
  std::map<std::string, double> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat(dir, "/", e->d_name, "/comm"));
    std::ifstream sched(absl::StrCat(dir, "/", e->d_name, "/schedstat"));
    std::string name;
    double ns = 0;
    if (std::getline(comm, name) && sched >> ns) out[name] += 1e-9 * ns;
  }
  closedir(d);
  return out;
}

// Seconds the live threads of `pid` have run: /proc/PID/task/TID/schedstat's
// first field (nanoseconds on a CPU), summed.
double ThreadsRunSeconds(pid_t pid) {
  double total = 0;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(absl::StrCat(dir, "/", e->d_name, "/schedstat"));
    double run = 0;
    if (in >> run) total += 1e-9 * run;
  }
  closedir(d);
  return total;
}

// after - before per name, microseconds per plan, "name us, ..." largest first.
std::string ThreadBreakdown(const std::map<std::string, double>& before,
                            const std::map<std::string, double>& after, double plans) {
  std::vector<std::pair<double, std::string>> parts;
  for (const auto& [name, seconds] : after) {
    auto it = before.find(name);
    const double us = 1e6 * (seconds - (it == before.end() ? 0.0 : it->second)) / plans;
    if (us >= 0.5) parts.emplace_back(us, name);
  }
  std::sort(parts.rbegin(), parts.rend());
  std::vector<std::string> text;
  for (const auto& [us, name] : parts) text.push_back(absl::StrCat(name, " ", std::lround(us)));
  return absl::StrJoin(text, ", ");
}

struct Cell {
  core::Dataset dataset;
  int64_t context;
  int32_t n;
};

struct Figures {
  double cpu_us_per_plan = 0;  // in process: this thread; service: the server process
  double p50_ms = 0, p99_ms = 0;
  double plans_per_second = 0;
  int64_t errors = 0;
  std::string threads;  // the service: CPU us per plan by server thread name
  // The tail in CPU time, beside the wall time's: in process, percentiles
  // of each call's thread CPU time; unary, of the CPU time the server's
  // threads ran while each call was in flight (schedstat; it includes the
  // server's idle housekeeping, microseconds).
  double own_p50_ms = 0, own_p99_ms = 0;
};

std::vector<v1::PlanRequest> Requests(const Cell& cell, core::Strategy strategy, int64_t count) {
  std::vector<v1::PlanRequest> out;
  absl::StatusOr<std::vector<std::vector<int64_t>>> docs =
      core::SampleBatches(cell.dataset, cell.context, count, 1);
  if (!docs.ok()) return out;
  for (size_t i = 0; i < docs->size(); ++i) {
    out.push_back(flashcp::proto::RequestToProto(i, core::Batch{(*docs)[i], cell.n}, strategy,
                                                 core::PlanOptions{}, core::ModelShape{}, false));
  }
  return out;
}

// One mode's totals over the timed passes.
struct Tally {
  double cpu_seconds = 0;  // in process: this thread's; service: the server's (schedstat)
  double wall_seconds = 0;
  int64_t plans = 0;
  int64_t errors = 0;
  std::vector<double> ms, own_ms;          // per call: wall time; CPU time (Figures)
  std::map<std::string, double> threads;  // service: server CPU seconds by thread name

  Figures Summary() const {
    Figures f;
    const double n = static_cast<double>(std::max<int64_t>(plans, 1));
    f.cpu_us_per_plan = 1e6 * cpu_seconds / n;
    f.plans_per_second = wall_seconds > 0 ? static_cast<double>(plans) / wall_seconds : 0;
    f.errors = errors;
    f.threads = ThreadBreakdown({}, threads, n);
    if (!ms.empty()) {
      f.p50_ms = core::Percentile(ms, 0.5);
      f.p99_ms = core::Percentile(ms, 0.99);
    }
    if (!own_ms.empty()) {
      f.own_p50_ms = core::Percentile(own_ms, 0.5);
      f.own_p99_ms = core::Percentile(own_ms, 0.99);
    }
    return f;
  }
};

// Runs `pass` (which plans `plans` batches through the server) and adds the
// server's CPU time over it, by thread name (schedstat, nanoseconds), and
// its wall time to `tally`.
template <typename Pass>
void TimeServerPass(pid_t pid, int64_t plans, Tally& tally, Pass pass) {
  const std::map<std::string, double> before = ThreadCpuByName(pid);
  const Clock::time_point t0 = Clock::now();
  pass();
  tally.wall_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  for (const auto& [name, seconds] : ThreadCpuByName(pid)) {
    auto it = before.find(name);
    const double d = seconds - (it == before.end() ? 0.0 : it->second);
    tally.threads[name] += d;
    tally.cpu_seconds += d;
  }
  tally.plans += plans;
}

// One pass in process; recorded in `tally` unless null (warm-up).
void InProcessPass(const std::vector<v1::PlanRequest>& requests, Tally* tally) {
  core::RealClock clock;
  flashcp::planner_service::NullObserver observer;
  const Clock::time_point start = Clock::now();
  for (const v1::PlanRequest& r : requests) {
    const double c0 = flashcp::bench::ThreadCpuSeconds();
    const Clock::time_point t0 = Clock::now();
    bool ok = false;
    {
      absl::StatusOr<flashcp::proto::PlanInput> input =
          flashcp::proto::RequestFromProto(r, core::BatchLimits{});
      absl::StatusOr<v1::PlanResponse> response =
          input.ok() ? flashcp::proto::PlanBatch(*input, clock, observer)
                     : absl::StatusOr<v1::PlanResponse>(input.status());
      absl::StatusOr<std::string> bytes =
          response.ok() ? flashcp::proto::SerializeResponse(*response)
                        : absl::StatusOr<std::string>(response.status());
      ok = bytes.ok();
    }  // freed inside the timing, as the server frees its own
    if (tally == nullptr) continue;
    tally->ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    tally->own_ms.push_back(1e3 * (flashcp::bench::ThreadCpuSeconds() - c0));
    tally->cpu_seconds += 1e-3 * tally->own_ms.back();
    if (!ok) ++tally->errors;
  }
  if (tally == nullptr) return;
  tally->plans += static_cast<int64_t>(requests.size());
  tally->wall_seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// One pass of unary Plan calls, one at a time; each call's wall time and the
// server's CPU time while it was in flight go to `tally` unless null.
void UnaryPass(v1::Planner::Stub& stub, pid_t pid, const std::vector<v1::PlanRequest>& requests,
               Tally* tally) {
  for (const v1::PlanRequest& r : requests) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::PlanResponse response;
    const double q0 = tally == nullptr ? 0 : ThreadsRunSeconds(pid);
    const Clock::time_point t0 = Clock::now();
    const grpc::Status st = stub.Plan(&context, r, &response);
    const Clock::time_point t1 = Clock::now();
    if (tally == nullptr) continue;
    const double q1 = ThreadsRunSeconds(pid);
    tally->ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    tally->own_ms.push_back(1e3 * (q1 - q0));
    if (!st.ok() || response.has_error()) ++tally->errors;
  }
}

// One pass of `requests` over one PlanStream, `window` in flight; the count
// of answers with an error.
int64_t StreamPass(v1::Planner::Stub& stub, const std::vector<v1::PlanRequest>& requests,
                   int64_t window) {
  grpc::ClientContext context;
  auto stream = stub.PlanStream(&context);
  absl::Mutex mu;
  struct Window {
    int64_t in_flight = 0;
    int64_t limit = 0;
    bool Open() const { return in_flight < limit; }
  } w{0, window};
  std::atomic<int64_t> errors{0};
  std::thread reader([&] {
    v1::PlanResponse response;
    for (size_t got = 0; got < requests.size() && stream->Read(&response); ++got) {
      if (response.has_error()) errors.fetch_add(1);
      absl::MutexLock lock(&mu);
      --w.in_flight;
    }
  });
  for (const v1::PlanRequest& r : requests) {
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&w, &Window::Open));
      ++w.in_flight;
    }
    if (!stream->Write(r)) break;
  }
  stream->WritesDone();
  reader.join();
  if (!stream->Finish().ok()) errors.fetch_add(1);
  return errors.load();
}

// The pool's requests as PlanMany calls of `per_call` (the last takes what
// is left), in order.
std::vector<v1::PlanManyRequest> ManyCalls(const std::vector<v1::PlanRequest>& requests,
                                           int64_t per_call) {
  std::vector<v1::PlanManyRequest> calls;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % static_cast<size_t>(per_call) == 0) calls.emplace_back();
    *calls.back().add_requests() = requests[i];
  }
  return calls;
}

// The plans of `call` that `answer` (null: the call failed) does not answer
// with a plan.
int64_t ManyErrors(const v1::PlanManyRequest& call, const v1::PlanManyResponse* answer) {
  if (answer == nullptr || answer->responses_size() != call.requests_size()) {
    return call.requests_size();
  }
  int64_t errors = 0;
  for (const v1::PlanResponse& r : answer->responses()) errors += r.has_error() ? 1 : 0;
  return errors;
}

// One pass of PlanMany calls, `window` in flight (gRPC's async stub); the
// count of plans not answered with a plan.
int64_t ManyPassInFlight(v1::ManyPlanner::Stub& stub,
                         const std::vector<v1::PlanManyRequest>& calls, int64_t window) {
  struct Call {
    grpc::ClientContext context;
    v1::PlanManyResponse answer;
  };
  struct State {
    int64_t in_flight = 0;
    int64_t limit = 0;
    int64_t errors = 0;
    size_t done = 0;
    size_t total = 0;
    bool Open() const { return in_flight < limit; }
    bool AllDone() const { return done == total; }
  };
  std::vector<std::unique_ptr<Call>> slots(calls.size());
  absl::Mutex mu;
  State state{0, window, 0, 0, calls.size()};
  for (size_t i = 0; i < calls.size(); ++i) {
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&state, &State::Open));
      ++state.in_flight;
    }
    slots[i] = std::make_unique<Call>();
    slots[i]->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stub.async()->PlanMany(&slots[i]->context, &calls[i], &slots[i]->answer,
                           [&, i](grpc::Status status) {
                             const int64_t e = ManyErrors(
                                 calls[i], status.ok() ? &slots[i]->answer : nullptr);
                             absl::MutexLock lock(&mu);
                             state.errors += e;
                             --state.in_flight;
                             ++state.done;
                           });
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&state, &State::AllDone));
  return state.errors;
}

// One pass of PlanMany calls, one at a time (client::ManyPlannerClient), or
// `window` in flight; the count of plans not answered with a plan.
int64_t ManyPass(const flashcp::client::ManyPlannerClient& client, v1::ManyPlanner::Stub& stub,
                 const std::vector<v1::PlanManyRequest>& calls, int64_t window) {
  if (window > 1) return ManyPassInFlight(stub, calls, window);
  int64_t errors = 0;
  for (const v1::PlanManyRequest& call : calls) {
    const absl::StatusOr<v1::PlanManyResponse> answer =
        client.PlanMany(call, flashcp::client::CallOptions{absl::Seconds(60)});
    errors += ManyErrors(call, answer.ok() ? &*answer : nullptr);
  }
  return errors;
}

}  // namespace

int main(int argc, char** argv) {
  core::CommandLine line;
  if (std::optional<int> rc = core::ParseMain(
          argc, argv,
          "Usage: service_overhead [--flag=value ...]\n\nThe planner service against the "
          "in-process planner on the same batches.",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  absl::StatusOr<int64_t> batches = core::IntFlagIn("batches", absl::GetFlag(FLAGS_batches), 1, 10000);
  absl::StatusOr<int64_t> passes = core::IntFlagIn("passes", absl::GetFlag(FLAGS_passes), 1, 1000);
  absl::StatusOr<int64_t> window = core::IntFlagIn("window", absl::GetFlag(FLAGS_window), 1, 4096);
  absl::StatusOr<int64_t> per_call = core::IntFlagIn(
      "per_call", absl::GetFlag(FLAGS_per_call), 1, flashcp::planner_service::kMaxPlansPerCall);
  absl::StatusOr<int64_t> many_window =
      core::IntFlagIn("many_window", absl::GetFlag(FLAGS_many_window), 1, 64);
  for (const absl::Status& s : {batches.status(), passes.status(), window.status(),
                                per_call.status(), many_window.status()}) {
    if (!s.ok()) return core::UsageError("service_overhead", s, std::cerr);
  }
  absl::StatusOr<core::Strategy> strategy = core::ParseStrategy(absl::GetFlag(FLAGS_strategy));
  if (!strategy.ok()) return core::UsageError("service_overhead", strategy.status(), std::cerr);
  std::vector<Cell> cells;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_cells), ',')) {
    std::vector<absl::string_view> p = absl::StrSplit(text, ':');
    Cell c{};
    absl::StatusOr<core::Dataset> d =
        p.size() == 3 ? core::ParseDataset(p[0]) : absl::StatusOr<core::Dataset>(absl::InvalidArgumentError(""));
    if (!d.ok() || !absl::SimpleAtoi(p[1], &c.context) || !absl::SimpleAtoi(p[2], &c.n) ||
        c.context < 1 || c.n < 1 || c.n > c.context) {
      return core::UsageError("service_overhead",
                              core::FlagValueError("cells", "DATASET:CONTEXT:N", text), std::cerr);
    }
    c.dataset = *d;
    cells.push_back(c);
  }
  auto planner = tt::PlannerProcess::Start(absl::GetFlag(FLAGS_planner_bin),
                                           absl::GetFlag(FLAGS_planner_args));
  if (!planner.ok()) {
    std::fprintf(stderr, "service_overhead: %s\n", planner.status().ToString().c_str());
    return 1;
  }
  const pid_t pid = (*planner)->process().pid();
  const std::shared_ptr<grpc::Channel> channel = Channel((*planner)->grpc_address());
  auto stub = v1::Planner::NewStub(channel);
  const flashcp::client::ManyPlannerClient many_client(channel);
  auto many_stub = v1::ManyPlanner::NewStub(channel);
  std::printf(
      "%s, %lld batches per cell (seed 1), %lld passes after a warm-up pass, the modes "
      "interleaved pass by pass; planner %s. CPU/plan: in process the calling thread's CPU "
      "time, service the server process's (its live threads' schedstat run time over each "
      "timed pass). Targets: service CPU/plan <= 1.3 x in process; p99 <= 3 x p50.\n\n"
      "| data set | C | N | in-process CPU/plan us | p50 ms | p99 ms | unary: server CPU/plan us "
      "| / in process | p50 ms | p99 ms | p99 / p50 | plans/s | stream: server CPU/plan us | "
      "/ in process | plans/s | many (%lld a call, %lld in flight): server CPU/plan us | "
      "/ in process | plans/s "
      "| errors |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
      "| --- | --- | --- | --- |\n",
      absl::GetFlag(FLAGS_strategy).c_str(), static_cast<long long>(*batches),
      static_cast<long long>(*passes),
      absl::StrJoin(absl::GetFlag(FLAGS_planner_args), " ").c_str(),
      static_cast<long long>(*per_call), static_cast<long long>(*many_window));
  int rc = 0;
  std::vector<std::string> breakdown, tails;
  for (const Cell& c : cells) {
    const std::vector<v1::PlanRequest> requests = Requests(c, *strategy, *batches);
    const int64_t n = static_cast<int64_t>(requests.size());
    const std::vector<v1::PlanManyRequest> calls = ManyCalls(requests, *per_call);
    const bool unary = absl::GetFlag(FLAGS_unary), stream = absl::GetFlag(FLAGS_stream),
               many = absl::GetFlag(FLAGS_many);
    Tally in_t, un_t, st_t, mn_t;
    // The warm-up pass, then the timed passes with the modes interleaved pass
    // by pass, so that the machine's load drifts over all of them alike.
    InProcessPass(requests, nullptr);
    if (unary) UnaryPass(*stub, pid, requests, nullptr);
    if (stream) st_t.errors += StreamPass(*stub, requests, *window);
    if (many) mn_t.errors += ManyPass(many_client, *many_stub, calls, *many_window);
    const double stat0 = ProcessCpuSeconds(pid);
    for (int64_t pass = 0; pass < *passes; ++pass) {
      InProcessPass(requests, &in_t);
      if (unary) TimeServerPass(pid, n, un_t, [&] { UnaryPass(*stub, pid, requests, &un_t); });
      if (stream) {
        TimeServerPass(pid, n, st_t, [&] { st_t.errors += StreamPass(*stub, requests, *window); });
      }
      if (many) {
        TimeServerPass(pid, n, mn_t, [&] {
          mn_t.errors += ManyPass(many_client, *many_stub, calls, *many_window);
        });
      }
    }
    const double stat_seconds = ProcessCpuSeconds(pid) - stat0;
    const double schedstat_seconds = un_t.cpu_seconds + st_t.cpu_seconds + mn_t.cpu_seconds;
    const Figures in = in_t.Summary(), un = un_t.Summary(), st = st_t.Summary(),
                  mn = mn_t.Summary();
    const int64_t errors = in.errors + un.errors + st.errors + mn.errors;
    if (errors != 0) rc = 1;
    std::printf("| %s | %lld | %d | %.0f | %.3f | %.3f | %.0f | %.2f | %.3f | %.3f | %.2f | %.0f "
                "| %.0f | %.2f | %.0f | %.0f | %.2f | %.0f | %lld |\n",
                std::string(core::DatasetName(c.dataset)).c_str(),
                static_cast<long long>(c.context), c.n, in.cpu_us_per_plan, in.p50_ms, in.p99_ms,
                un.cpu_us_per_plan, un.cpu_us_per_plan / in.cpu_us_per_plan, un.p50_ms, un.p99_ms,
                un.p99_ms / un.p50_ms, un.plans_per_second, st.cpu_us_per_plan,
                st.cpu_us_per_plan / in.cpu_us_per_plan, st.plans_per_second,
                mn.cpu_us_per_plan, mn.cpu_us_per_plan / in.cpu_us_per_plan, mn.plans_per_second,
                static_cast<long long>(errors));
    std::fflush(stdout);
    breakdown.push_back(absl::StrCat("| ", core::DatasetName(c.dataset), " | ", c.context, " | ",
                                     c.n, " | ", un.threads, " | ", st.threads, " | ",
                                     mn.threads, " | ",
                                     absl::StrFormat("%.3f / %.3f", schedstat_seconds,
                                                     stat_seconds),
                                     " |\n"));
    tails.push_back(absl::StrFormat(
        "| %s | %d | %d | %.3f / %.3f (%.2f) | %.3f / %.3f (%.2f) | %.3f / %.3f (%.2f) | %.3f / "
        "%.3f (%.2f) |\n",
        core::DatasetName(c.dataset), c.context, c.n, in.p50_ms, in.p99_ms,
        in.p99_ms / in.p50_ms, in.own_p50_ms, in.own_p99_ms, in.own_p99_ms / in.own_p50_ms,
        un.p50_ms, un.p99_ms, un.p99_ms / un.p50_ms, un.own_p50_ms, un.own_p99_ms,
        un.own_p99_ms / un.own_p50_ms));
  }
  std::printf("\nServer CPU us per plan by thread name (/proc/PID/task/TID/schedstat; live "
              "threads only), and the server's CPU seconds over the timed passes, the schedstat "
              "sum the table uses against /proc/PID/stat (which also counts threads that exited; "
              "10 ms ticks):\n\n| data set | C | N | unary | stream | many | schedstat / stat s "
              "|\n| --- | --- | --- | --- | --- | --- | --- |\n%s",
              absl::StrJoin(breakdown, "").c_str());
  std::printf("\nTails, p50 / p99 ms (p99 / p50): in process wall time and thread CPU time; "
              "unary wall time and the server's CPU time during the call (all its threads, "
              "schedstat):\n\n| data set | C | N | in process wall | in "
              "process CPU | unary wall | unary server CPU |\n| --- | --- | --- | --- | "
              "--- | --- | --- |\n%s",
              absl::StrJoin(tails, "").c_str());
  const absl::StatusOr<int> exit_code = (*planner)->Terminate();
  if (!exit_code.ok() || *exit_code != 0) rc = 1;
  return rc;
}
