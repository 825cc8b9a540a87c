#include "core/plan_svg.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;

// Occurrences of `needle` in `hay`.
int Count(absl::string_view hay, absl::string_view needle) {
  int n = 0;
  for (size_t pos = hay.find(needle); pos != absl::string_view::npos;
       pos = hay.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

// The text of panel `p`'s row for rank `r`: from its <g class="rank"> to the
// row's closing </g>.
std::string RankRow(const std::string& svg, int p, int r) {
  size_t at = 0;
  for (int k = 0; k <= p; ++k) at = svg.find("<g class=\"panel\"", k == 0 ? 0 : at + 1);
  const std::string open = absl::StrCat("<g class=\"rank\" data-rank=\"", r, "\">");
  const size_t b = svg.find(open, at);
  if (b == std::string::npos) return "";
  return svg.substr(b, svg.find("</g>", b) - b);
}

// Two documents (10 and 5 tokens) at N = 2: C/N = 8, one padding token on
// rank 1. Rank 0 holds doc 0 [0, 8), whose KV rank 1 needs; rank 1 holds doc
// 0 [8, 10) and doc 1 whole, whose KV stays. Workloads (Eq. 3): rank 0
// 9*8/2 = 36; rank 1 19*2/2 + 6*5/2 = 34; mean 35.
Plan SmallPlan() {
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {10, 5};
  plan.padding = 1;
  plan.shards = {{0, 0, 8, 0}, {0, 8, 2, 1}, {1, 0, 5, 1}};
  return plan;
}

TEST(PlanSvgTest, SmallPlanRowsShardsMarksAndLabels) {
  absl::StatusOr<std::string> svg = PlansToSvg({{"per hand", SmallPlan()}});
  ASSERT_THAT(svg, IsOk());
  EXPECT_EQ(Count(*svg, "<g class=\"panel\""), 1);
  EXPECT_EQ(Count(*svg, "<g class=\"rank\""), 2);

  const std::string r0 = RankRow(*svg, 0, 0), r1 = RankRow(*svg, 0, 1);
  EXPECT_EQ(Count(r0, "<rect class=\"shard"), 1);
  EXPECT_EQ(Count(r1, "<rect class=\"shard"), 2);
  EXPECT_EQ(Count(r0, "<rect class=\"shard kv-moves\""), 1);
  EXPECT_EQ(Count(r1, "<rect class=\"shard kv-moves\""), 0);
  EXPECT_EQ(Count(r0, "<rect class=\"hatch\""), 1);
  EXPECT_EQ(Count(r1, "<rect class=\"hatch\""), 0);
  EXPECT_EQ(Count(r0, "<rect class=\"padding\""), 0);
  EXPECT_EQ(Count(r1, "<rect class=\"padding\""), 1);

  // Exact geometry: rows start at x = 8 + 52, C/N = 8 tokens span 560 units.
  EXPECT_THAT(r0, HasSubstr("<rect class=\"shard kv-moves\" x=\"60.00\" y=\"56.00\" "
                            "width=\"560.00\" height=\"18.00\" fill=\"#dc6a6a\" "
                            "data-doc=\"0\" data-start=\"0\" data-len=\"8\"><title>document 0, "
                            "tokens [0, 8), 8 tokens; KV sent to rank 1</title></rect>"));
  EXPECT_THAT(r1, HasSubstr("<rect class=\"shard\" x=\"60.00\" y=\"79.00\" width=\"140.00\" "
                            "height=\"18.00\" fill=\"#dc6a6a\" data-doc=\"0\" "
                            "data-start=\"8\" data-len=\"2\"><title>document 0, tokens [8, 10), "
                            "2 tokens; KV stays</title></rect>"));
  EXPECT_THAT(r1, HasSubstr("<rect class=\"shard\" x=\"200.00\" y=\"79.00\" width=\"350.00\" "
                            "height=\"18.00\" fill=\"#94e6ac\" data-doc=\"1\" "
                            "data-start=\"0\" data-len=\"5\">"));
  EXPECT_THAT(r1, HasSubstr("<rect class=\"padding\" x=\"550.00\" y=\"79.00\" width=\"70.00\" "
                            "height=\"18.00\"><title>1 padding token</title></rect>"));

  EXPECT_THAT(r0, HasSubstr("<text class=\"workload max\" x=\"626.00\" y=\"69.00\">36 pairs, "
                            "1.029 x mean</text>"));
  EXPECT_THAT(r1, HasSubstr("<text class=\"workload\" x=\"626.00\" y=\"92.00\">34 pairs, "
                            "0.971 x mean</text>"));
  // Targeted phase (SPEC): rank 1 receives doc 0's 8 tokens, the bottleneck.
  EXPECT_THAT(*svg, HasSubstr(">imbalance 1.0286, targeted phase 8 tokens (1.000 C/N), "
                              "1 cut document</text>"));
  EXPECT_THAT(*svg, HasSubstr(">C/N = 8 tokens per rank</text>"));
}

// Under block diffusion: llama3 on one 8-token document, b = 4, N = 2
// (core/mask_test.cc, HandWorkedLlama3Exchange): rank 1's clean [0, 4)
// (plan document 1) is read by rank 0's clean block 1; nothing else moves.
TEST(PlanSvgTest, BlockDiffusionHatchesTheNeededCleanKv) {
  PlanOptions options;
  options.attention_mask = {MaskKind::kBlockDiffusion, 4};
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kLlama3, Batch{{8}, 2}, options);
  ASSERT_THAT(plan, IsOk());
  absl::StatusOr<std::string> svg = PlansToSvg({{"llama3", *plan}});
  ASSERT_THAT(svg, IsOk());
  const std::string r0 = RankRow(*svg, 0, 0), r1 = RankRow(*svg, 0, 1);
  EXPECT_EQ(Count(r0, "<rect class=\"shard"), 2);
  EXPECT_EQ(Count(r0, "<rect class=\"shard kv-moves\""), 0);
  EXPECT_EQ(Count(r1, "<rect class=\"shard kv-moves\""), 1);
  EXPECT_THAT(r1, HasSubstr("data-doc=\"1\" data-start=\"0\" data-len=\"4\"><title>document 1, "
                            "tokens [0, 4), 4 tokens; KV sent to rank 0</title>"));
  EXPECT_THAT(*svg, HasSubstr(">imbalance 1.0000, targeted phase 4 tokens (0.500 C/N), "));
}

TEST(PlanSvgTest, DeterministicForAFixedPlan) {
  absl::StatusOr<std::string> a = PlansToSvg({{"x", SmallPlan()}});
  absl::StatusOr<std::string> b = PlansToSvg({{"x", SmallPlan()}});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"828\" height=\"154\"", 0),
            0u);
  EXPECT_EQ(a->substr(a->size() - 7), "</svg>\n");
}

TEST(PlanSvgTest, WorkloadLabel) {
  EXPECT_EQ(WorkloadLabel(36, 35), "36 pairs, 1.029 x mean");
  EXPECT_EQ(WorkloadLabel(1.0737e9, 1.07e9), "1.074e+09 pairs, 1.003 x mean");
  EXPECT_EQ(WorkloadLabel(0, 0), "0 pairs, 0.000 x mean");
}

TEST(PlanSvgTest, TitlesAreEscaped) {
  absl::StatusOr<std::string> svg = PlansToSvg({{"a<b & \"c\"", SmallPlan()}});
  ASSERT_THAT(svg, IsOk());
  EXPECT_THAT(*svg, HasSubstr("data-title=\"a&lt;b &amp; &quot;c&quot;\""));
  EXPECT_EQ(Count(*svg, "a<b"), 0);
}

// Two strategies side by side: per panel and rank, one rect per shard of
// that rank, and exactly the shards of a document with a later piece on
// another rank marked (the oracle here is written from SPEC, not from
// BuildCommLayout).
TEST(PlanSvgTest, TwoStrategiesSideBySide) {
  const Batch batch{{3000, 700, 120, 5000, 64, 900, 2200, 16}, 4};
  std::vector<PlanPanel> panels;
  for (Strategy s : {Strategy::kPerDoc, Strategy::kFlashCp}) {
    absl::StatusOr<Plan> plan = MakePlan(s, batch);
    ASSERT_THAT(plan, IsOk());
    panels.push_back({std::string(StrategyName(s)), *plan});
  }
  absl::StatusOr<std::string> svg = PlansToSvg(panels);
  ASSERT_THAT(svg, IsOk());
  EXPECT_EQ(Count(*svg, "<g class=\"panel\""), 2);
  EXPECT_THAT(*svg, HasSubstr("<g class=\"panel\" data-title=\"per_doc\">"));
  EXPECT_THAT(*svg, HasSubstr("<g class=\"panel\" data-title=\"flashcp\">"));
  EXPECT_EQ(Count(*svg, "<g class=\"rank\""), 8);
  for (int p = 0; p < 2; ++p) {
    const Plan& plan = panels[p].plan;
    int total_moves = 0;
    for (int r = 0; r < 4; ++r) {
      int shards = 0, moves = 0;
      for (const Shard& s : plan.shards) {
        if (s.rank != r) continue;
        ++shards;
        bool later_elsewhere = false;
        for (const Shard& t : plan.shards) {
          later_elsewhere |= t.doc == s.doc && t.start > s.start && t.rank != r;
        }
        moves += later_elsewhere ? 1 : 0;
      }
      const std::string row = RankRow(*svg, p, r);
      EXPECT_EQ(Count(row, "<rect class=\"shard"), shards) << p << " rank " << r;
      EXPECT_EQ(Count(row, "<rect class=\"shard kv-moves\""), moves) << p << " rank " << r;
      EXPECT_EQ(Count(row, "<text class=\"workload"), 1) << p << " rank " << r;
      total_moves += moves;
    }
    // per_doc cuts every document in 2N pieces, so most shards move.
    if (p == 0) {
      EXPECT_GT(total_moves, 8);
    }
  }
  // The second panel starts one panel width (812) and a gap (24) to the right.
  EXPECT_THAT(*svg, HasSubstr("<text class=\"title\" x=\"896.00\" y=\"24.00\">flashcp</text>"));
}

TEST(PlanSvgTest, RefusesNoPanelsBadPlansAndMixedBatches) {
  EXPECT_THAT(PlansToSvg({}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no plan")));
  Plan bad = SmallPlan();
  bad.shards[1].len = 3;  // doc 0 no longer tiles [0, 10)
  EXPECT_THAT(PlansToSvg({{"ok", SmallPlan()}, {"bad", bad}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("panel 1 (bad): ")));
  Plan other = SmallPlan();
  other.doc_lens = {9, 6};
  other.shards = {{0, 0, 8, 0}, {0, 8, 1, 1}, {1, 0, 6, 1}};
  EXPECT_THAT(PlansToSvg({{"a", SmallPlan()}, {"b", other}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("panel 1 (b) plans a different batch from panel 0 (a)")));
}

}  // namespace
}  // namespace flashcp::core
