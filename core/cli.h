// The flashcp-plan command line: the per-strategy summary statistics are
// pure; argument parsing reads the process's absl flags (not thread-safe);
// RunCli does the I/O, through the streams and
// the file path it is given. main() (flashcp_plan_main.cc) only wires
// argv and the standard streams to these.
#ifndef FLASHCP_CORE_CLI_H_
#define FLASHCP_CORE_CLI_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/pipeline.h"
#include "core/step_time.h"
#include "core/strategies.h"

namespace flashcp::core {

// Exit codes of flashcp-plan; a bad flag or flag value is kExitUsage
// (core/flags.h), as in every program.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 1;  // a bad batch line or batch, a failed plan, an I/O error

struct CliOptions {
  int32_t cp_size = 8;
  // Strategies to run, in output order. Empty until resolved by ParseCliArgs:
  // the default is kDefaultStrategy, or every strategy but ilp with --summary.
  std::vector<Strategy> strategies;
  // True when the list came from "all" or the --summary default: RunCli then
  // notes which strategies "all" leaves out (InAllList).
  bool from_all = false;
  PlanOptions plan;
  // --ilp_time_limit: each ILP plan's whole call (core/ilp_deadline.h);
  // RunCli sets plan.ilp's time limit from it per call.
  absl::Duration ilp_time_limit = absl::Seconds(10);
  ModelShape shape;
  // --cluster and its constants (core/cluster_flags.h): predict each plan's
  // step time (JSON metrics predicted_*, the summary's step columns).
  std::optional<StepTimeOptions> step_time;
  // --choose_by_step_time: flashcp plans through PlanFlashCpByStepTime.
  bool choose_by_step_time = false;

  // Exactly one source of batches: `batches_text` (positional arguments, all
  // one batch, or one batch per --docs), `input_path` ("-" is stdin), or
  // `dataset`. With none, stdin.
  std::vector<std::string> batches_text;
  std::string input_path;
  std::optional<Dataset> dataset;
  int64_t context = 131072;  // tokens per sampled batch
  int64_t batches = 64;      // sampled batches
  uint64_t seed = 1;

  bool summary = false;
  // --svg FILE: the first batch's plans drawn side by side (core/plan_svg.h),
  // one panel per strategy, written to FILE; empty: no drawing.
  std::string svg_path;
  bool progress = true;  // a progress line on stderr every second; --quiet turns it off
  // --pipeline: plan pipeline-parallel micro-batches (core/pipeline.h)
  // instead of CP sharding: --strategy then names pipeline strategies, and
  // the request below (all but doc_lens, from --pp, --sp, --memory_budget_gib,
  // --layers ...) and pipeline_options (its ckpt_solver set by main where the
  // ILP is linked; --ilp_time_limit its CBC limit) apply. --svg then draws the
  // first batch's first strategy's replay (stages x time).
  bool pipeline = false;
  std::vector<PipelineStrategy> pipeline_strategies;
  PipelineRequest pipeline_request;
  PipelineOptions pipeline_options;
  bool help = false;
  // Deprecated spellings used (core/flags.h), one line each for stderr.
  std::vector<std::string> warnings;
};

// Parses argv[1..] as core/flags.h does (the flags are flashcp-plan's, in
// core/cli_args.cc; positional arguments are lengths), starting each call
// from the flags' defaults. InvalidArgument whose message names the flag and the bad
// value. In target flashcp_cli_args, as is CliUsage.
absl::StatusOr<CliOptions> ParseCliArgs(const std::vector<std::string>& args);

// The --help text, generated from the flags.
std::string CliUsage();

// What every figure computed from a data set's batches must state beside it
// (../shared/datasets/README.md).
absl::string_view DatasetAssumptions(Dataset dataset);

// Batch input, one batch per line (flashcp-plan --input, flashcp-client): a
// longer line is refused before it is held in memory; 10^6 documents of 2^40
// tokens take at most 14 characters each.
inline constexpr size_t kMaxLineBytes = size_t{16} << 20;

enum class LineRead { kLine, kEof, kTooLong };

// Reads one line (without its '\n') into `line`, holding at most
// kMaxLineBytes characters (kTooLong then; the rest of the line is left
// unread). A read error (a directory, EIO) sets `in`'s badbit and reads as
// kEof.
LineRead ReadInputLine(std::istream& in, std::string& line);

// A line with nothing but spaces, tabs and '\r' before its end or a '#'.
bool IsBlankOrComment(absl::string_view line);

// Per-strategy statistics over batches, for the summary table.
struct StrategySummary {
  Strategy strategy = kDefaultStrategy;
  int64_t batches = 0;
  double imbalance_mean = 0;
  double imbalance_p95 = 0;
  double allgather_saving_mean = 0;  // mean of PlanMetrics::comm_saving, a fraction
  double targeted_saving_mean = 0;   // mean of PlanMetrics::targeted_saving, a fraction
  // Mean one-phase bottleneck (SPEC "Targeted exchange, per phase") in units
  // of C/N tokens, per scheme; full_kv's is N - 1.
  double allgather_phase_mean = 0;
  double targeted_phase_mean = 0;
  double cut_docs_mean = 0;
  int64_t min_cut_shard_len = 0;     // shortest cut shard over all batches; 0 if none
  double plan_ms_mean = 0;           // MakePlan wall time, milliseconds
  double plan_ms_p99 = 0;
  // Mean predicted step time (core/step_time.h), seconds; 0 without a cluster.
  double step_seconds_mean = 0;
  // The exchange most of its batches were predicted with ("" without).
  std::string step_exchange;
  // Batches whose exchange did not apply (StepTimePrediction::inapplicable:
  // basp's all_to_all where a group's size does not divide Hq); with any,
  // step_seconds_mean is 0 (no mean of a part) and the table says n/a.
  int64_t step_inapplicable = 0;
};

class SummaryAccumulator {
 public:
  explicit SummaryAccumulator(Strategy strategy) : strategy_(strategy) {}
  void Add(const PlanMetrics& metrics, double plan_ms);
  // A batch's predicted step (after its Add).
  void AddStep(const StepTimeReport& step);
  int64_t count() const { return static_cast<int64_t>(imbalance_.size()); }
  StrategySummary Finish() const;

 private:
  Strategy strategy_;
  std::vector<double> imbalance_;
  std::vector<double> plan_ms_;
  double allgather_saving_sum_ = 0;
  double targeted_saving_sum_ = 0;
  double allgather_phase_sum_ = 0;
  double targeted_phase_sum_ = 0;
  int64_t cut_docs_sum_ = 0;
  int64_t min_cut_shard_len_ = 0;
  double step_seconds_sum_ = 0;
  int64_t steps_ = 0;
  int64_t step_inapplicable_ = 0;
  std::array<int64_t, kNumStepExchanges> step_exchanges_{};
};

// Nearest-rank percentile (p in (0, 1]) of `values`; 0 for none.
double Percentile(std::vector<double> values, double p);

// A fixed-width text table, one row per summary, with a header line; with
// predicted steps (step_seconds_mean > 0 or step_inapplicable > 0 in every
// row), a step_ms and an exchange column, then a table of speedups: row
// strategy over each column's, ratios of mean predicted step times ("n/a"
// where a row's exchange did not apply).
std::string FormatSummaryTable(const std::vector<StrategySummary>& rows);

// Runs the command: reads batches (from `in` when the source is stdin), plans
// them, writes JSON lines or the summary to `out`, notes and errors to `err`
// (each prefixed "flashcp-plan: "). Returns an exit code above.
int RunCli(const CliOptions& options, std::istream& in, std::ostream& out, std::ostream& err);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_CLI_H_
