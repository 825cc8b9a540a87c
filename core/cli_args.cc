// flashcp-plan's flags (absl flags, read by core/flags.h) and their meaning
// as CliOptions. Its own target (flashcp_cli_args): the programs that link
// flashcp_cli for its tables must not get these flags.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/cli.h"
#include "core/cluster_flags.h"
#include "core/echo.h"
#include "core/flags.h"
#include "core/mask.h"
#include "core/plan_json.h"
#include "core/status_macros.h"
#include "core/types.h"

ABSL_DECLARE_FLAG(int32_t, layers);  // core/cluster_flags.cc

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
ABSL_FLAG(int32_t, query_heads, flashcp::core::ModelShape{}.query_heads,
          "query heads Hq (0: equal to --heads; a multiple of it), for the all_to_all "
          "scheme's byte counts and the predicted compute");
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
ABSL_FLAG(int32_t, ranks_per_node, flashcp::core::PlanOptions{}.ranks_per_node,
          "ranks per node: rank r on node r / ranks_per_node (0: one node); flashcp keeps cut "
          "documents within a node, metrics split bytes within and across nodes, and the "
          "predicted step puts inter-node traffic on the NICs");
ABSL_FLAG(bool, choose_by_step_time, false,
          "flashcp: plan several variants and keep the least predicted step time within the "
          "imbalance target (core/step_choice.h); needs --cluster");
// Pipeline mode (core/pipeline.h); the flags below need --pipeline.
ABSL_FLAG(bool, pipeline, false,
          "plan pipeline-parallel micro-batches (DPP, docs/pipeline.md) instead of CP sharding; "
          "--strategy then names pipeline strategies (dpp, batch_level, token_level, dpp_no_wbc, "
          "dpp_no_ckpt, dpp_full_ckpt, or all)");
ABSL_FLAG(int64_t, pp, flashcp::core::PipelineRequest{}.pp_size, "with --pipeline: stages d_p");
ABSL_FLAG(int64_t, sp, flashcp::core::PipelineRequest{}.sp_size,
          "with --pipeline: Ulysses degree d_s inside a stage");
ABSL_FLAG(double, memory_budget_gib, flashcp::core::PipelineRequest{}.memory_budget_bytes / (1 << 30),
          "with --pipeline: memory per GPU, GiB");
ABSL_FLAG(int64_t, hidden, flashcp::core::PipelineModel{}.hidden, "with --pipeline: model width D");
ABSL_FLAG(int64_t, kv_hidden, flashcp::core::PipelineModel{}.kv_hidden,
          "with --pipeline: KV heads x head dim");
ABSL_FLAG(int64_t, ffn_hidden, flashcp::core::PipelineModel{}.ffn_hidden,
          "with --pipeline: MLP width");
ABSL_FLAG(int64_t, vocab, flashcp::core::PipelineModel{}.vocab, "with --pipeline: vocabulary");
ABSL_FLAG(std::string, pipeline_profile, std::string(flashcp::core::kDefaultPipelineProfile),
          "with --pipeline: time and memory profile");
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

// The pipeline mode's part of the options (--pipeline given).
absl::StatusOr<CliOptions> WithPipelineFlags(CliOptions o, const CommandLine& line,
                                             const std::string& strategy) {
  PipelineRequest& r = o.pipeline_request;
  FLASHCP_ASSIGN_OR_RETURN(r.pp_size, IntFlagIn("pp", absl::GetFlag(FLAGS_pp), 1, 1024));
  FLASHCP_ASSIGN_OR_RETURN(r.sp_size, IntFlagIn("sp", absl::GetFlag(FLAGS_sp), 1, 4096));
  FLASHCP_ASSIGN_OR_RETURN(
      const double gib,
      DoubleFlagIn("memory_budget_gib", absl::GetFlag(FLAGS_memory_budget_gib), 1e-3, 1e6));
  r.memory_budget_bytes = gib * (int64_t{1} << 30);
  // --layers is one flag (core/cluster_flags.cc): the predicted step's
  // layers, or here the model's; not given, the pipeline model's default.
  if (line.given.count("layers") > 0) {
    FLASHCP_ASSIGN_OR_RETURN(r.model.layers,
                             IntFlagIn("layers", absl::GetFlag(FLAGS_layers), 1, 100000));
  }
  FLASHCP_ASSIGN_OR_RETURN(r.model.hidden,
                           IntFlagIn("hidden", absl::GetFlag(FLAGS_hidden), 1, 1 << 20));
  FLASHCP_ASSIGN_OR_RETURN(r.model.kv_hidden,
                           IntFlagIn("kv_hidden", absl::GetFlag(FLAGS_kv_hidden), 1, 1 << 20));
  FLASHCP_ASSIGN_OR_RETURN(r.model.ffn_hidden,
                           IntFlagIn("ffn_hidden", absl::GetFlag(FLAGS_ffn_hidden), 1, 1 << 22));
  FLASHCP_ASSIGN_OR_RETURN(r.model.vocab, IntFlagIn("vocab", absl::GetFlag(FLAGS_vocab), 1, 1 << 24));
  absl::StatusOr<PipelineProfile> profile =
      NamedPipelineProfile(absl::GetFlag(FLAGS_pipeline_profile));
  if (!profile.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pipeline_profile: ", profile.status().message()));
  }
  r.profile = *profile;
  if (r.model.layers % r.pp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layers: ", r.model.layers, " is not a multiple of --pp ", r.pp_size));
  }
  o.pipeline_options.ckpt.time_limit_seconds = absl::ToDoubleSeconds(o.ilp_time_limit);
  std::string list = strategy;
  if (list.empty()) list = o.summary ? "all" : "dpp";
  if (list == "all") {
    o.pipeline_strategies.assign(std::begin(kAllPipelineStrategies),
                                 std::end(kAllPipelineStrategies));
    o.from_all = true;
  } else {
    for (absl::string_view name : absl::StrSplit(list, ',')) {
      absl::StatusOr<PipelineStrategy> s = ParsePipelineStrategy(name);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--strategy: ", s.status().message()));
      if (std::find(o.pipeline_strategies.begin(), o.pipeline_strategies.end(), *s) ==
          o.pipeline_strategies.end()) {
        o.pipeline_strategies.push_back(*s);
      }
    }
  }
  (void)line;
  return o;
}

// OptionsFromFlags in parts, each filling its fields of `o`, checked in
// this order: the plan's options and the model shape; the inputs, the ILP,
// the step time and the output switches; the one source of batches.
absl::Status PlanAndShapeFlags(const CommandLine& line, CliOptions& o) {
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
  o.shape.query_heads = absl::GetFlag(FLAGS_query_heads);
  FLASHCP_RETURN_IF_ERROR(AsFlagError(ValidateModelShape(o.shape)));
  return absl::OkStatus();
}

absl::Status InputAndStepFlags(const CommandLine& line, CliOptions& o) {
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
  FLASHCP_ASSIGN_OR_RETURN(
      o.plan.ranks_per_node,
      IntFlagIn("ranks_per_node", absl::GetFlag(FLAGS_ranks_per_node), 0, kMaxCpSize));
  FLASHCP_ASSIGN_OR_RETURN(o.step_time, StepTimeFromFlags(line, o.plan.ranks_per_node));
  if (o.step_time.has_value() || line.given.count("query_heads") > 0) {
    FLASHCP_RETURN_IF_ERROR(AsFlagError(
        ValidateStepShape(o.shape, o.step_time.has_value() ? o.step_time->layers : 1)));
  }
  o.choose_by_step_time = absl::GetFlag(FLAGS_choose_by_step_time);
  if (o.choose_by_step_time && !o.step_time.has_value()) {
    return absl::InvalidArgumentError("--choose_by_step_time: needs --cluster");
  }
  o.summary = absl::GetFlag(FLAGS_summary);
  o.progress = !absl::GetFlag(FLAGS_quiet);
  return absl::OkStatus();
}

absl::Status BatchSourceFlags(const CommandLine& line, CliOptions& o) {
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
  return absl::OkStatus();
}

// CliOptions from the flags as parsed, `line` saying which were given.
absl::StatusOr<CliOptions> OptionsFromFlags(const CommandLine& line) {
  CliOptions o;
  o.warnings = line.warnings;
  FLASHCP_RETURN_IF_ERROR(PlanAndShapeFlags(line, o));
  FLASHCP_RETURN_IF_ERROR(InputAndStepFlags(line, o));
  FLASHCP_RETURN_IF_ERROR(BatchSourceFlags(line, o));
  std::string strategy = absl::GetFlag(FLAGS_strategy);
  if (line.given.count("strategy") > 0 && strategy.empty()) {
    return absl::InvalidArgumentError("--strategy: missing value");
  }
  o.pipeline = absl::GetFlag(FLAGS_pipeline);
  if (o.pipeline) return WithPipelineFlags(std::move(o), line, strategy);
  // (--layers is also the predicted step's: core/cluster_flags.cc.)
  for (const char* flag : {"pp", "sp", "memory_budget_gib", "hidden", "kv_hidden",
                           "ffn_hidden", "vocab", "pipeline_profile"}) {
    if (line.given.count(flag) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": needs --pipeline"));
    }
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
