#include "core/step_time.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;

// A shape of 8 bytes per token (K and V: 2 x 1 head x 4 dims x 1 byte).
ModelShape TinyShape() { return ModelShape{.heads = 1, .head_dim = 4, .dtype_bytes = 1}; }

// Round numbers: NVLink 32 B/s (a 4-token block in 1 s), 0.125 s a message;
// NIC 16 B/s, 0.5 s; one second per pair, forward a quarter; no merge.
ClusterSpec TinyCluster(int32_t ranks_per_node) {
  ClusterSpec c;
  c.ranks_per_node = ranks_per_node;
  c.nvlink_bytes_per_second = 32;
  c.nvlink_latency_seconds = 0.125;
  c.nic_bytes_per_second = 16;
  c.nic_latency_seconds = 0.5;
  c.compute = {1, 1, 0, 0};
  c.profile_query_heads = 1;
  c.profile_head_dim = 4;
  c.forward_fraction = 0.25;
  c.hbm_bytes_per_second = 0;
  return c;
}

// One 16-token document in four contiguous quarters on ranks 0..3.
Plan Quarters() {
  Plan p;
  p.cp_size = 4;
  p.doc_lens = {16};
  for (int32_t r = 0; r < 4; ++r) p.shards.push_back({0, 4 * r, 4, r});
  return p;
}

// SPEC's per_doc example: one 16-token document at N = 2; rank 0 holds
// [0, 4) and [12, 16), rank 1 [4, 12).
Plan PerDocExample() {
  Plan p;
  p.cp_size = 2;
  p.doc_lens = {16};
  p.shards = {{0, 0, 4, 0}, {0, 12, 4, 0}, {0, 4, 8, 1}};
  return p;
}

TEST(StepTimeTest, RingAllGatherOneNode) {
  // Non-last tokens 4, 4, 4, 0: blocks of 4 tokens = 32 bytes = 1 s on
  // NVLink; the all-gather receives 3 blocks in 3 steps: 3 + 3 x 0.125.
  // Workloads 10 (whole), 26, 42, 58 pairs.
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(Quarters(), TinyShape(), 1, TinyCluster(4), StepExchange::kAllGather);
  ASSERT_THAT(p, IsOk());
  const RankStepTime& r0 = p->ranks[0];
  EXPECT_DOUBLE_EQ(r0.exchange, 3.375);
  // The whole shard's forward (2.5 s) runs during the exchange: 0.875 s exposed;
  // its backward (7.5 s) hides the return entirely.
  EXPECT_DOUBLE_EQ(r0.forward, 3.375);
  EXPECT_DOUBLE_EQ(r0.backward, 7.5);
  EXPECT_DOUBLE_EQ(r0.exposed_exchange, 0.875);
  const RankStepTime& r3 = p->ranks[3];
  EXPECT_DOUBLE_EQ(r3.forward_compute, 14.5);
  EXPECT_DOUBLE_EQ(r3.backward_compute, 43.5);
  EXPECT_DOUBLE_EQ(r3.forward, 3.375 + 14.5);
  EXPECT_DOUBLE_EQ(r3.backward, 43.5 + 3.375);
  EXPECT_DOUBLE_EQ(p->forward_seconds, 17.875);
  EXPECT_DOUBLE_EQ(p->backward_seconds, 46.875);
  EXPECT_DOUBLE_EQ(p->compute_seconds, 58);
  EXPECT_DOUBLE_EQ(p->exchange_seconds, 6.75);
  EXPECT_DOUBLE_EQ(p->step_seconds, 64.75);
  EXPECT_DOUBLE_EQ(p->exposed_exchange_seconds, 6.75);

  // Full KV: blocks of C/N = 4 tokens too, so the same exchange; 32 layers x.
  absl::StatusOr<StepTimePrediction> full =
      PredictStepTime(Quarters(), TinyShape(), 32, TinyCluster(4), StepExchange::kFullKv);
  ASSERT_THAT(full, IsOk());
  EXPECT_DOUBLE_EQ(full->step_seconds, 32 * 64.75);
}

TEST(StepTimeTest, NoOverlapAddsTheExchange) {
  ClusterSpec c = TinyCluster(4);
  c.overlap_whole_shards = false;
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(Quarters(), TinyShape(), 1, c, StepExchange::kAllGather);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->ranks[0].forward, 2.5 + 3.375);
  EXPECT_DOUBLE_EQ(p->ranks[0].backward, 7.5 + 3.375);
  EXPECT_DOUBLE_EQ(p->step_seconds, 58 + 2 * 3.375);
}

TEST(StepTimeTest, TwoNodeTargetedExchange) {
  // One rank a node. Rank 0 receives [4, 12) (8 tokens, 64 bytes) and sends
  // [0, 4) (32 bytes): its node's NIC moves max(32, 64) = 64 bytes at 16 B/s:
  // 4 s + 0.5 s. Rank 1 mirrors it.
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(PerDocExample(), TinyShape(), 1, TinyCluster(1), StepExchange::kTargeted);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->ranks[0].exchange, 4.5);
  EXPECT_DOUBLE_EQ(p->ranks[1].exchange, 4.5);
  // Rank 0: whole [0, 4) 10 pairs, prefixed [12, 16) 58: forward
  // max(2.5, 4.5) + 14.5, backward 43.5 + max(7.5, 4.5).
  EXPECT_DOUBLE_EQ(p->ranks[0].forward, 19);
  EXPECT_DOUBLE_EQ(p->ranks[0].backward, 51);
  // Rank 1: prefixed [4, 12), 68 pairs: 4.5 + 17 and 51 + 4.5.
  EXPECT_DOUBLE_EQ(p->ranks[1].forward, 21.5);
  EXPECT_DOUBLE_EQ(p->ranks[1].backward, 55.5);
  EXPECT_DOUBLE_EQ(p->step_seconds, 77);
  EXPECT_DOUBLE_EQ(p->exposed_exchange_seconds, 9);

  // On one node the same bytes take NVLink: 64 / 32 + 0.125.
  absl::StatusOr<StepTimePrediction> one =
      PredictStepTime(PerDocExample(), TinyShape(), 1, TinyCluster(2), StepExchange::kTargeted);
  ASSERT_THAT(one, IsOk());
  EXPECT_DOUBLE_EQ(one->ranks[0].exchange, 2.125);

  // The compacted all-gather across the two nodes: blocks of max non-last
  // = 8 tokens (rank 1) = 64 bytes; each node receives the other's block over
  // its NIC: 4 s, + one NIC step.
  absl::StatusOr<StepTimePrediction> ag =
      PredictStepTime(PerDocExample(), TinyShape(), 1, TinyCluster(1), StepExchange::kAllGather);
  ASSERT_THAT(ag, IsOk());
  EXPECT_DOUBLE_EQ(ag->ranks[0].exchange, 4.5);
}

// Round numbers for the all-to-all's whole-document compute: one second per
// pair, four per sequence, a quarter per token.
ClusterSpec A2aCluster(int32_t ranks_per_node) {
  ClusterSpec c = TinyCluster(ranks_per_node);
  c.compute = {1, 1, 4, 0.25};
  return c;
}

TEST(StepTimeTest, AllToAllOneGroupOnOneNode) {
  // Hq = Hkv = 2, D = 2, 1 byte: rows of 2 bytes; Hq D / (1 x 4) = 1, the
  // profile's own scale. The one 16-token document's group is ranks {0, 1},
  // 8 tokens each: per phase each sends and receives t (2 Hq + 2 Hkv)
  // (K-1)/K = 32 rows = 64 bytes on NVLink: 2 s + two rounds of 0.125.
  const ModelShape shape{.heads = 2, .head_dim = 2, .dtype_bytes = 1};
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(PerDocExample(), shape, 1, A2aCluster(2), StepExchange::kAllToAll);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->inapplicable, "");
  // The analyzer's bytes, the model's input.
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(PerDocExample(), shape, 2);
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->bytes[static_cast<int>(CommScheme::kAllToAll)].phase.max_intra_node_bytes, 64);
  // Each rank: the whole document (136 pairs, 1 sequence, 16 tokens: 144 s)
  // for half the heads: 72 s, forward 18, backward 54; nothing overlaps.
  for (const RankStepTime& r : p->ranks) {
    EXPECT_DOUBLE_EQ(r.exchange, 2.25);
    EXPECT_DOUBLE_EQ(r.forward_compute, 18);
    EXPECT_DOUBLE_EQ(r.backward_compute, 54);
    EXPECT_DOUBLE_EQ(r.forward, 20.25);
    EXPECT_DOUBLE_EQ(r.backward, 56.25);
    EXPECT_DOUBLE_EQ(r.exposed_exchange, 4.5);
  }
  EXPECT_DOUBLE_EQ(p->compute_seconds, 72);
  EXPECT_DOUBLE_EQ(p->exchange_seconds, 4.5);
  EXPECT_DOUBLE_EQ(p->step_seconds, 76.5);
  EXPECT_DOUBLE_EQ(p->exposed_exchange_seconds, 4.5);
  // The CPU engine's no-overlap model: the same (there is nothing to overlap).
  ClusterSpec cpu = A2aCluster(2);
  cpu.overlap_whole_shards = false;
  absl::StatusOr<StepTimePrediction> q =
      PredictStepTime(PerDocExample(), shape, 3, cpu, StepExchange::kAllToAll);
  ASSERT_THAT(q, IsOk());
  EXPECT_DOUBLE_EQ(q->step_seconds, 3 * 76.5);
}

TEST(StepTimeTest, AllToAllAcrossTwoNodesTheNicDominates) {
  // Quarters, one group of 4 on two nodes of 2; Hq = Hkv = 4, D = 1, 1 byte
  // (scale 1): each rank (4 of the 16 tokens) sends 4 x 3 x 1 + 2 x 4 x 3 +
  // 12 x 1 = 48 rows a phase, 32 of them to the other node (and receives the
  // same). NVLink: 16 bytes / 32 + 2 x 0.125 = 0.75 s; the node's 64 bytes
  // over 2 x 16 B/s: 2 s + 2 x 0.5 = 3 s, the slower.
  const ModelShape shape{.heads = 4, .head_dim = 1, .dtype_bytes = 1};
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(Quarters(), shape, 2);
  ASSERT_THAT(m, IsOk());
  const PhaseTraffic& a2a = m->bytes[static_cast<int>(CommScheme::kAllToAll)].phase;
  EXPECT_EQ(a2a.max_intra_node_bytes, 16);
  EXPECT_EQ(a2a.max_inter_node_bytes, 32);
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(Quarters(), shape, 1, A2aCluster(2), StepExchange::kAllToAll);
  ASSERT_THAT(p, IsOk());
  // Compute: 144 s for the group's document over 4 ranks: 36, forward 9.
  for (const RankStepTime& r : p->ranks) {
    EXPECT_DOUBLE_EQ(r.exchange, 3);
    EXPECT_DOUBLE_EQ(r.forward, 9 + 3);
    EXPECT_DOUBLE_EQ(r.backward, 27 + 3);
  }
  EXPECT_DOUBLE_EQ(p->step_seconds, 42);
  EXPECT_DOUBLE_EQ(p->exchange_seconds, 6);
  EXPECT_DOUBLE_EQ(p->exposed_exchange_seconds, 6);
  // On one node all 48 rows take NVLink: 1.5 s + 2 x 0.125.
  p = PredictStepTime(Quarters(), shape, 1, A2aCluster(4), StepExchange::kAllToAll);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->ranks[0].exchange, 1.75);
}

TEST(StepTimeTest, AllToAllGroupsOfOneMoveNothing) {
  // Two 8-token documents, each whole on its rank: two groups of one; each
  // rank its own document (36 pairs + 4 + 2): as the all-gather, which moves
  // nothing either.
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {8, 8};
  plan.shards = {{0, 0, 8, 0}, {1, 0, 8, 1}};
  absl::StatusOr<std::array<StepTimePrediction, kNumStepExchanges>> all =
      PredictAllExchanges(plan, TinyShape(), 1, A2aCluster(2));
  ASSERT_THAT(all, IsOk());
  const StepTimePrediction& a2a = all->at(static_cast<int>(StepExchange::kAllToAll));
  EXPECT_EQ(a2a.exchange, StepExchange::kAllToAll);
  EXPECT_DOUBLE_EQ(a2a.ranks[1].exchange, 0);
  EXPECT_DOUBLE_EQ(a2a.step_seconds, 42);
  EXPECT_DOUBLE_EQ(all->at(static_cast<int>(StepExchange::kAllGather)).step_seconds, 42);
}

TEST(StepTimeTest, AllToAllInapplicableSaysWhyAndPredictsNoTime) {
  // Hq = 1 over the group of 4: the analyzer's message, no times; the other
  // exchanges are predicted as ever.
  absl::StatusOr<StepTimeReport> r =
      ReportStepTime(Strategy::kBasp, Quarters(), TinyShape(), 1, TinyCluster(4), "tiny");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exchange, StepExchange::kAllToAll);  // basp runs Ulysses, or nothing
  const StepTimePrediction& a2a = r->native();
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(Quarters(), TinyShape(), 4);
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT(a2a.inapplicable, HasSubstr("query_heads"));
  EXPECT_EQ(a2a.inapplicable, m->all_to_all_inapplicable);
  EXPECT_TRUE(a2a.ranks.empty());
  EXPECT_EQ(a2a.step_seconds, 0);
  EXPECT_EQ(a2a.exchange_seconds, 0);
  EXPECT_EQ(r->all[static_cast<int>(StepExchange::kAllGather)].inapplicable, "");
  EXPECT_DOUBLE_EQ(r->all[static_cast<int>(StepExchange::kAllGather)].step_seconds, 64.75);
  EXPECT_EQ(StepExchangeName(StepExchange::kAllToAll), "all_to_all");
  // Asked for alone: the same answer, not an error.
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(Quarters(), TinyShape(), 1, TinyCluster(4), StepExchange::kAllToAll);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->inapplicable, a2a.inapplicable);
  // Where it applies, basp's native prediction is the all-to-all's.
  const ModelShape four{.heads = 4, .head_dim = 1, .dtype_bytes = 1};
  r = ReportStepTime(Strategy::kBasp, Quarters(), four, 1, A2aCluster(2));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exchange, StepExchange::kAllToAll);
  EXPECT_DOUBLE_EQ(r->native().step_seconds, 42);
}

TEST(StepTimeTest, NicSharedByTheNodesGpus) {
  // Quarters on two nodes of two ranks; all-gather of 32-byte blocks: each
  // node receives the other node's 2 blocks (64 bytes) over 2 x 16 B/s = 2 s,
  // NVLink 3 blocks in 3 s: max 3 s + 1 NVLink step + 1 NIC step.
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(Quarters(), TinyShape(), 1, TinyCluster(2), StepExchange::kAllGather);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->ranks[0].exchange, 3.625);
  // Slower NICs (4 B/s): 64 / 8 = 8 s dominates.
  ClusterSpec slow = TinyCluster(2);
  slow.nic_bytes_per_second = 4;
  p = PredictStepTime(Quarters(), TinyShape(), 1, slow, StepExchange::kAllGather);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->ranks[0].exchange, 8.625);
}

TEST(StepTimeTest, RingAttentionOverlappedPerHop) {
  // Ring sharding of one 16-token document at N = 2: rank 0 [0, 8), rank 1
  // [8, 16). A hop carries C/N = 8 tokens = 64 bytes: 2 s + 0.125.
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {16};
  plan.shards = {{0, 0, 8, 0}, {0, 8, 8, 1}};
  ClusterSpec c = TinyCluster(2);
  // Merge: 2 fp32 passes of 1 x 4 floats = 32 bytes a query token at 64 B/s.
  c.hbm_bytes_per_second = 64;
  c.merge_passes = 2;
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(plan, TinyShape(), 1, c, StepExchange::kRing);
  ASSERT_THAT(p, IsOk());
  // Hop 0: each rank's own 36-pair triangle (forward 9, backward 27). Hop 1:
  // rank 1's queries against rank 0's keys, 64 pairs (16 and 48) plus the
  // merge of 8 query tokens (4 s); rank 0's queries see nothing of rank 1.
  // Forward: max(9, 2.125) + 20; backward: max(27, 4.25) + 52 + 2.125 (dK, dV
  // home).
  EXPECT_DOUBLE_EQ(p->forward_seconds, 29);
  EXPECT_DOUBLE_EQ(p->backward_seconds, 81.125);
  EXPECT_DOUBLE_EQ(p->compute_seconds, 108);
  EXPECT_DOUBLE_EQ(p->step_seconds, 110.125);
  EXPECT_DOUBLE_EQ(p->exposed_exchange_seconds, 2.125);
  EXPECT_DOUBLE_EQ(p->exchange_seconds, 4 * 2.125);
  EXPECT_DOUBLE_EQ(p->ranks[0].forward, 9);
  EXPECT_DOUBLE_EQ(p->ranks[0].backward, 29.125);
  EXPECT_DOUBLE_EQ(p->ranks[1].exchange, 2.125);

  // A slow link (16 s a hop): hop 0's transfers outlast its compute.
  c.nvlink_bytes_per_second = 4;
  p = PredictStepTime(plan, TinyShape(), 1, c, StepExchange::kRing);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->forward_seconds, 16.125 + 20);
  EXPECT_DOUBLE_EQ(p->backward_seconds, 32.25 + 52 + 16.125);
}

TEST(StepTimeTest, RingAttentionHopAcrossNodesTakesTheNic) {
  // The same two-rank ring on two nodes of one rank: a hop's 64 bytes go
  // over the NIC at 16 B/s: 4 s + 0.5 s, hidden behind hop 0's forward (9 s)
  // and, twice over (K, V and dK, dV), its backward (27 s); the last return
  // of dK, dV (4.5 s) is exposed.
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {16};
  plan.shards = {{0, 0, 8, 0}, {0, 8, 8, 1}};
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(plan, TinyShape(), 1, TinyCluster(1), StepExchange::kRing);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->ranks[0].exchange, 4.5);
  // Hop 1: rank 1's 64 cross pairs, forward 16, backward 48 (no merge).
  EXPECT_DOUBLE_EQ(p->forward_seconds, 9 + 16);
  EXPECT_DOUBLE_EQ(p->backward_seconds, 27 + 48 + 4.5);
  EXPECT_DOUBLE_EQ(p->exposed_exchange_seconds, 4.5);
  EXPECT_DOUBLE_EQ(p->exchange_seconds, 4 * 4.5);

  // Slow NICs (2 B/s: 32 s + 0.5 a hop) outlast hop 0's compute both ways.
  ClusterSpec slow = TinyCluster(1);
  slow.nic_bytes_per_second = 2;
  p = PredictStepTime(plan, TinyShape(), 1, slow, StepExchange::kRing);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->forward_seconds, 32.5 + 16);
  EXPECT_DOUBLE_EQ(p->backward_seconds, 65 + 48 + 32.5);
}

TEST(StepTimeTest, QueryHeadsScaleComputeNotBytes) {
  ModelShape gqa = TinyShape();
  gqa.heads = 1;
  gqa.query_heads = 4;
  ClusterSpec c = TinyCluster(4);
  absl::StatusOr<StepTimePrediction> p =
      PredictStepTime(Quarters(), gqa, 1, c, StepExchange::kAllGather);
  ASSERT_THAT(p, IsOk());
  EXPECT_DOUBLE_EQ(p->ranks[3].forward_compute, 4 * 14.5);
  EXPECT_DOUBLE_EQ(p->ranks[3].exchange, 3.375);
}

TEST(StepTimeTest, RefusesBadInputNamingTheField) {
  ClusterSpec c = TinyCluster(4);
  c.nvlink_bytes_per_second = 0;
  EXPECT_THAT(PredictStepTime(Quarters(), TinyShape(), 1, c, StepExchange::kFullKv),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nvlink_bytes_per_second")));
  c = TinyCluster(4);
  c.forward_fraction = 1;
  EXPECT_THAT(ValidateClusterSpec(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("forward_fraction")));
  c = TinyCluster(4);
  c.compute.whole_pair = -1;
  EXPECT_THAT(ValidateClusterSpec(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("compute.whole_pair")));
  c = TinyCluster(-1);
  EXPECT_THAT(ValidateClusterSpec(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranks_per_node")));
  ModelShape s = TinyShape();
  s.heads = 2;
  s.query_heads = 3;
  EXPECT_THAT(PredictStepTime(Quarters(), s, 1, TinyCluster(4), StepExchange::kFullKv),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("query_heads")));
  EXPECT_THAT(PredictStepTime(Quarters(), TinyShape(), 0, TinyCluster(4), StepExchange::kFullKv),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layers")));
  Plan bad = Quarters();
  bad.shards.pop_back();
  EXPECT_THAT(PredictStepTime(bad, TinyShape(), 1, TinyCluster(4), StepExchange::kFullKv),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ClusterPreset("tpu"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("h100-sxm")));
}

TEST(StepTimeTest, PresetsDifferOnlyWhereTheirDataSheetsDo) {
  absl::StatusOr<ClusterSpec> h100 = ClusterPreset("h100-sxm");
  absl::StatusOr<ClusterSpec> h200 = ClusterPreset("h200");
  ASSERT_THAT(h100, IsOk());
  ASSERT_THAT(h200, IsOk());
  EXPECT_THAT(ValidateClusterSpec(*h100), IsOk());
  EXPECT_DOUBLE_EQ(h100->nvlink_bytes_per_second, 450e9);
  EXPECT_DOUBLE_EQ(h100->nic_bytes_per_second, 50e9);
  EXPECT_DOUBLE_EQ(h100->hbm_bytes_per_second, 3.35e12);
  EXPECT_DOUBLE_EQ(h200->hbm_bytes_per_second, 4.8e12);
  EXPECT_EQ(h200->compute, CostProfile("h200-cudnn").value());
}

// Invariants on sampled batches, every strategy and exchange: finite,
// the step at least its slowest rank's compute, ranks' phases at most the
// step's.
TEST(StepTimeTest, InvariantsOnSampledBatches) {
  const ClusterSpec c = ClusterPreset("h100-sxm").value();
  ClusterSpec two_nodes = c;
  two_nodes.ranks_per_node = 4;
  for (const ClusterSpec& cluster : {c, two_nodes}) {
    for (int64_t k = 0; k < 4; ++k) {
      absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(Dataset::kPile, 32768, 7, k);
      ASSERT_THAT(docs, IsOk());
      for (Strategy s : {Strategy::kLlama3, Strategy::kPerDoc, Strategy::kRing,
                         Strategy::kZigzag, Strategy::kFlashCpPaper, Strategy::kMagi}) {
        absl::StatusOr<Plan> plan = MakePlan(s, Batch{*docs, 8});
        ASSERT_THAT(plan, IsOk());
        absl::StatusOr<std::array<StepTimePrediction, kNumStepExchanges>> all =
            PredictAllExchanges(*plan, ModelShape{}, 2, cluster);
        ASSERT_THAT(all, IsOk());
        for (const StepTimePrediction& p : *all) {
          EXPECT_TRUE(std::isfinite(p.step_seconds));
          EXPECT_GE(p.step_seconds, 2 * p.compute_seconds * (1 - 1e-12));
          for (const RankStepTime& r : p.ranks) {
            EXPECT_LE(r.forward, p.forward_seconds * (1 + 1e-12));
            EXPECT_LE(r.backward, p.backward_seconds * (1 + 1e-12));
            EXPECT_GE(r.exposed_exchange, -1e-12);
          }
        }
        // Full KV never moves less than the compacted all-gather.
        EXPECT_GE(all->at(0).exchange_seconds, all->at(1).exchange_seconds);
      }
    }
  }
}

}  // namespace
}  // namespace flashcp::core
