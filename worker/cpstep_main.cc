// flashcp-cpstep: one context-parallel attention step (forward + backward)
// across N real ranks, checked against the single-process reference.
//
//   echo "300,20,5,700" | flashcp-cpstep --cp 4 --strategy zigzag --scheme targeted
//       --heads 2 --head_dim 16 [--ranks threads|processes] [--seed 1]
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
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/analysis.h"
#include "core/flags.h"
#include "core/mask.h"
#include "core/status_macros.h"
#include "core/strategies.h"
#include "worker/cpstep.h"
#include "worker/gloo_communicator.h"

ABSL_FLAG(int32_t, cp, 0, "ranks in the CP group (required)");
ABSL_FLAG(std::string, strategy, "", "the planning strategy (required)");
ABSL_FLAG(std::string, scheme, "", "the exchange: full_kv, allgather, targeted (KV) or all_to_all (heads; lse is not compared) (required)");
ABSL_FLAG(int32_t, heads, 0, "attention heads (required)");
ABSL_FLAG(int32_t, head_dim, 0, "head dimension (required)");
ABSL_FLAG(std::string, ranks, "threads", "ranks as threads or processes (fork/exec, Gloo TCP)");
ABSL_FLAG(std::string, attention_mask, "causal_document",
          "the attention mask: causal_document or block_diffusion (then the step runs the "
          "2C rows [noisy ; clean] of the batch; docs/bdlm.md)");
ABSL_FLAG(int64_t, block_size, 0, "block size b of --attention_mask=block_diffusion (>= 1)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random inputs");
ABSL_FLAG(int32_t, threads_per_rank, 0, "CPU threads per rank; 0: hardware threads / N");
ABSL_FLAG(int64_t, timeout_ms, 60000, "a rank's collective timeout, milliseconds");
ABSL_FLAG(std::string, fault, "", "tests: crash or hang one rank (--fault_rank); empty: none");
ABSL_FLAG(int32_t, fault_rank, -1, "tests: the rank --fault hits");
ABSL_FLAG(int32_t, internal_rank, -1,
          "internal: this process is that rank of a --ranks processes run");
ABSL_FLAG(std::string, internal_dir, "", "internal: the --ranks processes run's directory");

namespace {

using namespace flashcp;  // NOLINT: a binary's main file

constexpr double kTolerance = 1e-4;  // fp32 engine vs double reference, every output

constexpr char kUsage[] =
    "Usage: flashcp-cpstep --cp N --strategy S --scheme full_kv|allgather|targeted|all_to_all --heads H\n"
    "                      --head_dim D [--flag=value ...] < batch\n\n"
    "Reads one batch (document lengths, commas or spaces) from stdin, runs its step on N\n"
    "ranks and checks it against the reference. Exit status: 0 every check passed; 1 a\n"
    "failed check or step; 2 a bad flag.";

std::string Array(const std::vector<int64_t>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ","), "]");
}

// A required flag left at its default 0 or "".
absl::Status Required(const core::CommandLine& line, const char* flag) {
  if (line.given.count(flag) > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " is required"));
}

// The flags, checked: a usage error (exit 2) names the first bad one.
struct CpstepFlags {
  int32_t cp = 0, heads = 0, head_dim = 0;
  int32_t internal_rank = -1;
  int64_t timeout_ms = 0;
  uint64_t seed = 0;
  int32_t threads_per_rank = 0;
  core::Strategy strategy = core::Strategy::kFlashCp;
  core::CommScheme scheme = core::CommScheme::kTargeted;
  core::PlanOptions plan_options;  // the attention mask
  std::string ranks;  // threads or processes
  std::string fault;  // "", crash or hang
};

absl::StatusOr<CpstepFlags> ReadFlags(const core::CommandLine& line) {
  for (const char* flag : {"cp", "strategy", "scheme", "heads", "head_dim"}) {
    FLASHCP_RETURN_IF_ERROR(Required(line, flag));
  }
  CpstepFlags f;
  f.cp = absl::GetFlag(FLAGS_cp);
  f.heads = absl::GetFlag(FLAGS_heads);
  f.head_dim = absl::GetFlag(FLAGS_head_dim);
  f.internal_rank = absl::GetFlag(FLAGS_internal_rank);
  f.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  f.seed = absl::GetFlag(FLAGS_seed);
  f.threads_per_rank = absl::GetFlag(FLAGS_threads_per_rank);
  for (const absl::Status& s :
       {core::IntFlagIn("cp", f.cp, 1, core::kMaxCpSize).status(),
        core::IntFlagIn("timeout_ms", f.timeout_ms, 1, INT64_MAX).status(),
        core::IntFlagIn("threads_per_rank", f.threads_per_rank, 0, 4096).status(),
        core::ModelShapeFromFlags(f.heads, f.head_dim, 4).status()}) {
    FLASHCP_RETURN_IF_ERROR(s);
  }
  absl::StatusOr<core::Strategy> strategy = core::ParseStrategy(absl::GetFlag(FLAGS_strategy));
  if (!strategy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--strategy: ", strategy.status().message()));
  }
  f.strategy = *strategy;
  absl::StatusOr<core::MaskKind> kind = core::ParseMaskKind(absl::GetFlag(FLAGS_attention_mask));
  if (!kind.ok()) return absl::InvalidArgumentError(absl::StrCat("--", kind.status().message()));
  f.plan_options.attention_mask = {*kind, absl::GetFlag(FLAGS_block_size)};
  if (absl::Status s = core::ValidateAttentionMask(f.plan_options.attention_mask); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  absl::StatusOr<core::CommScheme> scheme = core::ParseCommScheme(absl::GetFlag(FLAGS_scheme));
  if (!scheme.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--scheme: ", scheme.status().message()));
  }
  f.scheme = *scheme;
  f.ranks = absl::GetFlag(FLAGS_ranks);
  if (f.ranks != "threads" && f.ranks != "processes") {
    return core::FlagValueError("ranks", "threads or processes", f.ranks);
  }
  f.fault = absl::GetFlag(FLAGS_fault);
  if (f.fault != "" && f.fault != "crash" && f.fault != "hang") {
    return core::FlagValueError("fault", "crash or hang", f.fault);
  }
  return f;
}

worker::StepConfig MakeConfig(const CpstepFlags& f) {
  worker::StepConfig config;
  config.shape = worker::AttentionShape{f.heads, f.head_dim,
                                        1.0f / std::sqrt(static_cast<float>(f.head_dim))};
  config.scheme = f.scheme;
  config.timeout = absl::Milliseconds(f.timeout_ms);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  config.threads_per_rank = f.threads_per_rank > 0 ? f.threads_per_rank : std::max(1, hw / f.cp);
  if (!f.fault.empty()) {
    config.fault.kind = f.fault == "crash" ? worker::Fault::kCrash : worker::Fault::kHang;
    config.fault.rank = absl::GetFlag(FLAGS_fault_rank);
  }
  return config;
}

// The batch on stdin: document lengths, commas or spaces.
absl::StatusOr<std::vector<int64_t>> ReadLengths(std::istream& in) {
  const std::string text(std::istreambuf_iterator<char>(in), {});
  std::vector<int64_t> lens;
  for (absl::string_view tok :
       absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    int64_t len = 0;
    if (!absl::SimpleAtoi(tok, &len)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad document length \"", tok, "\" on stdin"));
    }
    lens.push_back(len);
  }
  return lens;
}

// The step on `plan`'s ranks, as threads or as processes of this binary
// (re-run with the same arguments).
absl::StatusOr<std::vector<worker::RankResult>> RunStep(const CpstepFlags& f,
                                                        const core::Plan& plan,
                                                        const worker::StepConfig& config,
                                                        const worker::StepInputs& inputs,
                                                        int argc, char** argv) {
  if (f.ranks == "threads") return worker::RunThreads(plan, config, inputs);
  std::vector<std::string> child = {"/proc/self/exe"};
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) child[0] = std::string(self, n);
  for (int i = 1; i < argc; ++i) child.push_back(argv[i]);
  return worker::RunProcesses(plan, config, child);
}

// The JSON line of one checked step and its verdict: 0 when the bytes moved
// equal the analysis' and every error is within kTolerance, else 1.
int Report(const CpstepFlags& f, const std::vector<int64_t>& lens,
           const core::PlanMetrics& metrics, const worker::StepErrors& err,
           const std::vector<worker::RankResult>& results, double wall) {
  std::vector<int64_t> sent, received;
  double seconds = 0.0;
  for (const worker::RankResult& r : results) {
    sent.push_back(r.stats.bytes_sent);
    received.push_back(r.stats.bytes_received);
    seconds = std::max(seconds, r.seconds);
  }
  const core::SchemeBytes& predicted = metrics.bytes[static_cast<int>(f.scheme)];
  const bool bytes_ok = sent == predicted.sent && received == predicted.received;
  const bool errors_ok = err.out <= kTolerance && err.lse <= kTolerance &&
                         err.dq <= kTolerance && err.dk <= kTolerance && err.dv <= kTolerance;
  std::cout << absl::StrFormat(
                   "{\"strategy\":\"%s\",\"scheme\":\"%s\",\"cp\":%d,\"heads\":%d,\"head_dim\":%d,"
                   "\"ranks\":\"%s\",\"tokens\":%d,\"docs\":%d,\"seed\":%d,"
                   "\"max_rel_err\":{\"out\":%.3e,\"lse\":%.3e,\"dq\":%.3e,\"dk\":%.3e,\"dv\":%.3e},"
                   "\"rel_err_definition\":\"max|got-ref| / max(max|ref|, 0.01) over real tokens\","
                   "\"tolerance\":%.1e,\"bytes_sent\":%s,\"bytes_received\":%s,"
                   "\"predicted_bytes_sent\":%s,\"predicted_bytes_received\":%s,"
                   "\"bytes_match\":%s,\"seconds\":%.6f,\"wall_seconds\":%.6f,\"ok\":%s}",
                   core::StrategyName(f.strategy), core::CommSchemeName(f.scheme), f.cp, f.heads,
                   f.head_dim, f.ranks, core::TotalTokens(lens), static_cast<int64_t>(lens.size()),
                   f.seed, err.out, err.lse, err.dq, err.dk, err.dv, kTolerance, Array(sent),
                   Array(received), Array(predicted.sent), Array(predicted.received),
                   bytes_ok ? "true" : "false", seconds, wall,
                   bytes_ok && errors_ok ? "true" : "false")
            << std::endl;
  if (!bytes_ok) std::cerr << "flashcp-cpstep: bytes moved differ from the plan analysis\n";
  if (!errors_ok) std::cerr << "flashcp-cpstep: an error exceeds the tolerance " << kTolerance << "\n";
  return bytes_ok && errors_ok ? 0 : 1;
}

int Run(int argc, char** argv) {
  core::CommandLine line;
  if (std::optional<int> rc = core::ParseMain(argc, argv, kUsage, line, std::cout, std::cerr)) {
    return *rc;
  }
  absl::StatusOr<CpstepFlags> f = ReadFlags(line);
  if (!f.ok()) return core::UsageError("flashcp-cpstep", f.status(), std::cerr);
  const worker::StepConfig config = MakeConfig(*f);
  if (f->internal_rank >= 0) {  // a rank process started by RunProcesses
    absl::Status s = worker::RankProcessMain(f->internal_rank, config, f->seed,
                                             absl::GetFlag(FLAGS_internal_dir));
    if (!s.ok()) std::cerr << "flashcp-cpstep rank " << f->internal_rank << ": " << s << "\n";
    return s.ok() ? 0 : 1;
  }
  absl::StatusOr<std::vector<int64_t>> lens = ReadLengths(std::cin);
  if (!lens.ok()) {
    std::cerr << "flashcp-cpstep: " << lens.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<core::Plan> plan =
      core::MakePlan(f->strategy, core::Batch{*lens, f->cp}, f->plan_options);
  if (!plan.ok()) {
    std::cerr << "flashcp-cpstep: plan: " << plan.status() << "\n";
    return 1;
  }
  const core::ModelShape model{f->heads, f->head_dim, 4};
  absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(*plan, model);
  if (!metrics.ok()) {
    std::cerr << "flashcp-cpstep: analysis: " << metrics.status() << "\n";
    return 1;
  }
  // 2C rows under block diffusion: the plan's documents are both copies.
  const worker::StepInputs inputs =
      worker::MakeInputs(core::TotalTokens(plan->doc_lens), config.shape, f->seed);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<worker::RankResult>> results =
      RunStep(*f, *plan, config, inputs, argc, argv);
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
  return Report(*f, *lens, *metrics, *err, *results, wall);
}

}  // namespace

int main(int argc, char** argv) {
  flashcp::worker::IgnoreSigpipe();  // a dead peer fails the step, not this process
  return Run(argc, argv);
}
