// planner_soak: one real flashcp-planner on loopback under an abuse mix while
// a well-behaved client plans, bounded in time (docs/benchmarks.md, "Planner
// under abuse (soak)"; issue 12). Phases: --baseline_s of well-behaved plans
// alone, then --attack_s of the same with every --abuse part running, then
// the parts stop and the planner must still answer. Reports the well-behaved
// p50/p99 without and under attack, their answers by code, the planner's peak
// RSS (VmHWM in /proc/PID/status) against --rss_ceiling_mib, and what each
// abuse part did. Exit 0 when the planner survived, no well-behaved request
// went unanswered (DEADLINE_EXCEEDED, UNAVAILABLE or CANCELLED: the planner
// never answered it) and the peak RSS stayed under the ceiling; 1 otherwise;
// 2 for a bad flag. Latencies are reported, not judged.
//
// Abuse parts (--abuse, comma-separated; each its own thread(s), each loop
// bounded by the attack phase):
//   idle        --idle_connections silent TCP connections, reopened when closed
//   noread      a PlanStream that writes large-answer items and never reads
//   oversized   unary requests just above --max_message_bytes
//   malformed   unary requests of bytes that are not a PlanRequest
//   utf8        unary requests with invalid UTF-8 in `strategy`
//   rdv_repeat  a member's Rendezvous.Gets naming one 256 KiB value --rdv_repeats
//               times, and Gets of 16 distinct 256 KiB values (4 MiB)
//   ilp         unary ilp plans of 100 documents
//   streams     --streams PlanStreams, each keeping 64 items in flight
//
//   build/bin/planner_soak --planner_bin build/bin/flashcp-planner
//       [--baseline_s 10 --attack_s 30 --abuse idle,noread,...] [--json]
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/cli.h"
#include "core/flags.h"
#include "flashcp/v1/planner.grpc.pb.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/grpc_probes.h"
#include "tests/testing/idle_connections.h"
#include "tests/testing/planner_process.h"

ABSL_FLAG(std::string, planner_bin, "build/bin/flashcp-planner", "the flashcp-planner binary");
ABSL_FLAG(std::vector<std::string>, planner_args, {},
          "extra flags for the planner, comma-separated (e.g. --threads=2)");
ABSL_FLAG(double, baseline_s, 10, "seconds of well-behaved plans without attack");
ABSL_FLAG(double, attack_s, 30, "seconds of well-behaved plans under attack");
ABSL_FLAG(std::string, abuse, "idle,noread,oversized,malformed,utf8,rdv_repeat,ilp,streams",
          "abuse parts to run (see the header); empty for none");
ABSL_FLAG(int32_t, idle_connections, 500, "idle: silent connections held");
ABSL_FLAG(int32_t, streams, 16, "streams: PlanStreams kept busy");
ABSL_FLAG(int32_t, rdv_repeats, 64, "rdv_repeat: times one key is named in a Get");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20,
          "the planner's --max_message_bytes (oversized sends one byte more)");
ABSL_FLAG(int64_t, rss_ceiling_mib, 2048, "the planner's peak RSS must stay below this");
ABSL_FLAG(bool, json, false, "one JSON object instead of the text report");

namespace {

namespace v1 = flashcp::v1;
namespace tt = flashcp::tests::testing;
using Clock = std::chrono::steady_clock;

constexpr absl::Duration kCallTimeout = absl::Seconds(60);  // well-behaved deadline

const std::set<std::string> kParts = {"idle",       "noread", "oversized", "malformed", "utf8",
                                      "rdv_repeat", "ilp",    "streams"};

// The well-behaved client's batch: 24 documents, 64K tokens, cp 8, flashcp.
v1::PlanRequest GoodRequest(uint64_t id) {
  v1::PlanRequest r;
  r.set_batch_id(id);
  for (int i = 0; i < 24; ++i) r.add_doc_lens(1000 + 2731 * ((i * 7 + 3) % 11) % 6000);
  r.set_cp_size(8);
  r.set_strategy("flashcp");
  return r;
}

struct GoodStats {
  std::vector<double> latency_ms;         // OK answers
  std::map<std::string, int64_t> codes;   // every answer and non-answer, by code
  int64_t sent = 0;
  int64_t lost = 0;  // DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED: never answered
};

bool Unanswered(grpc::StatusCode c) {
  return c == grpc::StatusCode::DEADLINE_EXCEEDED || c == grpc::StatusCode::UNAVAILABLE ||
         c == grpc::StatusCode::CANCELLED;
}

// Sequential unary plans on `channel` for `seconds`.
GoodStats RunGood(const std::shared_ptr<grpc::Channel>& channel, double seconds) {
  auto stub = v1::Planner::NewStub(channel);
  GoodStats s;
  const Clock::time_point end =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  while (Clock::now() < end) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    v1::PlanResponse response;
    const Clock::time_point t0 = Clock::now();
    const grpc::Status st = stub->Plan(&context, GoodRequest(s.sent), &response);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    ++s.sent;
    ++s.codes[absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code()))];
    if (st.ok()) {
      s.latency_ms.push_back(ms);
    } else if (Unanswered(st.error_code())) {
      ++s.lost;
    }
  }
  return s;
}

// What one abuse part did: calls made, by the code they ended with.
struct PartStats {
  absl::Mutex mu;
  std::map<std::string, int64_t> codes ABSL_GUARDED_BY(mu);
  void Add(const std::string& code) {
    absl::MutexLock lock(&mu);
    ++codes[code];
  }
  std::string Summary() {
    absl::MutexLock lock(&mu);
    std::vector<std::string> parts;
    for (const auto& [c, n] : codes) parts.push_back(absl::StrCat(c, " ", n));
    return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
  }
};

std::string CodeName(const grpc::Status& s) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code()));
}

// A unary call of `bytes` as they are to `method`.
grpc::Status RawUnary(grpc::GenericStub& stub, const std::string& method, const std::string& bytes) {
  grpc::Slice slice(bytes);
  return tt::RawUnaryCall(stub, method, grpc::ByteBuffer(&slice, 1),
                          absl::Now() + absl::Seconds(30));
}

// A channel with its own connection (gRPC shares one between channels to a
// target otherwise), with room for large messages.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

class Abuse {
 public:
  explicit Abuse(std::string address) : address_(std::move(address)) {}

  void Start(const std::string& part) {
    PartStats* stats = &stats_[part];
    if (part == "idle") {
      threads_.emplace_back([this, stats] { Idle(stats); });
    } else if (part == "noread") {
      threads_.emplace_back([this, stats] { NoRead(stats); });
    } else if (part == "oversized") {
      v1::PlanRequest r = GoodRequest(0);  // well-formed; only its size is wrong
      r.set_strategy(std::string(static_cast<size_t>(absl::GetFlag(FLAGS_max_message_bytes)), 'x'));
      Loop(stats, "/flashcp.v1.Planner/Plan", r.SerializeAsString(), 1);
    } else if (part == "malformed") {
      Loop(stats, "/flashcp.v1.Planner/Plan", std::string("\xff\xff\xff\xff\x0f garbage", 14), 2);
    } else if (part == "utf8") {
      Loop(stats, "/flashcp.v1.Planner/Plan",
           GoodRequest(0).SerializeAsString() + std::string("\x22\x02\xff\xfe", 4), 2);
    } else if (part == "rdv_repeat") {
      threads_.emplace_back([this, stats] { RendezvousRepeat(stats); });
    } else if (part == "ilp") {
      v1::PlanRequest r;
      for (int i = 0; i < 100; ++i) r.add_doc_lens(500 + (i * 7919) % 4000);
      r.set_cp_size(8);
      r.set_strategy("ilp");
      Loop(stats, "/flashcp.v1.Planner/Plan", r.SerializeAsString(), 1);
    } else if (part == "streams") {
      for (int i = 0; i < absl::GetFlag(FLAGS_streams); ++i) {
        threads_.emplace_back([this, stats] { BusyStream(stats); });
      }
    }
  }

  void Stop() {
    stop_.store(true);
    {
      absl::MutexLock lock(&mu_);
      for (grpc::ClientContext* c : contexts_) c->TryCancel();
    }
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  std::map<std::string, PartStats>& stats() { return stats_; }

 private:
  // Registers a context so that Stop can cancel a blocked call.
  void Track(grpc::ClientContext* c, bool add) {
    absl::MutexLock lock(&mu_);
    if (add) {
      contexts_.insert(c);
      if (stop_.load()) c->TryCancel();
    } else {
      contexts_.erase(c);
    }
  }

  void Loop(PartStats* stats, std::string method, std::string bytes, int threads) {
    auto shared = std::make_shared<const std::string>(std::move(bytes));
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, stats, method, shared] {
        grpc::GenericStub stub(OwnChannel(address_));
        while (!stop_.load()) stats->Add(CodeName(RawUnary(stub, method, *shared)));
      });
    }
  }

  void Idle(PartStats* stats) {
    tt::IdleConnections held;
    while (!stop_.load()) {
      // Reopen what the planner closed (its handshake timeout): a fresh set
      // each round, up to the count.
      tt::IdleConnections round;
      const absl::Status s = round.Open(address_, absl::GetFlag(FLAGS_idle_connections),
                                        absl::Now() + absl::Seconds(5));
      stats->Add(s.ok() ? "OPENED" : absl::StatusCodeToString(s.code()));
      held = std::move(round);
      for (int i = 0; i < 20 && !stop_.load(); ++i) absl::SleepFor(absl::Milliseconds(100));
    }
  }

  void NoRead(PartStats* stats) {
    auto stub = v1::Planner::NewStub(OwnChannel(address_));
    grpc::ClientContext context;
    Track(&context, true);
    auto stream = stub->PlanStream(&context);
    v1::PlanRequest r;
    for (int i = 0; i < 2000; ++i) r.add_doc_lens(64 + i % 50);
    r.set_cp_size(64);
    r.set_strategy("per_doc");
    r.set_include_layout(true);
    int64_t written = 0;
    while (!stop_.load()) {
      r.set_batch_id(static_cast<uint64_t>(written));
      if (!stream->Write(r)) break;  // blocks once flow control is full
      ++written;
    }
    stats->Add(absl::StrCat("WRITTEN"));
    Track(&context, false);
    context.TryCancel();
    stats->Add(CodeName(stream->Finish()));
  }

  void BusyStream(PartStats* stats) {
    auto stub = v1::Planner::NewStub(OwnChannel(address_));
    grpc::ClientContext context;
    Track(&context, true);
    auto stream = stub->PlanStream(&context);
    std::atomic<int64_t> in_flight{0};
    std::thread reader([&] {
      v1::PlanResponse response;
      while (stream->Read(&response)) {
        in_flight.fetch_sub(1);
        stats->Add(response.has_error() ? "ITEM_ERROR" : "ITEM_OK");
      }
    });
    int64_t id = 0;
    while (!stop_.load()) {
      if (in_flight.load() >= 64) {
        absl::SleepFor(absl::Microseconds(200));
        continue;
      }
      in_flight.fetch_add(1);
      if (!stream->Write(GoodRequest(static_cast<uint64_t>(id++)))) break;
    }
    stream->WritesDone();
    Track(&context, false);
    context.TryCancel();
    reader.join();
    stats->Add(CodeName(stream->Finish()));
  }

  // A member's Gets that name one 256 KiB value --rdv_repeats times, and
  // Gets of 16 distinct 256 KiB values (4 MiB, over the per-Get bound).
  void RendezvousRepeat(PartStats* stats) {
    auto stub = v1::Rendezvous::NewStub(OwnChannel(address_));
    const std::string group = "soak-rdv";
    constexpr int kKeys = 16;
    std::string token;
    {
      grpc::ClientContext c;
      v1::JoinRequest j;
      j.set_group(group);
      j.set_rank(0);
      j.set_world_size(1);
      j.set_incarnation(1);
      v1::JoinResponse jr;
      stats->Add(absl::StrCat("join ", CodeName(stub->Join(&c, j, &jr))));
      token = jr.token();
    }
    for (int k = 0; k < kKeys; ++k) {
      grpc::ClientContext c;
      v1::SetRequest s;
      s.set_group(group);
      s.set_token(token);
      s.set_key(absl::StrCat("k", k));
      s.set_value(std::string(256 << 10, 'v'));
      v1::SetResponse sr;
      stats->Add(absl::StrCat("set ", CodeName(stub->Set(&c, s, &sr))));
    }
    v1::GetRequest repeated;
    repeated.set_group(group);
    repeated.set_token(token);
    for (int i = 0; i < absl::GetFlag(FLAGS_rdv_repeats); ++i) repeated.add_keys("k0");
    repeated.set_timeout_ms(1000);
    v1::GetRequest all = repeated;
    all.clear_keys();
    for (int k = 0; k < kKeys; ++k) all.add_keys(absl::StrCat("k", k));
    for (uint64_t n = 0; !stop_.load(); ++n) {
      grpc::ClientContext c;
      c.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      v1::GetResponse gr;
      const bool rep = n % 2 == 0;
      stats->Add(absl::StrCat(rep ? "repeated " : "4 MiB ",
                              CodeName(stub->Get(&c, rep ? repeated : all, &gr))));
    }
  }

  const std::string address_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::map<std::string, PartStats> stats_;
  absl::Mutex mu_;
  std::set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

// One plan on a fresh connection: whether it was answered OK.
bool ServedOnce(const std::string& address) {
  auto stub = v1::Planner::NewStub(OwnChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  v1::PlanResponse response;
  return stub->Plan(&context, GoodRequest(0), &response).ok();
}

// VmHWM (peak resident set) of `pid`, MiB; -1 if unreadable.
double PeakRssMib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  return -1;
}

std::string CodesText(const std::map<std::string, int64_t>& codes) {
  std::vector<std::string> parts;
  for (const auto& [c, n] : codes) parts.push_back(absl::StrCat(c, " ", n));
  return absl::StrJoin(parts, ", ");
}

std::string CodesJson(const std::map<std::string, int64_t>& codes) {
  std::vector<std::string> parts;
  for (const auto& [c, n] : codes) parts.push_back(absl::StrCat("\"", c, "\":", n));
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

}  // namespace

int main(int argc, char** argv) {
  flashcp::core::CommandLine line;
  if (std::optional<int> rc = flashcp::core::ParseMain(
          argc, argv,
          "Usage: planner_soak [--flag=value ...]\n\nThe planner under an abuse mix while a "
          "well-behaved client plans.",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_abuse), ',', absl::SkipEmpty())) {
    if (kParts.count(std::string(p)) == 0) {
      std::fprintf(stderr, "planner_soak: --abuse: unknown part \"%s\" (%s)\n",
                   std::string(p).c_str(), absl::StrJoin(kParts, ", ").c_str());
      return 2;
    }
    parts.emplace_back(p);
  }
  std::vector<std::string> planner_args = absl::GetFlag(FLAGS_planner_args);
  planner_args.push_back(absl::StrCat("--max_message_bytes=", absl::GetFlag(FLAGS_max_message_bytes)));
  auto planner = tt::PlannerProcess::Start(absl::GetFlag(FLAGS_planner_bin), planner_args);
  if (!planner.ok()) {
    std::fprintf(stderr, "planner_soak: %s\n", planner.status().ToString().c_str());
    return 1;
  }
  const std::string address = (*planner)->grpc_address();
  const pid_t pid = (*planner)->process().pid();
  std::shared_ptr<grpc::Channel> good = OwnChannel(address);

  const GoodStats baseline = RunGood(good, absl::GetFlag(FLAGS_baseline_s));
  Abuse abuse(address);
  for (const std::string& p : parts) abuse.Start(p);
  const GoodStats attacked = RunGood(good, absl::GetFlag(FLAGS_attack_s));
  abuse.Stop();

  // Survival: a fresh connection is served and health says SERVING.
  const bool served_after = ServedOnce(address);
  const absl::StatusOr<tt::HealthStatus> health =
      tt::CheckHealth(OwnChannel(address), "", absl::Now() + absl::Seconds(30));
  const bool survived = served_after && health.ok() &&
                        *health == tt::HealthStatus::kServing;
  const double rss = PeakRssMib(pid);
  const int64_t ceiling = absl::GetFlag(FLAGS_rss_ceiling_mib);
  const absl::StatusOr<int> exit_code = (*planner)->Terminate();
  const bool clean_exit = exit_code.ok() && *exit_code == 0;
  const int64_t lost = baseline.lost + attacked.lost;
  const bool pass = survived && clean_exit && lost == 0 && rss >= 0 && rss < ceiling;

  using flashcp::core::Percentile;
  const std::string abuse_list = absl::StrJoin(parts, ",");
  if (absl::GetFlag(FLAGS_json)) {
    std::vector<std::string> per_part;
    for (auto& [name, s] : abuse.stats()) {
      absl::MutexLock lock(&s.mu);
      per_part.push_back(absl::StrCat("\"", name, "\":", CodesJson(s.codes)));
    }
    std::printf(
        "{\"abuse\":\"%s\",\"baseline\":{\"sent\":%ld,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
        "\"codes\":%s},\"attack\":{\"sent\":%ld,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"codes\":%s},"
        "\"lost\":%ld,\"survived\":%s,\"clean_exit\":%s,\"peak_rss_mib\":%.1f,"
        "\"rss_ceiling_mib\":%ld,\"parts\":{%s},\"pass\":%s}\n",
        abuse_list.c_str(), baseline.sent, Percentile(baseline.latency_ms, 0.5),
        Percentile(baseline.latency_ms, 0.99), CodesJson(baseline.codes).c_str(), attacked.sent,
        Percentile(attacked.latency_ms, 0.5), Percentile(attacked.latency_ms, 0.99),
        CodesJson(attacked.codes).c_str(), lost, survived ? "true" : "false",
        clean_exit ? "true" : "false", rss, ceiling, absl::StrJoin(per_part, ",").c_str(),
        pass ? "true" : "false");
  } else {
    std::printf("abuse: %s\n", abuse_list.empty() ? "(none)" : abuse_list.c_str());
    std::printf("well-behaved   sent     p50 ms     p99 ms   answers\n");
    std::printf("no attack    %6ld  %9.3f  %9.3f   %s\n", baseline.sent,
                Percentile(baseline.latency_ms, 0.5), Percentile(baseline.latency_ms, 0.99),
                CodesText(baseline.codes).c_str());
    std::printf("under attack %6ld  %9.3f  %9.3f   %s\n", attacked.sent,
                Percentile(attacked.latency_ms, 0.5), Percentile(attacked.latency_ms, 0.99),
                CodesText(attacked.codes).c_str());
    std::printf("p99 under attack / without: %.2f\n",
                Percentile(attacked.latency_ms, 0.99) /
                    std::max(1e-9, Percentile(baseline.latency_ms, 0.99)));
    std::printf("unanswered well-behaved requests: %ld\n", lost);
    std::printf("planner peak RSS: %.1f MiB (ceiling %ld MiB)\n", rss, ceiling);
    std::printf("after the attack: %s; health %s; exit %s\n",
                served_after ? "a new client is served" : "a new client is NOT served",
                health.ok() ? tt::HealthStatusName(*health) : health.status().ToString().c_str(),
                exit_code.ok() ? absl::StrCat(*exit_code).c_str() : exit_code.status().ToString().c_str());
    for (auto& [name, s] : abuse.stats()) std::printf("  %-11s %s\n", name.c_str(), s.Summary().c_str());
    std::printf("%s\n", pass ? "PASS" : "FAIL");
  }
  return pass ? 0 : 1;
}
