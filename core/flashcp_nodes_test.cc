// Node placement (core/internal/flashcp_nodes.h).
#include "core/internal/flashcp_nodes.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::internal::InterNodeTokens;
using ::flashcp::core::internal::NodePlacement;
using ::flashcp::core::internal::PlaceRanksOnNodes;
using ::flashcp::core::internal::RelabelRanks;
using ::flashcp::core::testing::IsOk;
using ::testing::ElementsAre;

// 1 head x 1 dim x 1 byte: a token of K and V is 2 bytes.
constexpr ModelShape kTiny{1, 1, 1};

int64_t AnalyzedInterTokens(const Plan& plan, int32_t ranks_per_node) {
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(plan, kTiny, ranks_per_node);
  EXPECT_THAT(m.status(), IsOk());
  if (!m.ok()) return -1;
  return m->bytes[static_cast<int>(CommScheme::kTargeted)].phase.inter_node_bytes / 2;
}

int64_t PlanInterTokens(const Plan& plan, int32_t ranks_per_node) {
  return InterNodeTokens(TargetedPairTokens(plan), plan.cp_size, ranks_per_node);
}

// Docs [8, 8] on 4 ranks, 4 tokens each: doc 0 over ranks 0 and 2, doc 1
// over ranks 1 and 3; rank 0 sends doc 0's head (4 tokens) to rank 2, rank 1
// doc 1's to rank 3.
Plan CrossedPairs() {
  Plan plan;
  plan.cp_size = 4;
  plan.doc_lens = {8, 8};
  plan.shards = {{0, 0, 4, 0}, {1, 0, 4, 1}, {0, 4, 4, 2}, {1, 4, 4, 3}};
  return plan;
}

struct PlacementCase {
  const char* name;
  Plan plan;
  int32_t per_node;
  int64_t inter_before;           // targeted inter-node tokens of one phase
  std::vector<int32_t> new_rank;  // NodePlacement
  int64_t inter_after;
};

// Hand-checked placements. Each plan's ranks hold C/N = 4 tokens (3 where
// padded); "a-b" is the pair of ranks a and b, its weight the tokens they
// exchange both ways.
std::vector<PlacementCase> PlacementCases() {
  return {
      // Nodes {0, 1}, {2, 3}; weights 0-2 and 1-3 of 4, both across. From
      // the plan's own nodes the best first swap is 0 and 3 (gain 8: each
      // joins its partner; 1 and 2 gain as much, later ids): nodes {1, 3},
      // {0, 2}, which take ids 0, 1 and 2, 3 in rank order.
      {"crossed pairs", CrossedPairs(), 2, 8, {2, 0, 3, 1}, 0},
      // Docs [8, 7] (15 tokens: one padding token, on rank 3): doc 0 over
      // ranks 0 and 2, doc 1 over 1 and 3. Rank 3 is the only one of its
      // count, so it keeps id 3 and node 1; swapping 1 and 2 pairs everyone.
      {"padded rank keeps its count",
       Plan{4, {8, 7}, 1, {{0, 0, 4, 0}, {1, 0, 4, 1}, {0, 4, 4, 2}, {1, 4, 3, 3}}, {}},
       2,
       8,
       {0, 2, 1, 3},
       0},
      // Docs [7, 7] (two padding tokens, ranks 2 and 3): pairs 0-2 and 1-3
      // across nodes {0, 1}, {2, 3}, but every relabeling that keeps the
      // counts keeps those nodes: nothing changes.
      {"no swap within counts",
       Plan{4, {7, 7}, 2, {{0, 0, 4, 0}, {1, 0, 4, 1}, {0, 4, 3, 2}, {1, 4, 3, 3}}, {}},
       2,
       8,
       {0, 1, 2, 3},
       8},
      // N = 5, nodes {0, 1}, {2, 3} and {4} (the last one smaller,
      // AnalyzePlan's rule). Docs [8, 8, 4]: doc 0 over ranks 0 and 4, doc 1
      // over 1 and 2, doc 2 whole on 3. Kernighan-Lin from the plan's nodes:
      // swap 0 and 2 (gain 4: 1 joins 2), then 3 and 4 (gain 4: 4 joins 0):
      // nodes {1, 2}, {0, 4}, {3}.
      {"last node smaller",
       Plan{5,
            {8, 8, 4},
            0,
            {{0, 0, 4, 0}, {1, 0, 4, 1}, {1, 4, 4, 2}, {2, 0, 4, 3}, {0, 4, 4, 4}}, {}},
       2,
       8,
       {2, 0, 1, 4, 3},
       0},
      // Docs [12, 12] on 6 ranks, 3 a node: doc 0 over ranks 0, 1, 3, doc 1
      // over 2, 4, 5, each in that order (rank 0 sends [0, 4) to 1 and 3,
      // rank 1 sends [4, 8) to 3: weights 0-1, 0-3, 1-3 of 4; doc 1 alike).
      // Own nodes {0, 1, 2}, {3, 4, 5}: 0-3, 1-3, 2-4, 2-5 cross. Swapping
      // 2 and 3 gains 16 (0 and 3, or 2 and 4, gain 0): nodes {0, 1, 3},
      // {2, 4, 5}.
      {"two triangles join",
       Plan{6,
            {12, 12},
            0,
            {{0, 0, 4, 0}, {0, 4, 4, 1}, {1, 0, 4, 2}, {0, 8, 4, 3}, {1, 4, 4, 4}, {1, 8, 4, 5}}, {}},
       3,
       16,
       {0, 1, 3, 2, 4, 5},
       0},
  };
}

TEST(NodePlacementTest, HandChecked) {
  for (const PlacementCase& c : PlacementCases()) {
    SCOPED_TRACE(c.name);
    ASSERT_THAT(ValidatePlan(c.plan), IsOk());
    EXPECT_EQ(AnalyzedInterTokens(c.plan, c.per_node), c.inter_before);
    EXPECT_EQ(PlanInterTokens(c.plan, c.per_node), c.inter_before);
    EXPECT_EQ(NodePlacement(c.plan, c.per_node), c.new_rank);
    const Plan placed = PlaceRanksOnNodes(c.plan, c.per_node, {});
    EXPECT_EQ(placed.shards, RelabelRanks(c.plan, c.new_rank).shards);
    EXPECT_THAT(ValidatePlan(placed), IsOk());
    EXPECT_EQ(AnalyzedInterTokens(placed, c.per_node), c.inter_after);
    EXPECT_EQ(PlanInterTokens(placed, c.per_node), c.inter_after);
  }
  // The first case in full: rank 0 <- old 1, 1 <- 3, 2 <- 0, 3 <- 2.
  EXPECT_EQ(PlaceRanksOnNodes(CrossedPairs(), 2, {}).shards,
            (std::vector<Shard>{{1, 0, 4, 0}, {1, 4, 4, 1}, {0, 0, 4, 2}, {0, 4, 4, 3}}));
}

TEST(NodePlacementTest, OneNodeOrSpeedsLeavePlan) {
  const Plan plan = CrossedPairs();
  for (int32_t per_node : {0, 4, 5}) {
    SCOPED_TRACE(per_node);
    EXPECT_THAT(NodePlacement(plan, per_node), ElementsAre(0, 1, 2, 3));
    const Plan placed = PlaceRanksOnNodes(plan, per_node, {});
    EXPECT_EQ(placed.shards, plan.shards);
  }
  // Speeds that differ: ranks are not interchangeable.
  EXPECT_EQ(PlaceRanksOnNodes(plan, 2, {1.0, 1.0, 1.5, 1.0}).shards, plan.shards);
  // Equal speeds: they are.
  EXPECT_EQ(AnalyzedInterTokens(PlaceRanksOnNodes(plan, 2, {1.25, 1.25, 1.25, 1.25}), 2), 0);
}

TEST(RelabelRanksTest, MovesEachRanksShardsInOrder) {
  Plan plan;
  plan.cp_size = 3;
  plan.doc_lens = {3, 3};
  plan.shards = {{0, 0, 1, 0}, {1, 2, 1, 0}, {0, 1, 2, 1}, {1, 0, 2, 2}};
  const Plan out = RelabelRanks(plan, std::vector<int32_t>{2, 0, 1});
  EXPECT_EQ(out.shards,
            (std::vector<Shard>{{0, 1, 2, 0}, {1, 0, 2, 1}, {0, 0, 1, 2}, {1, 2, 1, 2}}));
  EXPECT_THAT(ValidatePlan(out), IsOk());
}

// Per rank, what relabeling must carry with the rank's shards.
using RankLoad = std::tuple<double, int64_t, int64_t, int64_t, int64_t>;
std::vector<RankLoad> SortedLoads(const PlanMetrics& m) {
  const PhaseTraffic& t = m.bytes[static_cast<int>(CommScheme::kTargeted)].phase;
  std::vector<RankLoad> loads;
  for (size_t r = 0; r < m.rank_workload.size(); ++r) {
    loads.emplace_back(m.rank_workload[r], m.rank_tokens[r], m.rank_nonlast_tokens[r],
                       t.sent_tokens[r], t.received_tokens[r]);
  }
  std::sort(loads.begin(), loads.end());
  return loads;
}

// Random batches and strategies: the placed plan is valid, carries the same
// per-rank loads (workload, tokens, non-last tokens, targeted sends and
// receives), so the same imbalance and bottlenecks exactly, and never more
// inter-node tokens; TargetedPairTokens agrees with AnalyzePlan's split on
// both and with BuildCommLayout's targeted sends.
TEST(NodePlacementPropertyTest, RandomBatches) {
  constexpr Strategy kStrategies[] = {Strategy::kFlashCp, Strategy::kPerDoc, Strategy::kMagi,
                                      Strategy::kLlama3,  Strategy::kZigzag, Strategy::kWholeDoc};
  SplitMix64Rng rng(13);
  int lowered = 0;
  constexpr int kBatches = 3000;
  for (int i = 0; i < kBatches; ++i) {
    const int32_t n = 3 + static_cast<int32_t>(rng.Next() % 14);                 // 3..16
    const int32_t per_node = 1 + static_cast<int32_t>(rng.Next() % (n - 1));    // 1..N-1
    const int64_t context = n * (8 + static_cast<int64_t>(rng.Next() % 500));
    std::vector<int64_t> docs;
    int64_t total = 0;
    // Context minus up to N - 1 tokens, so that some batches are padded.
    const int64_t want = context - static_cast<int64_t>(rng.Next() % n);
    while (total < want) {
      const bool longdoc = rng.Next() % 4 == 0;
      int64_t len = 1 + static_cast<int64_t>(rng.Next() % (longdoc ? context : 64));
      len = std::min(len, want - total);
      docs.push_back(len);
      total += len;
    }
    const Strategy strategy = kStrategies[i % std::size(kStrategies)];
    SCOPED_TRACE(::testing::Message() << "batch " << i << " N " << n << " per_node " << per_node
                                      << " strategy " << StrategyName(strategy));
    absl::StatusOr<Plan> plan = MakePlan(strategy, Batch{docs, n});
    ASSERT_THAT(plan.status(), IsOk());
    const Plan placed = PlaceRanksOnNodes(*plan, per_node, {});
    ASSERT_THAT(ValidatePlan(placed), IsOk());
    absl::StatusOr<PlanMetrics> before = AnalyzePlan(*plan, kTiny, per_node);
    absl::StatusOr<PlanMetrics> after = AnalyzePlan(placed, kTiny, per_node);
    ASSERT_THAT(before.status(), IsOk());
    ASSERT_THAT(after.status(), IsOk());
    EXPECT_EQ(SortedLoads(*before), SortedLoads(*after));
    EXPECT_EQ(before->imbalance, after->imbalance);
    EXPECT_EQ(before->max_nonlast_tokens, after->max_nonlast_tokens);
    for (CommScheme s : kAllCommSchemes) {
      EXPECT_EQ(before->bytes[static_cast<int>(s)].phase.bottleneck_tokens,
                after->bytes[static_cast<int>(s)].phase.bottleneck_tokens);
    }
    const PhaseTraffic& b = before->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
    const PhaseTraffic& a = after->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
    EXPECT_EQ(b.intra_node_bytes + b.inter_node_bytes, a.intra_node_bytes + a.inter_node_bytes);
    EXPECT_LE(a.inter_node_bytes, b.inter_node_bytes);
    EXPECT_EQ(PlanInterTokens(*plan, per_node) * 2, b.inter_node_bytes);
    EXPECT_EQ(PlanInterTokens(placed, per_node) * 2, a.inter_node_bytes);
    // The pair tokens are the engine's layout's targeted sends.
    absl::StatusOr<CommLayout> layout = BuildCommLayout(*plan);
    ASSERT_THAT(layout.status(), IsOk());
    std::vector<int64_t> sends(static_cast<size_t>(n) * n, 0);
    for (int32_t r = 0; r < n; ++r) {
      for (const TargetedSend& t : layout->ranks[r].targeted) sends[r * n + t.dest] = t.tokens;
    }
    EXPECT_EQ(TargetedPairTokens(*plan), sends);
    if (a.inter_node_bytes < b.inter_node_bytes) {
      ++lowered;
    } else {
      EXPECT_EQ(placed.shards, plan->shards);  // no gain: the plan itself
    }
  }
  // Not vacuous: many plans have ranks worth placing.
  EXPECT_GT(lowered, kBatches / 10);
}

// MakePlan's flashcp places its ranks (the stage is its last) and leaves
// them where ranks_per_node is 0 or where rank speeds differ.
TEST(NodePlacementPropertyTest, FlashCpPlansArePlaced) {
  for (Dataset dataset : kAllDatasets) {
    absl::StatusOr<std::vector<std::vector<int64_t>>> batches =
        SampleBatches(dataset, 131072, 4, 1);
    ASSERT_THAT(batches.status(), IsOk());
    for (const std::vector<int64_t>& docs : *batches) {
      const Batch batch{docs, 16};
      PlanOptions options;
      options.ranks_per_node = 4;
      absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, batch, options);
      ASSERT_THAT(plan.status(), IsOk());
      // Placed already: another placement finds nothing lower.
      EXPECT_EQ(PlanInterTokens(PlaceRanksOnNodes(*plan, 4, {}), 4), PlanInterTokens(*plan, 4));
    }
  }
}

}  // namespace
}  // namespace flashcp::core
