#include "core/cli.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <fstream>
#include <istream>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/cli_pipeline.h"
#include "core/cost_model.h"
#include "core/echo.h"
#include "core/file.h"
#include "core/ilp_deadline.h"
#include "core/mask.h"
#include "core/plan_json.h"
#include "core/plan_svg.h"
#include "core/status_macros.h"
#include "core/step_choice.h"
#include "core/types.h"

namespace flashcp::core {

LineRead ReadInputLine(std::istream& in, std::string& line) {
  line.clear();
  std::streambuf* buf = in.rdbuf();
  if (buf == nullptr) return LineRead::kEof;
  while (true) {
    int c;
    try {  // libstdc++'s filebuf throws read errors; the stream's own reads would catch them
      c = buf->sbumpc();
    } catch (const std::ios_base::failure&) {
      in.setstate(std::ios_base::badbit);
      return LineRead::kEof;
    }
    if (c == std::char_traits<char>::eof()) {
      return line.empty() ? LineRead::kEof : LineRead::kLine;
    }
    if (c == '\n') return LineRead::kLine;
    if (line.size() == kMaxLineBytes) return LineRead::kTooLong;
    line.push_back(static_cast<char>(c));
  }
}

bool IsBlankOrComment(absl::string_view line) {
  for (char c : line) {
    if (c == '#') return true;
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

namespace {

// Yields batches, with where each came from for error messages, from one of
// the three sources.
class BatchSource {
 public:
  BatchSource(const CliOptions& options, std::istream& in) : options_(options), in_(&in) {}

  // Opens --input FILE; InvalidArgument/NotFound naming it.
  absl::Status Open() {
    if (!options_.input_path.empty() && options_.input_path != "-") {
      file_.open(options_.input_path);
      if (!file_.is_open()) return FileError("--input", "open", options_.input_path, errno);
      in_ = &file_;
    }
    return absl::OkStatus();
  }

  // Total batches when known in advance, else -1 (a stream).
  int64_t total() const {
    if (options_.dataset.has_value()) return options_.batches;
    if (!options_.batches_text.empty()) return static_cast<int64_t>(options_.batches_text.size());
    return -1;
  }

  // Next batch into `docs`; false at the end. `where` names it in errors.
  absl::StatusOr<bool> Next(std::vector<int64_t>& docs, std::string& where) {
    if (options_.dataset.has_value()) {
      if (next_ >= options_.batches) return false;
      where = absl::StrCat("batch ", next_, " (", DatasetName(*options_.dataset), ", seed ",
                           options_.seed, ")");
      absl::StatusOr<std::vector<int64_t>> b =
          SampleBatch(*options_.dataset, options_.context, options_.seed, next_);
      if (!b.ok()) return absl::Status(b.status().code(), absl::StrCat(where, ": ", b.status().message()));
      docs = *std::move(b);
      ++next_;
      return true;
    }
    if (!options_.batches_text.empty()) {
      if (next_ >= static_cast<int64_t>(options_.batches_text.size())) return false;
      where = absl::StrCat("command-line batch ", next_);
      absl::StatusOr<std::vector<int64_t>> b = ParseBatchLine(options_.batches_text[next_]);
      if (!b.ok()) return absl::Status(b.status().code(), absl::StrCat(where, ": ", b.status().message()));
      docs = *std::move(b);
      ++next_;
      return true;
    }
    const std::string name = options_.input_path.empty() || options_.input_path == "-"
                                 ? std::string("stdin")
                                 : options_.input_path;
    std::string line;
    while (true) {
      ++line_no_;
      const LineRead r = ReadInputLine(*in_, line);
      if (r == LineRead::kEof) {
        if (in_->bad()) return absl::DataLossError(absl::StrCat(name, ": read error"));
        return false;
      }
      where = absl::StrCat(name, " line ", line_no_);
      if (r == LineRead::kTooLong) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": longer than ", kMaxLineBytes, " bytes"));
      }
      if (IsBlankOrComment(line)) continue;
      absl::StatusOr<std::vector<int64_t>> b = ParseBatchLine(line);
      if (!b.ok()) return absl::Status(b.status().code(), absl::StrCat(where, ": ", b.status().message()));
      docs = *std::move(b);
      ++next_;
      return true;
    }
  }

 private:
  const CliOptions& options_;
  std::istream* in_;
  std::ifstream file_;
  int64_t next_ = 0;
  int64_t line_no_ = 0;
};

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

std::string SummaryHeader(const CliOptions& o) {
  std::string source;
  if (o.dataset.has_value()) {
    source = absl::StrCat(o.batches, " batches of ", o.context, " tokens drawn from ",
                          DatasetName(*o.dataset), " (seed ", o.seed, ")");
  } else if (!o.batches_text.empty()) {
    source = "batches from the command line";
  } else {
    source = absl::StrCat("batches from ", o.input_path.empty() || o.input_path == "-"
                                               ? std::string("stdin")
                                               : o.input_path);
  }
  std::string h = absl::StrFormat(
      "# flashcp-plan summary: N = %d, %s; target imbalance %g; H = %d, D = %d, %d-byte dtype\n",
      o.cp_size, source, o.plan.target_imbalance, o.shape.heads, o.shape.head_dim,
      o.shape.dtype_bytes);
  if (o.dataset.has_value()) {
    absl::StrAppend(&h, "# data: ", DatasetName(*o.dataset), ": ", DatasetAssumptions(*o.dataset),
                    "\n");
  }
  absl::StrAppend(&h,
                  "# imbalance: max / mean attention workload per rank (1.00 is perfect). "
                  "save_ag, save_tgt: 1 - one phase's bottleneck / full_kv's, for the paper's "
                  "compacted all-gather (Eq. 5) and the targeted exchange, applied to each "
                  "strategy's sharding (for llama3 and per_doc, not what those systems move: "
                  "they all-gather full KV, save 0). phase_ag, phase_tg: one phase's bottleneck, "
                  "max over ranks of max(send, receive), in C/N tokens (full_kv: N - 1). "
                  "plan_ms: MakePlan wall time.\n");
  if (o.step_time.has_value()) {
    const ClusterSpec& c = o.step_time->cluster;
    absl::StrAppendFormat(
        &h,
        "# step_ms: mean predicted attention time of one step (core/step_time.h), %d layer(s), "
        "Hq = %d, on %s: %d ranks per node (0: one node), NVLink %g GB/s, NIC %g GB/s per GPU, "
        "compute x %g; exchange: the one the strategy runs with. speedup over: the column's "
        "mean step_ms over the row's.\n",
        o.step_time->layers, o.shape.query_heads == 0 ? o.shape.heads : o.shape.query_heads,
        o.step_time->cluster_name.empty() ? std::string("a custom cluster")
                                          : o.step_time->cluster_name,
        c.ranks_per_node, c.nvlink_bytes_per_second / 1e9, c.nic_bytes_per_second / 1e9,
        c.compute_scale);
  }
  return h;
}

// --svg: the first batch's panels, side by side, written to `path`.
absl::Status WriteSvg(const std::string& path, const std::vector<PlanPanel>& panels,
                      int64_t batches) {
  if (batches == 0) return absl::InvalidArgumentError("--svg: no batch to draw");
  absl::StatusOr<std::string> svg = PlansToSvg(panels);
  if (!svg.ok()) {
    return absl::Status(svg.status().code(), absl::StrCat("--svg: ", svg.status().message()));
  }
  return WriteFile("--svg", path, *svg);
}

}  // namespace

absl::string_view DatasetAssumptions(Dataset dataset) {
  switch (dataset) {
    case Dataset::kWlbLlm:
      return "a public reconstruction of WLB-LLM's length distribution (not Meta's raw data), "
             "sampled by inverse CDF with log-linear interpolation between quantiles";
    case Dataset::kPile:
      return "The Pile's per-component document shares and mean sizes at 3.5 bytes per token "
             "(assumed); lognormal lengths with sigma 1.0 within a component (assumed)";
    case Dataset::kRedPajama:
      return "RedPajama-V1 tokens per source with proxy mean document lengths (assumed); "
             "lognormal lengths with sigma 1.0 within a source (assumed)";
  }
  return "";
}

void SummaryAccumulator::Add(const PlanMetrics& metrics, double plan_ms) {
  imbalance_.push_back(metrics.imbalance);
  plan_ms_.push_back(plan_ms);
  allgather_saving_sum_ += metrics.comm_saving;
  targeted_saving_sum_ += metrics.targeted_saving;
  const double per_rank = static_cast<double>(std::max<int64_t>(1, metrics.tokens_per_rank));
  allgather_phase_sum_ +=
      static_cast<double>(
          metrics.bytes[static_cast<int>(CommScheme::kAllGather)].phase.bottleneck_tokens) /
      per_rank;
  targeted_phase_sum_ +=
      static_cast<double>(
          metrics.bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens) /
      per_rank;
  cut_docs_sum_ += metrics.cut_docs;
  if (metrics.min_cut_shard_len > 0 &&
      (min_cut_shard_len_ == 0 || metrics.min_cut_shard_len < min_cut_shard_len_)) {
    min_cut_shard_len_ = metrics.min_cut_shard_len;
  }
}

void SummaryAccumulator::AddStep(const StepTimeReport& step) {
  if (!step.native().inapplicable.empty()) ++step_inapplicable_;
  step_seconds_sum_ += step.native().step_seconds;  // 0 where inapplicable
  ++steps_;
  ++step_exchanges_[static_cast<size_t>(step.exchange)];
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  // Nearest rank: the smallest value with at least p of the values at or below it.
  const size_t n = values.size();
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(n)));
  rank = std::clamp<size_t>(rank, 1, n);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                   values.end());
  return values[rank - 1];
}

StrategySummary SummaryAccumulator::Finish() const {
  StrategySummary s;
  s.strategy = strategy_;
  s.batches = count();
  if (s.batches == 0) return s;
  const double n = static_cast<double>(s.batches);
  double imb = 0, ms = 0;
  for (double v : imbalance_) imb += v;
  for (double v : plan_ms_) ms += v;
  s.imbalance_mean = imb / n;
  s.imbalance_p95 = Percentile(imbalance_, 0.95);
  s.allgather_saving_mean = allgather_saving_sum_ / n;
  s.targeted_saving_mean = targeted_saving_sum_ / n;
  s.allgather_phase_mean = allgather_phase_sum_ / n;
  s.targeted_phase_mean = targeted_phase_sum_ / n;
  s.cut_docs_mean = static_cast<double>(cut_docs_sum_) / n;
  s.min_cut_shard_len = min_cut_shard_len_;
  s.plan_ms_mean = ms / n;
  s.plan_ms_p99 = Percentile(plan_ms_, 0.99);
  if (steps_ > 0) {
    s.step_inapplicable = step_inapplicable_;
    s.step_seconds_mean =
        step_inapplicable_ > 0 ? 0 : step_seconds_sum_ / static_cast<double>(steps_);
    const size_t top = static_cast<size_t>(
        std::max_element(step_exchanges_.begin(), step_exchanges_.end()) - step_exchanges_.begin());
    s.step_exchange = std::string(StepExchangeName(static_cast<StepExchange>(top)));
  }
  return s;
}

std::string FormatSummaryTable(const std::vector<StrategySummary>& rows) {
  const bool steps = !rows.empty() && std::all_of(rows.begin(), rows.end(), [](const auto& r) {
    return r.step_seconds_mean > 0 || r.step_inapplicable > 0;
  });
  std::string out = absl::StrFormat(
      "%-14s %7s %8s %8s %9s %9s %8s %8s %8s %9s %9s %9s", "strategy", "batches", "imb_mean",
      "imb_p95", "save_ag", "save_tgt", "phase_ag", "phase_tg", "cut_docs", "min_cut", "ms_mean",
      "ms_p99");
  if (steps) absl::StrAppendFormat(&out, " %10s %-9s", "step_ms", "exchange");
  out += "\n";
  for (const StrategySummary& r : rows) {
    absl::StrAppendFormat(
        &out, "%-14s %7d %8.4f %8.4f %8.1f%% %8.1f%% %8.3f %8.3f %8.1f %9d %9.3f %9.3f",
        StrategyName(r.strategy), r.batches, r.imbalance_mean, r.imbalance_p95,
        100 * r.allgather_saving_mean, 100 * r.targeted_saving_mean, r.allgather_phase_mean,
        r.targeted_phase_mean, r.cut_docs_mean, r.min_cut_shard_len, r.plan_ms_mean,
        r.plan_ms_p99);
    if (steps && r.step_inapplicable > 0) {
      absl::StrAppendFormat(&out, " %10s %-9s", "n/a", r.step_exchange);
    } else if (steps) {
      absl::StrAppendFormat(&out, " %10.3f %-9s", 1e3 * r.step_seconds_mean, r.step_exchange);
    }
    out += "\n";
  }
  if (steps) {
    absl::StrAppendFormat(&out, "\n%-14s", "speedup over");
    for (const StrategySummary& c : rows) absl::StrAppendFormat(&out, " %13s", StrategyName(c.strategy));
    out += "\n";
    for (const StrategySummary& r : rows) {
      absl::StrAppendFormat(&out, "%-14s", StrategyName(r.strategy));
      for (const StrategySummary& c : rows) {
        if (r.step_inapplicable > 0 || c.step_inapplicable > 0) {
          absl::StrAppendFormat(&out, " %13s", "n/a");
        } else {
          absl::StrAppendFormat(&out, " %12.3fx", c.step_seconds_mean / r.step_seconds_mean);
        }
      }
      out += "\n";
    }
  }
  return out;
}

namespace {

constexpr absl::string_view kPrefix = "flashcp-plan: ";

// --pipeline (core/cli_pipeline.h): every batch of `source` through one run.
int RunPipelineCli(const CliOptions& options, BatchSource& source, std::ostream& out,
                   std::ostream& err) {
  PipelineCliRun run(options, out, err);
  std::vector<int64_t> docs;
  std::string where;
  while (true) {
    absl::StatusOr<bool> more = source.Next(docs, where);
    if (!more.ok()) {
      err << kPrefix << more.status().message() << "\n";
      return kExitBadInput;
    }
    if (!*more) return run.Finish();
    if (const int rc = run.Batch(std::move(docs), where); rc != kExitOk) return rc;
  }
}

// --summary over "all": a note for each strategy "all" leaves out.
void NoteLeftOutOfAll(const CliOptions& options, std::ostream& err) {
  const AttentionMask& mask = options.plan.attention_mask;
  for (Strategy s : AllStrategies()) {
    // Under block diffusion "all" is every strategy that plans the mask.
    if (IsBlockDiffusion(mask) || InAllList(s)) continue;
    const absl::string_view why =
        s == Strategy::kCsbp ? "under the causal mask it is llama3's plan" : "it is slow";
    err << kPrefix << "note: " << StrategyName(s) << " left out of \"all\" (" << why
        << "); ask for it with --strategy " << StrategyName(s) << "\n";
  }
}

// One strategy's plan of one batch, with what the output needs of it.
struct PlannedBatch {
  Plan plan;
  PlanMetrics metrics;
  PlanInfo info;                     // the ILP's
  std::optional<StepTimeReport> step;  // when a step time is asked for
  double ms = 0;                     // planning time (the plan alone)
};

// Plans `batch` with `strategy` (by step time where asked), analyzes the plan
// and predicts its step time where asked; the first error, unchanged.
absl::StatusOr<PlannedBatch> PlanOne(const CliOptions& options, Strategy strategy,
                                     const Batch& batch, const RealClock& real_clock,
                                     PlanOptions& plan_options) {
  using Clock = std::chrono::steady_clock;
  PlannedBatch r;
  const Clock::time_point t0 = Clock::now();
  if (strategy == Strategy::kIlp) {
    // Each ILP plan stops --ilp_time_limit after its call starts.
    SetIlpDeadline(options.ilp_time_limit, real_clock.Now(), &real_clock, plan_options.ilp);
  }
  if (options.choose_by_step_time && strategy == Strategy::kFlashCp) {
    FLASHCP_ASSIGN_OR_RETURN(
        StepChoice choice,
        PlanFlashCpByStepTime(batch, plan_options, options.shape, *options.step_time));
    r.plan = std::move(choice.plan);
    r.step = std::move(choice.report);
  } else {
    FLASHCP_ASSIGN_OR_RETURN(r.plan, MakePlan(strategy, batch, plan_options, &r.info));
  }
  r.ms = Ms(Clock::now() - t0);
  FLASHCP_ASSIGN_OR_RETURN(r.metrics,
                           AnalyzePlan(r.plan, options.shape, options.plan.ranks_per_node));
  if (options.step_time.has_value() && !r.step.has_value()) {
    FLASHCP_ASSIGN_OR_RETURN(
        r.step, ReportStepTime(strategy, r.plan, options.shape, options.step_time->layers,
                               options.step_time->cluster, options.step_time->cluster_name));
  }
  return r;
}

// One plan as a JSON line. planning_seconds stays 0 so that the output is
// deterministic; the cost report is the service's for a request naming no
// profile.
void WritePlanLine(const CliOptions& options, Strategy strategy, const PlannedBatch& p,
                   int64_t batch_id, std::ostream& out) {
  const PlanCostReport cost{std::string(kPairsProfile), options.plan.cost, false,
                            PredictPlanCost(options.plan.cost, p.plan)};
  out << PlanToJson(p.plan, p.metrics,
                    {.batch_id = static_cast<uint64_t>(batch_id),
                     .strategy = StrategyName(strategy),
                     .ilp = strategy == Strategy::kIlp ? &p.info : nullptr,
                     .cost = &cost,
                     .step = p.step.has_value() ? &*p.step : nullptr,
                     .step_per_rank =
                         options.step_time.has_value() && options.step_time->per_rank})
      << "\n";
}

// What the batches leave to write once read: the summary table, the SVG, the
// final flush (an output error is kExitBadInput).
int FinishCli(const CliOptions& options, const std::vector<SummaryAccumulator>& acc,
              const std::vector<PlanPanel>& svg_panels, int64_t done, std::ostream& out,
              std::ostream& err) {
  if (options.summary) {
    std::vector<StrategySummary> rows;
    for (Strategy s : options.strategies) rows.push_back(acc[static_cast<size_t>(s)].Finish());
    out << SummaryHeader(options) << FormatSummaryTable(rows);
    if (done == 0) err << kPrefix << "note: no batches in the input\n";
  }
  if (!options.svg_path.empty()) {
    if (absl::Status s = WriteSvg(options.svg_path, svg_panels, done); !s.ok()) {
      err << kPrefix << s.message() << "\n";
      return kExitBadInput;
    }
    if (done > 1) err << kPrefix << "note: --svg drew batch 0 of " << done << "\n";
  }
  out.flush();
  if (!out) {
    err << kPrefix << "error writing the output\n";
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace

int RunCli(const CliOptions& options, std::istream& in, std::ostream& out, std::ostream& err) {
  BatchSource source(options, in);
  if (absl::Status s = source.Open(); !s.ok()) {
    err << kPrefix << s.message() << "\n";
    return kExitBadInput;
  }
  if (options.pipeline) return RunPipelineCli(options, source, out, err);
  if (options.summary && options.from_all) NoteLeftOutOfAll(options, err);

  std::vector<SummaryAccumulator> acc;
  for (size_t id = 0; id < StrategyIdBound(); ++id) acc.emplace_back(static_cast<Strategy>(id));
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_progress = start;
  int64_t done = 0;
  std::vector<int64_t> docs;
  std::string where;
  std::vector<PlanPanel> svg_panels;
  const RealClock real_clock;  // the ILP's deadline
  PlanOptions plan_options = options.plan;
  while (true) {
    absl::StatusOr<bool> more = source.Next(docs, where);
    if (!more.ok()) {
      err << kPrefix << more.status().message() << "\n";
      return kExitBadInput;
    }
    if (!*more) break;
    const Batch batch{std::move(docs), options.cp_size};
    if (absl::Status s = ValidateBatch(batch); !s.ok()) {
      err << kPrefix << where << ": " << s.message() << "\n";
      return kExitBadInput;
    }
    for (const Strategy strategy : options.strategies) {
      absl::StatusOr<PlannedBatch> p = PlanOne(options, strategy, batch, real_clock, plan_options);
      if (!p.ok()) {
        err << kPrefix << where << ": " << StrategyName(strategy) << ": "
            << p.status().message() << "\n";
        return kExitBadInput;
      }
      if (!options.svg_path.empty() && done == 0) {
        svg_panels.push_back({std::string(StrategyName(strategy)), p->plan});
      }
      if (options.summary) {
        acc[static_cast<size_t>(strategy)].Add(p->metrics, p->ms);
        if (p->step.has_value()) acc[static_cast<size_t>(strategy)].AddStep(*p->step);
      } else {
        WritePlanLine(options, strategy, *p, done, out);
      }
    }
    if (!options.summary) out.flush();
    ++done;
    const Clock::time_point now = Clock::now();
    if (options.progress && now - last_progress >= std::chrono::seconds(1)) {
      last_progress = now;
      err << kPrefix << done;
      if (source.total() >= 0) err << "/" << source.total();
      err << " batches planned, " << absl::StrFormat("%.1f", Ms(now - start) / 1000) << " s\n";
    }
  }
  return FinishCli(options, acc, svg_panels, done, out, err);
}

}  // namespace flashcp::core
