#include "core/plan_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/analysis.h"
#include "core/mask.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

// Geometry, in SVG user units (pixels at 100%).
constexpr double kRankLabelWidth = 52;   // "rank 12" left of the rows
constexpr double kRowWidth = 560;        // C/N tokens
constexpr double kWorkloadWidth = 200;   // the workload label right of the rows
constexpr double kPanelGap = 24;
constexpr double kPanelWidth = kRankLabelWidth + kRowWidth + kWorkloadWidth;
constexpr double kRowHeight = 18;
constexpr double kRowGap = 5;
constexpr double kHeaderHeight = 48;  // title and metrics line above the rows
constexpr double kFooterHeight = 44;  // token axis and legend below them
constexpr double kMargin = 8;

std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control bytes are not allowed in XML 1.0 text; show them as '?'.
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') ? '?' : c;
    }
  }
  return out;
}

// A document's colour, as #rrggbb (every SVG renderer reads hex; not all read
// hsl()): hues a golden angle apart so that neighbouring documents differ,
// saturation 62%, lightness alternating 64% / 74% by parity for documents
// whose hues come close again.
std::string DocColour(int32_t doc) {
  const double h = std::fmod(static_cast<double>(doc) * 137.508, 360.0) / 60.0;
  const double l = doc % 2 == 0 ? 0.64 : 0.74, sat = 0.62;
  const double c = (1 - std::fabs(2 * l - 1)) * sat;
  const double x = c * (1 - std::fabs(std::fmod(h, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(h)) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x; break;
  }
  const double m = l - c / 2;
  auto byte = [m](double v) { return static_cast<int>(std::lround((v + m) * 255)); };
  return absl::StrFormat("#%02x%02x%02x", byte(r), byte(g), byte(b));
}

// Rank lists as "2, 5".
std::string Ranks(const std::vector<int32_t>& ranks) { return absl::StrJoin(ranks, ", "); }

struct PanelFacts {
  PlanMetrics metrics;
  // Per shard (index into Plan::shards): the ranks its KV goes to under the
  // targeted exchange, ascending; empty for a shard whose KV stays.
  std::vector<std::vector<int32_t>> dests;
  CommLayout layout;
};

absl::StatusOr<PanelFacts> Facts(const Plan& plan) {
  PanelFacts f;
  FLASHCP_ASSIGN_OR_RETURN(f.metrics, AnalyzePlan(plan, ModelShape{}));
  if (IsBlockDiffusion(plan.mask)) {
    // Under the mask a shard may send several parts (core/mask_layout.h):
    // the rows are the shards in rank order, the destinations per shard the
    // mask's exchange.
    MaskTraffic traffic = ComputeMaskTraffic(plan);
    f.dests = std::move(traffic.shard_dests);
    f.layout.ranks.resize(plan.cp_size);
    for (size_t i = 0; i < plan.shards.size(); ++i) {
      RankLayout& rank = f.layout.ranks[plan.shards[i].rank];
      rank.shard_offset.push_back(rank.shards.empty() ? 0
                                                      : rank.shard_offset.back() +
                                                            plan.shards[rank.shards.back()].len);
      rank.shards.push_back(static_cast<int32_t>(i));
    }
    return f;
  }
  FLASHCP_ASSIGN_OR_RETURN(f.layout, BuildCommLayout(plan));
  f.dests.assign(plan.shards.size(), {});
  for (int32_t r = 0; r < plan.cp_size; ++r) {
    const RankLayout& rank = f.layout.ranks[r];
    for (const TargetedSend& t : rank.targeted) {  // by dest ascending
      for (int32_t si : t.send_indices) f.dests[rank.send[si].shard].push_back(t.dest);
    }
  }
  return f;
}

void AppendPanel(const PlanPanel& panel, const PanelFacts& f, double x0, std::string& out) {
  const Plan& plan = panel.plan;
  const PlanMetrics& m = f.metrics;
  const double tpr = static_cast<double>(m.tokens_per_rank);
  const double rows_x = x0 + kRankLabelWidth;
  double mean = 0;
  for (double w : m.rank_workload) mean += w;
  mean /= static_cast<double>(plan.cp_size);
  const double max_w = *std::max_element(m.rank_workload.begin(), m.rank_workload.end());
  const int64_t targeted =
      m.bytes[static_cast<int>(CommScheme::kTargeted)].phase.bottleneck_tokens;

  absl::StrAppend(&out, "<g class=\"panel\" data-title=\"", XmlEscape(panel.title), "\">\n");
  absl::StrAppendFormat(&out, "<text class=\"title\" x=\"%.2f\" y=\"%.2f\">%s</text>\n", rows_x,
                        kMargin + 16, XmlEscape(panel.title));
  absl::StrAppendFormat(
      &out,
      "<text class=\"metrics\" x=\"%.2f\" y=\"%.2f\">imbalance %.4f, targeted phase %d tokens "
      "(%.3f C/N), %d cut document%s</text>\n",
      rows_x, kMargin + 34, m.imbalance, targeted, static_cast<double>(targeted) / tpr,
      m.cut_docs, m.cut_docs == 1 ? "" : "s");
  for (int32_t r = 0; r < plan.cp_size; ++r) {
    const double y = kMargin + kHeaderHeight + r * (kRowHeight + kRowGap);
    absl::StrAppendFormat(&out, "<g class=\"rank\" data-rank=\"%d\">\n", r);
    absl::StrAppendFormat(&out, "<text class=\"rank-label\" x=\"%.2f\" y=\"%.2f\">rank %d</text>\n",
                          rows_x - 6, y + 13, r);
    const RankLayout& rank = f.layout.ranks[r];
    for (size_t k = 0; k < rank.shards.size(); ++k) {
      const int32_t i = rank.shards[k];
      const Shard& s = plan.shards[i];
      const double x = rows_x + static_cast<double>(rank.shard_offset[k]) * kRowWidth / tpr;
      const double w = static_cast<double>(s.len) * kRowWidth / tpr;
      const bool moves = !f.dests[i].empty();
      const std::string where =
          moves ? absl::StrCat("KV sent to rank", f.dests[i].size() > 1 ? "s " : " ",
                               Ranks(f.dests[i]))
                : std::string("KV stays");
      absl::StrAppendFormat(
          &out,
          "<rect class=\"shard%s\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
          "fill=\"%s\" data-doc=\"%d\" data-start=\"%d\" data-len=\"%d\">"
          "<title>document %d, tokens [%d, %d), %d tokens; %s</title></rect>\n",
          moves ? " kv-moves" : "", x, y, w, kRowHeight, DocColour(s.doc), s.doc, s.start, s.len,
          s.doc, s.start, s.start + s.len, s.len, where);
      if (moves) {
        absl::StrAppendFormat(&out,
                              "<rect class=\"hatch\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                              "height=\"%.2f\" fill=\"url(#kv-moves)\"/>\n",
                              x, y, w, kRowHeight);
      }
    }
    const int64_t real = m.rank_tokens[r];
    if (real < m.tokens_per_rank) {
      const double x = rows_x + static_cast<double>(real) * kRowWidth / tpr;
      absl::StrAppendFormat(&out,
                            "<rect class=\"padding\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                            "height=\"%.2f\"><title>%d padding token%s</title></rect>\n",
                            x, y, static_cast<double>(m.tokens_per_rank - real) * kRowWidth / tpr,
                            kRowHeight, m.tokens_per_rank - real,
                            m.tokens_per_rank - real == 1 ? "" : "s");
    }
    absl::StrAppendFormat(
        &out, "<text class=\"workload%s\" x=\"%.2f\" y=\"%.2f\">%s</text>\n",
        m.rank_workload[r] == max_w ? " max" : "", rows_x + kRowWidth + 6, y + 13,
        WorkloadLabel(m.rank_workload[r], mean));
    out += "</g>\n";
  }
  const double axis_y = kMargin + kHeaderHeight + plan.cp_size * (kRowHeight + kRowGap) + 10;
  absl::StrAppendFormat(&out, "<text class=\"axis\" x=\"%.2f\" y=\"%.2f\">0</text>\n", rows_x,
                        axis_y);
  absl::StrAppendFormat(
      &out, "<text class=\"axis end\" x=\"%.2f\" y=\"%.2f\">C/N = %d tokens per rank</text>\n",
      rows_x + kRowWidth, axis_y, m.tokens_per_rank);
  out += "</g>\n";
}

}  // namespace

std::string WorkloadLabel(double workload, double mean_workload) {
  return absl::StrFormat("%.4g pairs, %.3f x mean", workload,
                         mean_workload > 0 ? workload / mean_workload : 0.0);
}

absl::StatusOr<std::string> PlansToSvg(const std::vector<PlanPanel>& panels) {
  if (panels.empty()) return absl::InvalidArgumentError("no plan to draw");
  std::vector<PanelFacts> facts;
  for (size_t p = 0; p < panels.size(); ++p) {
    const Plan& plan = panels[p].plan;
    if (p > 0 && (plan.cp_size != panels[0].plan.cp_size ||
                  plan.doc_lens != panels[0].plan.doc_lens)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "panel ", p, " (", panels[p].title, ") plans a different batch from panel 0 (",
          panels[0].title, "): side by side, panels must share doc_lens and cp_size"));
    }
    absl::StatusOr<PanelFacts> f = Facts(plan);
    if (!f.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("panel ", p, " (", panels[p].title, "): ", f.status().message()));
    }
    facts.push_back(*std::move(f));
  }
  const int32_t n = panels[0].plan.cp_size;
  const double width = 2 * kMargin + static_cast<double>(panels.size()) * kPanelWidth +
                       static_cast<double>(panels.size() - 1) * kPanelGap;
  const double legend_y = kMargin + kHeaderHeight + n * (kRowHeight + kRowGap) + 26;
  const double height = legend_y + kFooterHeight - 26 + kMargin;

  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  out +=
      "<defs><pattern id=\"kv-moves\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
      "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" "
      "stroke=\"#222\" stroke-width=\"1.6\"/></pattern></defs>\n"
      "<style>.shard{stroke:#fff;stroke-width:0.5}.kv-moves{stroke:#222;stroke-width:1}"
      ".hatch{pointer-events:none}.padding{fill:#bbb}.title{font-size:14px;font-weight:bold}"
      ".rank-label{text-anchor:end}.workload.max{font-weight:bold}.end{text-anchor:end}"
      ".axis,.legend{fill:#444}</style>\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  for (size_t p = 0; p < panels.size(); ++p) {
    AppendPanel(panels[p], facts[p], kMargin + static_cast<double>(p) * (kPanelWidth + kPanelGap),
                out);
  }
  const double lx = kMargin + kRankLabelWidth;
  absl::StrAppendFormat(
      &out,
      "<g class=\"legend\"><rect x=\"%.2f\" y=\"%.2f\" width=\"18\" height=\"12\" fill=\"#ddd\" "
      "stroke=\"#222\"/><rect x=\"%.2f\" y=\"%.2f\" width=\"18\" height=\"12\" "
      "fill=\"url(#kv-moves)\"/><text class=\"legend\" x=\"%.2f\" y=\"%.2f\">hatched: the "
      "shard's KV is sent to another rank (targeted exchange); colour: document; bold: the "
      "busiest rank</text></g>\n",
      lx, legend_y, lx, legend_y, lx + 24, legend_y + 10);
  out += "</svg>\n";
  return out;
}

}  // namespace flashcp::core
