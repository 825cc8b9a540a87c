#include "core/pipeline_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/plan_json.h"

namespace flashcp::core {
namespace {

// Every double the pipeline mode writes is finite (times, bytes, gaps).
void AppendDouble(std::string& out, double v) {
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

template <typename T>
void AppendList(std::string& out, const std::vector<T>& v) {
  out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ',';
    if constexpr (std::is_floating_point_v<T>) {
      AppendDouble(out, v[i]);
    } else {
      absl::StrAppend(&out, v[i]);
    }
  }
  out += ']';
}

}  // namespace

std::string PipelinePlanToJson(const PipelinePlan& plan, uint64_t batch_id,
                               double planning_seconds) {
  std::string out = absl::StrCat("{\"batch_id\":", batch_id, ",\"strategy\":",
                                 JsonString(PipelineStrategyName(plan.strategy)), ",\"chunks\":[");
  for (size_t k = 0; k < plan.chunks.size(); ++k) {
    if (k > 0) out += ',';
    absl::StrAppend(&out, "{\"kind\":", JsonString(ChunkKindName(plan.chunks[k].kind)),
                    ",\"slices\":[");
    for (size_t i = 0; i < plan.chunks[k].slices.size(); ++i) {
      const PipelineSlice& s = plan.chunks[k].slices[i];
      absl::StrAppend(&out, i > 0 ? "," : "", "{\"doc\":", s.doc, ",\"start\":", s.start,
                      ",\"len\":", s.len, "}");
    }
    out += "]}";
  }
  out += "],\"pipelines\":[";
  for (size_t g = 0; g < plan.pipelines.size(); ++g) {
    out += g > 0 ? ",{\"forward\":" : "{\"forward\":";
    AppendList(out, plan.pipelines[g].forward);
    out += ",\"backward\":";
    AppendList(out, plan.pipelines[g].backward);
    out += '}';
  }
  out += "],\"ckpt\":[";
  for (size_t p = 0; p < plan.ckpt.size(); ++p) {
    if (p > 0) out += ',';
    AppendList(out, plan.ckpt[p]);
  }
  absl::StrAppend(&out, "],\"slice_count\":", plan.slice_count,
                  ",\"ckpt_solver\":", JsonString(plan.ckpt_solver), ",\"ckpt_gap\":");
  AppendDouble(out, plan.ckpt_gap);
  absl::StrAppend(&out, ",\"ckpt_optimal\":", plan.ckpt_optimal ? "true" : "false",
                  ",\"prediction\":{\"iteration_s\":");
  AppendDouble(out, plan.prediction.iteration_s);
  out += ",\"bubble_share\":";
  AppendDouble(out, plan.prediction.bubble_share);
  out += ",\"recompute_s\":";
  AppendDouble(out, plan.prediction.recompute_s);
  out += ",\"stage_peak_bytes\":";
  AppendList(out, plan.prediction.stage_peak_bytes);
  out += ",\"stage_model_state_bytes\":";
  AppendList(out, plan.prediction.stage_model_state_bytes);
  out += "},\"planning_seconds\":";
  AppendDouble(out, planning_seconds);
  out += '}';
  return out;
}

absl::StatusOr<std::string> PipelinePlanToSvg(const PipelinePlan& plan) {
  const PipelineSim& sim = plan.prediction;
  if (sim.ops.empty() || sim.iteration_s <= 0) {
    return absl::InvalidArgumentError("plan: no replayed ops to draw");
  }
  const int stages = static_cast<int>(sim.stage_peak_bytes.size());
  constexpr double kWidth = 1200, kRow = 40, kLeft = 70, kTop = 40;
  const double scale = kWidth / sim.iteration_s;
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" "
      "stroke=\"black\" stroke-width=\"2\"/></pattern></defs>\n"
      "<text x=\"%d\" y=\"20\">%s: %d chunks, %d pipeline(s), iteration %.4g s, bubble %.1f%%, "
      "recompute %.4g s (hatched); forward light, backward dark</text>\n",
      static_cast<int>(kLeft + kWidth + 20), static_cast<int>(kTop + kRow * stages + 30),
      static_cast<int>(kLeft), PipelineStrategyName(plan.strategy),
      static_cast<int>(plan.chunks.size()), static_cast<int>(plan.pipelines.size()),
      sim.iteration_s, 100 * sim.bubble_share, sim.recompute_s);
  for (int p = 0; p < stages; ++p) {
    absl::StrAppendFormat(&out, "<text x=\"4\" y=\"%.1f\">stage %d</text>\n",
                          kTop + kRow * p + kRow * 0.6, p);
  }
  for (const PipelineOp& op : sim.ops) {
    // Golden-angle hues tell neighbouring chunks apart.
    const int hue = static_cast<int>(std::fmod(op.chunk * 137.508, 360.0));
    const double x = kLeft + op.start_s * scale;
    const double w = std::max(0.5, (op.end_s - op.start_s) * scale);
    const double y = kTop + kRow * op.stage + 4;
    absl::StrAppendFormat(&out,
                          "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                          "fill=\"hsl(%d,70%%,%d%%)\" stroke=\"white\" stroke-width=\"0.5\">"
                          "<title>chunk %d %s</title></rect>\n",
                          x, y, w, kRow - 8, hue, op.backward ? 40 : 75, op.chunk,
                          op.backward ? "backward" : "forward");
    if (op.recompute_s > 0) {
      absl::StrAppendFormat(&out,
                            "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                            "fill=\"url(#hatch)\" fill-opacity=\"0.5\"/>\n",
                            x, y, std::max(0.5, op.recompute_s * scale), kRow - 8);
    }
  }
  out += "</svg>\n";
  return out;
}

}  // namespace flashcp::core
