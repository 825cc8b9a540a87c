// flashcp-plan's flags (absl flags, read by core/flags.h) and their meaning
// as CliOptions. Its own target (flashcp_cli_args): the programs that link
// flashcp_cli for its tables must not get these flags.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/cli.h"
#include "core/echo.h"
#include "core/flags.h"
#include "core/mask.h"
#include "core/plan_json.h"
#include "core/status_macros.h"
#include "core/types.h"

ABSL_FLAG(int64_t, cp, flashcp::core::CliOptions{}.cp_size, "ranks in the CP group");
ABSL_FLAG(std::string, strategy, "",
          "a strategy, a comma-separated list, or all (every one but ilp, which is slow); "
          "empty: flashcp, or all with --summary");
ABSL_FLAG(double, target_imbalance, flashcp::core::PlanOptions{}.target_imbalance,
          "target imbalance ratio R for flashcp and flashcp_paper, in [1, 1e6]");
ABSL_FLAG(int64_t, min_shard_tokens, flashcp::core::PlanOptions{}.min_shard_tokens,
          "flashcp's minimum cut shard, tokens (0 turns the rule off). Best effort, below the "
          "imbalance target R: flashcp avoids cut shards shorter than this and repairs or "
          "re-cuts those left, but keeps one where no plan it finds (heuristics) meets R "
          "without it, or where the only such plan costs more than 8x this many non-last "
          "tokens per sliver (a cut shard shorter than this)");
// absl flag help is a constant string: the "8x" above is kSliverCostFactor.
static_assert(flashcp::core::kSliverCostFactor == 8, "update --min_shard_tokens' help");
ABSL_FLAG(flashcp::core::RepeatedFlag, docs, {},
          "one batch: document lengths (tokens), commas or spaces; repeat for more batches, "
          "e.g. --docs 5,3 --docs \"8 8\"");
ABSL_FLAG(std::string, input, "", "one batch per line (\"-\" is stdin); blank and # lines skipped");
ABSL_FLAG(std::string, dataset, "", "sampled batches: wlbllm, pile or redpajama");
ABSL_FLAG(int64_t, context, flashcp::core::CliOptions{}.context,
          "tokens per sampled batch (with --dataset)");
ABSL_FLAG(int64_t, batches, flashcp::core::CliOptions{}.batches,
          "sampled batches (with --dataset)");
ABSL_FLAG(uint64_t, seed, flashcp::core::CliOptions{}.seed, "sampling seed (with --dataset)");
ABSL_FLAG(bool, summary, false, "print a table of per-strategy statistics instead of JSON");
ABSL_FLAG(int32_t, heads, flashcp::core::ModelShape{}.heads, "KV heads, for byte counts");
ABSL_FLAG(int32_t, head_dim, flashcp::core::ModelShape{}.head_dim, "head dimension");
ABSL_FLAG(int32_t, dtype_bytes, flashcp::core::ModelShape{}.dtype_bytes,
          "bytes per element: 1, 2 or 4");
ABSL_FLAG(int64_t, ilp_granularity, flashcp::core::PlanOptions{}.ilp.granularity,
          "ILP block size in tokens (0: C / (16 N))");
ABSL_FLAG(absl::Duration, ilp_time_limit, flashcp::core::CliOptions{}.ilp_time_limit,
          "wall-clock limit of one ILP plan (a batch), model setup included; then its best plan "
          "so far. In [1ms, 1d]");
ABSL_FLAG(std::string, svg, "",
          "also draw the first batch's plans as SVG to this file, one panel per strategy side "
          "by side: a row per rank, shards coloured by document, the shards whose KV moves "
          "(targeted exchange) hatched, workloads");
ABSL_FLAG(bool, quiet, false, "no progress lines on stderr");
ABSL_FLAG(std::string, attention_mask, "causal_document",
          "causal_document, or block_diffusion: plan the 2C-token [noisy ; clean] sequence of "
          "a block diffusion LM step (docs/bdlm.md; llama3, per_doc, zigzag, ring, csbp, "
          "flashcp)");
ABSL_FLAG(int64_t, block_size, 0,
          "block diffusion's block size b in tokens, in [1, 2^40]; only with "
          "--attention_mask=block_diffusion");

namespace flashcp::core {
namespace {

constexpr int64_t kMaxBatches = 1'000'000;

// "all": InAllList's strategies; under block diffusion those that plan the
// mask, csbp included (under the causal mask it is llama3's copy).
absl::StatusOr<std::vector<Strategy>> ParseStrategyList(absl::string_view value,
                                                        const AttentionMask& mask, bool* all) {
  *all = false;
  if (value == "all") {
    *all = true;
    std::vector<Strategy> out;
    for (Strategy s : AllStrategies()) {
      const bool listed = IsBlockDiffusion(mask) ? PlansMask(s, mask) : InAllList(s);
      if (listed) out.push_back(s);
    }
    return out;
  }
  std::vector<Strategy> out;
  for (absl::string_view name : absl::StrSplit(value, ',')) {
    absl::StatusOr<Strategy> s = ParseStrategy(name);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--strategy: unknown strategy ", Echo(name),
                                                     " (all, ", StrategyNames(),
                                                     ", or a comma-separated list)"));
    }
    if (std::find(out.begin(), out.end(), *s) == out.end()) out.push_back(*s);
  }
  return out;
}

// CliOptions from the flags as parsed, `line` saying which were given.
absl::StatusOr<CliOptions> OptionsFromFlags(const CommandLine& line) {
  CliOptions o;
  o.warnings = line.warnings;
  FLASHCP_ASSIGN_OR_RETURN(o.cp_size, IntFlagIn("cp", absl::GetFlag(FLAGS_cp), 1, kMaxCpSize));
  FLASHCP_ASSIGN_OR_RETURN(
      o.plan.target_imbalance,
      DoubleFlagIn("target_imbalance", absl::GetFlag(FLAGS_target_imbalance), 1.0, 1e6));
  FLASHCP_ASSIGN_OR_RETURN(
      o.plan.min_shard_tokens,
      IntFlagIn("min_shard_tokens", absl::GetFlag(FLAGS_min_shard_tokens), 0, kMaxTokens));
  {
    absl::StatusOr<MaskKind> kind = ParseMaskKind(absl::GetFlag(FLAGS_attention_mask));
    if (!kind.ok()) return absl::InvalidArgumentError(absl::StrCat("--", kind.status().message()));
    o.plan.attention_mask.kind = *kind;
    o.plan.attention_mask.block_size = absl::GetFlag(FLAGS_block_size);
    if (absl::Status s = ValidateAttentionMask(o.plan.attention_mask); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
    }
  }
  if (line.given.count("dataset") > 0) {
    FLASHCP_ASSIGN_OR_RETURN(o.dataset, DatasetFromFlag(absl::GetFlag(FLAGS_dataset)));
  }
  FLASHCP_ASSIGN_OR_RETURN(o.context,
                           IntFlagIn("context", absl::GetFlag(FLAGS_context), 1, kMaxTokens));
  FLASHCP_ASSIGN_OR_RETURN(o.batches,
                           IntFlagIn("batches", absl::GetFlag(FLAGS_batches), 1, kMaxBatches));
  o.seed = absl::GetFlag(FLAGS_seed);
  FLASHCP_ASSIGN_OR_RETURN(o.shape, ModelShapeFromFlags(absl::GetFlag(FLAGS_heads),
                                                       absl::GetFlag(FLAGS_head_dim),
                                                       absl::GetFlag(FLAGS_dtype_bytes)));
  for (const std::string& docs : absl::GetFlag(FLAGS_docs).items) {
    absl::StatusOr<std::vector<int64_t>> lens = ParseBatchLine(docs);
    if (!lens.ok())
      return absl::InvalidArgumentError(absl::StrCat("--docs: ", lens.status().message()));
    o.batches_text.push_back(docs);
  }
  o.input_path = absl::GetFlag(FLAGS_input);
  if (line.given.count("input") > 0 && o.input_path.empty()) {
    return absl::InvalidArgumentError("--input: missing file name");
  }
  o.svg_path = absl::GetFlag(FLAGS_svg);
  if (line.given.count("svg") > 0 && o.svg_path.empty()) {
    return absl::InvalidArgumentError("--svg: missing file name");
  }
  FLASHCP_ASSIGN_OR_RETURN(
      o.plan.ilp.granularity,
      IntFlagIn("ilp_granularity", absl::GetFlag(FLAGS_ilp_granularity), 0, kMaxTokens));
  FLASHCP_ASSIGN_OR_RETURN(o.ilp_time_limit,
                           DurationFlagIn("ilp_time_limit", absl::GetFlag(FLAGS_ilp_time_limit),
                                          absl::Milliseconds(1), absl::Hours(24)));
  o.summary = absl::GetFlag(FLAGS_summary);
  o.progress = !absl::GetFlag(FLAGS_quiet);

  if (!line.positional.empty()) {
    if (!o.batches_text.empty()) {
      return absl::InvalidArgumentError(
          "give document lengths either as arguments or with --docs, not both");
    }
    const std::string joined = absl::StrJoin(line.positional, " ");
    absl::StatusOr<std::vector<int64_t>> lens = ParseBatchLine(joined);
    if (!lens.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("document lengths (arguments): ", lens.status().message()));
    }
    o.batches_text.push_back(joined);
  }
  const int sources = (o.batches_text.empty() ? 0 : 1) + (o.input_path.empty() ? 0 : 1) +
                      (o.dataset.has_value() ? 1 : 0);
  if (sources > 1) {
    return absl::InvalidArgumentError(
        "give batches from one source: lengths (arguments or --docs), --input, or --dataset");
  }
  if (!o.dataset.has_value()) {
    for (const char* flag : {"context", "batches", "seed"}) {
      if (line.given.count(flag) > 0) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, ": needs --dataset"));
      }
    }
  }
  std::string strategy = absl::GetFlag(FLAGS_strategy);
  if (line.given.count("strategy") > 0 && strategy.empty()) {
    return absl::InvalidArgumentError("--strategy: missing value");
  }
  if (strategy.empty()) strategy = o.summary ? "all" : std::string(StrategyName(kDefaultStrategy));
  bool all = false;
  absl::StatusOr<std::vector<Strategy>> strategies =
      ParseStrategyList(strategy, o.plan.attention_mask, &all);
  if (!strategies.ok()) return strategies.status();
  o.strategies = *std::move(strategies);
  o.from_all = all;
  return o;
}

}  // namespace

std::string CliUsage() {
  return FlagsHelp(absl::StrCat(R"(Usage: flashcp-plan [--flag=value ...] [LENGTH ...]

Plans context-parallel sharding of packed batches and prints one JSON object
per batch and strategy, or with --summary a table comparing strategies.
Strategies: )",
                                StrategyNames(), R"(.

Batches come from exactly one of:
  LENGTH ...           one batch: document lengths (tokens), commas or spaces
  --docs LIST          one batch per --docs
  --input FILE         one batch per line
  --dataset NAME       sampled batches
  (none)               stdin, as --input -

Exit status: 0 success; 1 a bad batch, a failed plan or an I/O error; 2 a bad flag.)"));
}

absl::StatusOr<CliOptions> ParseCliArgs(const std::vector<std::string>& args) {
  // Each call starts from the defaults, whatever an earlier one parsed.
  ResetFlagsToDefaults();
  absl::StatusOr<CommandLine> line = ParseCommandLine(args);
  if (!line.ok()) return line.status();
  if (line->help) {
    CliOptions o;
    o.help = true;
    return o;
  }
  return OptionsFromFlags(*line);
}

}  // namespace flashcp::core
