// flashcp-cpstep: one context-parallel attention step (forward + backward)
// across N real ranks, checked against the single-process reference.
//
//   echo "300,20,5,700" | flashcp-cpstep --cp 4 --strategy zigzag --scheme targeted
//       --heads 2 --head-dim 16 [--ranks threads|processes] [--seed 1]
//
// Prints one JSON object. max_rel_err.X is MaxRelError (attention_reference.h):
// max_i |got_i - want_i| / max(max_i |want_i|, 0.01) over the real tokens of
// the whole batch. Exit 0 when every error is within `tolerance` and every
// rank's bytes equal the plan analysis's prediction; 1 on a failed check or a
// failed step (the message on stderr); 2 on bad usage.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/analysis.h"
#include "core/strategies.h"
#include "worker/cpstep.h"
#include "worker/gloo_communicator.h"

namespace {

using namespace flashcp;  // NOLINT: a binary's main file

constexpr double kTolerance = 1e-4;  // fp32 engine vs double reference, every output

constexpr char kUsage[] =
    "usage: flashcp-cpstep --cp N --strategy S --scheme full_kv|allgather|targeted --heads H\n"
    "                      --head-dim D [--ranks threads|processes] [--seed S]\n"
    "                      [--threads-per-rank T] [--timeout-ms MS]\n"
    "reads one batch (document lengths, commas or spaces) from stdin\n";

struct Args {
  std::map<std::string, std::string> flags;
};

bool ParseArgs(int argc, char** argv, Args& args, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      error = absl::StrCat("unexpected argument \"", a, "\"");
      return false;
    }
    a = a.substr(2);
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      args.flags[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (i + 1 < argc) {
      args.flags[a] = argv[++i];
    } else {
      error = absl::StrCat("--", a, " needs a value");
      return false;
    }
  }
  static const char* kKnown[] = {"cp",          "strategy",      "scheme",  "heads",
                                 "head-dim",    "ranks",         "seed",    "threads-per-rank",
                                 "timeout-ms",  "fault",         "fault-rank", "internal-rank",
                                 "internal-dir"};
  for (const auto& [k, v] : args.flags) {
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown)) {
      error = absl::StrCat("unknown flag --", k);
      return false;
    }
  }
  return true;
}

template <typename T>
bool GetInt(const Args& args, const std::string& name, T& out, bool required, std::string& error) {
  auto it = args.flags.find(name);
  if (it == args.flags.end()) {
    if (required) error = absl::StrCat("--", name, " is required");
    return !required;
  }
  if (!absl::SimpleAtoi(it->second, &out)) {
    error = absl::StrCat("--", name, ": not an integer: \"", it->second, "\"");
    return false;
  }
  return true;
}

std::string Array(const std::vector<int64_t>& v) { return absl::StrCat("[", absl::StrJoin(v, ","), "]"); }

int Run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  Args args;
  std::string error;
  int32_t cp = 0, heads = 0, head_dim = 0, internal_rank = -1, fault_rank = -1;
  int64_t timeout_ms = 60000;
  uint64_t seed = 1;
  int threads_per_rank = 0;
  if (!ParseArgs(argc, argv, args, error) || !GetInt(args, "cp", cp, true, error) ||
      !GetInt(args, "heads", heads, true, error) ||
      !GetInt(args, "head-dim", head_dim, true, error) ||
      !GetInt(args, "seed", seed, false, error) ||
      !GetInt(args, "timeout-ms", timeout_ms, false, error) ||
      !GetInt(args, "threads-per-rank", threads_per_rank, false, error) ||
      !GetInt(args, "fault-rank", fault_rank, false, error) ||
      !GetInt(args, "internal-rank", internal_rank, false, error)) {
    std::cerr << "flashcp-cpstep: " << error << "\n" << kUsage;
    return 2;
  }
  const core::ModelShape model{heads, head_dim, 4};
  if (absl::Status s = core::ValidateModelShape(model); !s.ok() || cp < 1 || timeout_ms < 1) {
    std::cerr << "flashcp-cpstep: " << (s.ok() ? "--cp and --timeout-ms must be >= 1" : s.message())
              << "\n" << kUsage;
    return 2;
  }
  absl::StatusOr<core::Strategy> strategy = core::ParseStrategy(args.flags["strategy"]);
  absl::StatusOr<core::CommScheme> scheme = core::ParseCommScheme(args.flags["scheme"]);
  const std::string ranks = args.flags.count("ranks") ? args.flags["ranks"] : "threads";
  if (!strategy.ok() || !scheme.ok() || (ranks != "threads" && ranks != "processes")) {
    std::cerr << "flashcp-cpstep: "
              << (!strategy.ok()  ? strategy.status().message()
                  : !scheme.ok() ? scheme.status().message()
                                 : "--ranks must be threads or processes")
              << "\n" << kUsage;
    return 2;
  }
  worker::StepConfig config;
  config.shape = worker::AttentionShape{heads, head_dim,
                                        1.0f / std::sqrt(static_cast<float>(head_dim))};
  config.scheme = *scheme;
  config.timeout = absl::Milliseconds(timeout_ms);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  config.threads_per_rank = threads_per_rank > 0 ? threads_per_rank : std::max(1, hw / cp);
  if (args.flags.count("fault")) {
    const std::string& f = args.flags["fault"];
    config.fault.kind = f == "crash" ? worker::Fault::kCrash
                        : f == "hang" ? worker::Fault::kHang
                                      : worker::Fault::kNone;
    config.fault.rank = fault_rank;
  }
  if (internal_rank >= 0) {  // a rank process started by RunProcesses
    absl::Status s = worker::RankProcessMain(internal_rank, config, seed, args.flags["internal-dir"]);
    if (!s.ok()) std::cerr << "flashcp-cpstep rank " << internal_rank << ": " << s << "\n";
    return s.ok() ? 0 : 1;
  }

  const std::string text(std::istreambuf_iterator<char>(std::cin), {});
  std::vector<int64_t> lens;
  for (absl::string_view tok : absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    int64_t len = 0;
    if (!absl::SimpleAtoi(tok, &len)) {
      std::cerr << "flashcp-cpstep: bad document length \"" << tok << "\" on stdin\n";
      return 1;
    }
    lens.push_back(len);
  }
  absl::StatusOr<core::Plan> plan = core::MakePlan(*strategy, core::Batch{lens, cp});
  if (!plan.ok()) {
    std::cerr << "flashcp-cpstep: plan: " << plan.status() << "\n";
    return 1;
  }
  absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(*plan, model);
  if (!metrics.ok()) {
    std::cerr << "flashcp-cpstep: analysis: " << metrics.status() << "\n";
    return 1;
  }
  const worker::StepInputs inputs =
      worker::MakeInputs(core::TotalTokens(lens), config.shape, seed);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<worker::RankResult>> results;
  if (ranks == "threads") {
    results = worker::RunThreads(*plan, config, inputs);
  } else {
    std::vector<std::string> child = {"/proc/self/exe"};
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) child[0] = std::string(self, n);
    for (int i = 1; i < argc; ++i) child.push_back(argv[i]);
    results = worker::RunProcesses(*plan, config, child);
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  if (!results.ok()) {
    std::cerr << "flashcp-cpstep: step failed after " << absl::StrFormat("%.3f", wall)
              << " s: " << results.status() << "\n";
    return 1;
  }
  absl::StatusOr<worker::StepErrors> err =
      worker::CompareWithReference(*plan, config.shape, inputs, *results);
  if (!err.ok()) {
    std::cerr << "flashcp-cpstep: compare: " << err.status() << "\n";
    return 1;
  }
  std::vector<int64_t> sent, received;
  double seconds = 0.0;
  for (const worker::RankResult& r : *results) {
    sent.push_back(r.stats.bytes_sent);
    received.push_back(r.stats.bytes_received);
    seconds = std::max(seconds, r.seconds);
  }
  const core::SchemeBytes& predicted = metrics->bytes[static_cast<int>(*scheme)];
  const bool bytes_ok = sent == predicted.sent && received == predicted.received;
  const bool errors_ok = err->out <= kTolerance && err->lse <= kTolerance &&
                         err->dq <= kTolerance && err->dk <= kTolerance && err->dv <= kTolerance;
  std::cout << absl::StrFormat(
                   "{\"strategy\":\"%s\",\"scheme\":\"%s\",\"cp\":%d,\"heads\":%d,\"head_dim\":%d,"
                   "\"ranks\":\"%s\",\"tokens\":%d,\"docs\":%d,\"seed\":%d,"
                   "\"max_rel_err\":{\"out\":%.3e,\"lse\":%.3e,\"dq\":%.3e,\"dk\":%.3e,\"dv\":%.3e},"
                   "\"rel_err_definition\":\"max|got-ref| / max(max|ref|, 0.01) over real tokens\","
                   "\"tolerance\":%.1e,\"bytes_sent\":%s,\"bytes_received\":%s,"
                   "\"predicted_bytes_sent\":%s,\"predicted_bytes_received\":%s,"
                   "\"bytes_match\":%s,\"seconds\":%.6f,\"wall_seconds\":%.6f,\"ok\":%s}",
                   core::StrategyName(*strategy), core::CommSchemeName(*scheme), cp, heads,
                   head_dim, ranks, core::TotalTokens(lens), static_cast<int64_t>(lens.size()),
                   seed, err->out, err->lse, err->dq, err->dk, err->dv, kTolerance, Array(sent),
                   Array(received), Array(predicted.sent), Array(predicted.received),
                   bytes_ok ? "true" : "false", seconds, wall,
                   bytes_ok && errors_ok ? "true" : "false")
            << std::endl;
  if (!bytes_ok) std::cerr << "flashcp-cpstep: bytes moved differ from the plan analysis\n";
  if (!errors_ok) std::cerr << "flashcp-cpstep: an error exceeds the tolerance " << kTolerance << "\n";
  return bytes_ok && errors_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  flashcp::worker::IgnoreSigpipe();  // a dead peer fails the step, not this process
  return Run(argc, argv);
}
