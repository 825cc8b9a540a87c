#include "core/cli_pipeline.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/file.h"
#include "core/pipeline_json.h"

namespace flashcp::core {

constexpr absl::string_view kPrefix = "flashcp-plan: ";

int PipelineCliRun::Batch(std::vector<int64_t> docs, const std::string& where) {
  PipelineRequest request = options_.pipeline_request;
  request.doc_lens = std::move(docs);
  for (size_t i = 0; i < options_.pipeline_strategies.size(); ++i) {
    const PipelineStrategy s = options_.pipeline_strategies[i];
    PipelineOptions o = options_.pipeline_options;
    o.strategy = s;
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(request, o);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Row& row = rows_[i];
    ++row.batches;
    row.plan_ms += ms;
    if (!plan.ok()) {
      if (options_.summary && plan.status().code() == absl::StatusCode::kFailedPrecondition) {
        continue;
      }
      err_ << kPrefix << where << ": " << PipelineStrategyName(s) << ": " << plan.status().message()
           << "\n";
      return kExitBadInput;
    }
    ++row.fits;
    row.iteration_s += plan->prediction.iteration_s;
    row.bubble += plan->prediction.bubble_share;
    row.recompute_s += plan->prediction.recompute_s;
    row.peak_bytes += *std::max_element(plan->prediction.stage_peak_bytes.begin(),
                                        plan->prediction.stage_peak_bytes.end());
    if (!options_.svg_path.empty() && done_ == 0 && i == 0) {
      absl::StatusOr<std::string> svg = PipelinePlanToSvg(*plan);
      if (!svg.ok()) {
        err_ << kPrefix << "--svg: " << svg.status().message() << "\n";
        return kExitBadInput;
      }
      svg_ = *std::move(svg);
    }
    if (!options_.summary) {
      out_ << PipelinePlanToJson(*plan, static_cast<uint64_t>(done_), 0.0) << "\n";
    }
  }
  if (!options_.summary) out_.flush();
  ++done_;
  return kExitOk;
}

int PipelineCliRun::Finish() {
  if (options_.summary) {
    const PipelineRequest& r = options_.pipeline_request;
    out_ << absl::StrFormat(
        "# flashcp-plan --pipeline summary: d_p = %d, d_s = %d, budget %.1f GiB, L = %d, "
        "D = %d; simulated (core/pipeline.h); means over the plans that fit\n",
        r.pp_size, r.sp_size, r.memory_budget_bytes / (1 << 30), r.model.layers, r.model.hidden);
    out_ << absl::StrFormat("%-14s %7s %5s %10s %7s %10s %9s %9s\n", "strategy", "batches", "fit",
                            "iter_s", "bubble", "recomp_s", "peak_GiB", "ms_mean");
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& w = rows_[i];
      const double n = std::max<int64_t>(1, w.fits);
      out_ << absl::StrFormat("%-14s %7d %5d %10.4f %6.1f%% %10.4f %9.2f %9.2f\n",
                              PipelineStrategyName(options_.pipeline_strategies[i]), w.batches,
                              w.fits, w.iteration_s / n, 100 * w.bubble / n, w.recompute_s / n,
                              w.peak_bytes / n / (1 << 30),
                              w.plan_ms / std::max<int64_t>(1, w.batches));
    }
    if (done_ == 0) err_ << kPrefix << "note: no batches in the input\n";
  }
  if (!options_.svg_path.empty()) {
    if (svg_.empty()) {
      err_ << kPrefix << "--svg: no plan to draw\n";
      return kExitBadInput;
    }
    if (absl::Status s = WriteFile("--svg", options_.svg_path, svg_); !s.ok()) {
      err_ << kPrefix << s.message() << "\n";
      return kExitBadInput;
    }
  }
  out_.flush();
  if (!out_) {
    err_ << kPrefix << "error writing the output\n";
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace flashcp::core
