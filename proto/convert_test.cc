#include "proto/convert.h"

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/analysis.h"
#include "core/plan_hash.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::proto {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::PlanRequest GoodRequest() {
  v1::PlanRequest r;
  r.set_batch_id(7);
  r.add_doc_lens(5);
  r.add_doc_lens(3);
  r.set_cp_size(2);
  return r;
}

TEST(RequestFromProtoTest, ZeroFieldsTakeTheProtoDefaults) {
  absl::StatusOr<PlanInput> in = RequestFromProto(GoodRequest(), core::BatchLimits{});
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->batch_id, 7u);
  EXPECT_THAT(in->batch.doc_lens, ElementsAre(5, 3));
  EXPECT_EQ(in->batch.cp_size, 2);
  EXPECT_EQ(in->strategy, core::Strategy::kFlashCp);
  EXPECT_EQ(in->options.target_imbalance, 1.02);
  EXPECT_EQ(in->options.min_shard_tokens, 128);
  EXPECT_EQ(in->options.ranks_per_node, 0);
  EXPECT_EQ(in->shape.heads, 32);
  EXPECT_EQ(in->shape.head_dim, 128);
  EXPECT_EQ(in->shape.dtype_bytes, 2);
  EXPECT_FALSE(in->include_layout);
}

TEST(RequestFromProtoTest, ExplicitFieldsAreKept) {
  v1::PlanRequest r = GoodRequest();
  r.set_strategy("ring");
  r.set_target_imbalance(1.5);
  r.set_min_shard_tokens(64);
  r.set_ranks_per_node(8);
  r.set_heads(8);
  r.set_head_dim(64);
  r.set_dtype_bytes(4);
  r.set_include_layout(true);
  absl::StatusOr<PlanInput> in = RequestFromProto(r, core::BatchLimits{});
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->strategy, core::Strategy::kRing);
  EXPECT_EQ(in->options.target_imbalance, 1.5);
  EXPECT_EQ(in->options.min_shard_tokens, 64);
  EXPECT_EQ(in->options.ranks_per_node, 8);
  EXPECT_EQ(in->shape.heads, 8);
  EXPECT_EQ(in->shape.head_dim, 64);
  EXPECT_EQ(in->shape.dtype_bytes, 4);
  EXPECT_TRUE(in->include_layout);
}

TEST(RequestFromProtoTest, ClusterPresetWithOverrides) {
  v1::PlanRequest r = GoodRequest();
  EXPECT_FALSE(RequestFromProto(r, core::BatchLimits{})->step_time.has_value());
  r.set_cluster("h100-sxm");
  r.set_ranks_per_node(1);
  r.set_query_heads(64);
  r.set_layers(48);
  r.set_include_rank_step_times(true);
  r.set_choose_by_step_time(true);
  r.mutable_cluster_spec()->set_nic_bytes_per_second(25e9);
  r.mutable_cluster_spec()->set_overlap_whole_shards(false);
  absl::StatusOr<PlanInput> in = RequestFromProto(r, core::BatchLimits{});
  ASSERT_THAT(in, IsOk());
  ASSERT_TRUE(in->step_time.has_value());
  EXPECT_EQ(in->shape.query_heads, 64);
  EXPECT_EQ(in->step_time->cluster_name, "h100-sxm");
  EXPECT_EQ(in->step_time->layers, 48);
  EXPECT_TRUE(in->step_time->per_rank);
  EXPECT_TRUE(in->choose_by_step_time);
  const core::ClusterSpec& c = in->step_time->cluster;
  EXPECT_EQ(c.ranks_per_node, 1);
  EXPECT_EQ(c.nic_bytes_per_second, 25e9);
  EXPECT_FALSE(c.overlap_whole_shards);
  EXPECT_EQ(c.nvlink_bytes_per_second, core::ClusterPreset("h100-sxm")->nvlink_bytes_per_second);
  EXPECT_EQ(c.hbm_bytes_per_second, 3.35e12);
}

TEST(RequestFromProtoTest, RequestToProtoRoundTrips) {
  core::Batch batch{{10, 20, 30}, 4};
  core::PlanOptions options;
  options.target_imbalance = 1.1;
  options.min_shard_tokens = 300;
  options.ranks_per_node = 2;
  const v1::PlanRequest r = RequestToProto(
      99, batch, core::Strategy::kZigzag, options, core::ModelShape{16, 64, 1}, true);
  EXPECT_EQ(r.strategy(), "zigzag");
  absl::StatusOr<PlanInput> in = RequestFromProto(r, core::BatchLimits{});
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->batch_id, 99u);
  EXPECT_THAT(in->batch.doc_lens, ElementsAre(10, 20, 30));
  EXPECT_EQ(in->batch.cp_size, 4);
  EXPECT_EQ(in->strategy, core::Strategy::kZigzag);
  EXPECT_EQ(in->options.target_imbalance, 1.1);
  EXPECT_EQ(in->options.min_shard_tokens, 300);
  EXPECT_EQ(in->options.ranks_per_node, 2);
  EXPECT_EQ(in->shape.heads, 16);
  EXPECT_EQ(in->shape.head_dim, 64);
  EXPECT_EQ(in->shape.dtype_bytes, 1);
  EXPECT_TRUE(in->include_layout);
}

TEST(RequestFromProtoTest, RankSpeedsRoundTripWithACostModel) {
  core::Batch batch{{10, 20, 30}, 4};
  core::PlanOptions options;
  options.rank_speed = {1.0, 0.5, 2.0, 1.25};
  const v1::PlanRequest r = RequestToProto(1, batch, core::Strategy::kFlashCp, options,
                                           core::ModelShape{}, false, "cpu-fp32");
  absl::StatusOr<PlanInput> in = RequestFromProto(r, core::BatchLimits{});
  ASSERT_THAT(in, IsOk());
  EXPECT_THAT(in->options.rank_speed, ElementsAre(1.0, 0.5, 2.0, 1.25));
  EXPECT_EQ(in->cost_profile, "cpu-fp32");
}

TEST(RequestFromProtoTest, MinShardTokensMinusOneTurnsTheRuleOff) {
  struct Case {
    int64_t wire;
    int64_t core;
  };
  const Case cases[] = {{-1, 0}, {0, 128}, {1, 1}, {256, 256}, {int64_t{1} << 40, int64_t{1} << 40}};
  for (const Case& c : cases) {
    v1::PlanRequest r = GoodRequest();
    r.set_min_shard_tokens(c.wire);
    absl::StatusOr<PlanInput> in = RequestFromProto(r, core::BatchLimits{});
    ASSERT_THAT(in, IsOk()) << c.wire;
    EXPECT_EQ(in->options.min_shard_tokens, c.core) << c.wire;
  }
}

TEST(RequestFromProtoTest, RequestToProtoSendsMinShardOffAsMinusOne) {
  core::PlanOptions options;
  options.min_shard_tokens = 0;
  v1::PlanRequest r = RequestToProto(1, core::Batch{{4, 4}, 2}, core::Strategy::kFlashCp, options,
                                     core::ModelShape{}, false);
  EXPECT_EQ(r.min_shard_tokens(), -1);
  absl::StatusOr<PlanInput> in = RequestFromProto(r, core::BatchLimits{});
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->options.min_shard_tokens, 0);
  options.min_shard_tokens = 128;
  r = RequestToProto(1, core::Batch{{4, 4}, 2}, core::Strategy::kFlashCp, options,
                     core::ModelShape{}, false);
  EXPECT_EQ(r.min_shard_tokens(), 128);
}

struct BadCase {
  std::string name;
  std::function<void(v1::PlanRequest&)> mutate;
  absl::StatusCode code;
  std::string message;  // exact
};

TEST(RequestFromProtoTest, EveryBadFieldIsNamedWithItsCode) {
  const std::vector<BadCase> cases = {
      {"empty doc_lens", [](v1::PlanRequest& r) { r.clear_doc_lens(); },
       absl::StatusCode::kInvalidArgument, "doc_lens: the batch has no documents"},
      {"zero length", [](v1::PlanRequest& r) { r.set_doc_lens(1, 0); },
       absl::StatusCode::kInvalidArgument,
       "doc_lens[1]: a document length must be at least 1, got 0"},
      {"negative length", [](v1::PlanRequest& r) { r.set_doc_lens(0, -4); },
       absl::StatusCode::kInvalidArgument,
       "doc_lens[0]: a document length must be at least 1, got -4"},
      {"cp_size 0", [](v1::PlanRequest& r) { r.set_cp_size(0); },
       absl::StatusCode::kInvalidArgument, "cp_size: must be at least 1, got 0"},
      {"cp_size above tokens", [](v1::PlanRequest& r) { r.set_cp_size(9); },
       absl::StatusCode::kInvalidArgument, "cp_size: 9 ranks is more than the batch's 8 tokens"},
      {"unknown strategy", [](v1::PlanRequest& r) { r.set_strategy("magic"); },
       absl::StatusCode::kInvalidArgument,
       "strategy: unknown strategy \"magic\" (llama3, per_doc, ring, zigzag, whole_doc, "
       "flashcp_paper, flashcp, ilp, magi, csbp, basp)"},
      {"query_heads not a multiple of heads",
       [](v1::PlanRequest& r) {
         r.set_heads(8);
         r.set_query_heads(12);
       },
       absl::StatusCode::kInvalidArgument,
       "query_heads: must be 0 (equal to heads) or a multiple of heads (8) in [1, 1024], got 12"},
      {"inter_node_weight below 1", [](v1::PlanRequest& r) { r.set_inter_node_weight(0.5); },
       absl::StatusCode::kInvalidArgument,
       "inter_node_weight: must be a finite ratio in [1, 1000] (NVLink : NIC), got 0.5"},
      {"target_imbalance below 1", [](v1::PlanRequest& r) { r.set_target_imbalance(0.5); },
       absl::StatusCode::kInvalidArgument,
       "target_imbalance: must be a finite ratio >= 1 (0 means 1.02), got 0.5"},
      {"target_imbalance negative", [](v1::PlanRequest& r) { r.set_target_imbalance(-1); },
       absl::StatusCode::kInvalidArgument,
       "target_imbalance: must be a finite ratio >= 1 (0 means 1.02), got -1"},
      {"target_imbalance NaN",
       [](v1::PlanRequest& r) { r.set_target_imbalance(std::nan("")); },
       absl::StatusCode::kInvalidArgument,
       "target_imbalance: must be a finite ratio >= 1 (0 means 1.02), got nan"},
      {"query_heads negative", [](v1::PlanRequest& r) { r.set_query_heads(-2); },
       absl::StatusCode::kInvalidArgument,
       "query_heads: must be 0 (equal to heads) or a multiple of heads (32) in [1, 1024], got -2"},
      {"unknown cluster", [](v1::PlanRequest& r) { r.set_cluster("tpu"); },
       absl::StatusCode::kInvalidArgument,
       "cluster: cluster preset \"tpu\" is unknown; known: h100-sxm, h200"},
      {"cluster_spec bandwidth 0",
       [](v1::PlanRequest& r) { r.mutable_cluster_spec()->set_nic_bytes_per_second(0); },
       absl::StatusCode::kInvalidArgument,
       "cluster_spec.nic_bytes_per_second: must be finite and > 0, got 0"},
      {"cluster_spec forward_fraction",
       [](v1::PlanRequest& r) {
         r.set_cluster("h200");
         r.mutable_cluster_spec()->set_forward_fraction(1.5);
       },
       absl::StatusCode::kInvalidArgument,
       "cluster_spec.forward_fraction: must be in (0, 1), got 1.5"},
      {"layers without a cluster", [](v1::PlanRequest& r) { r.set_layers(4); },
       absl::StatusCode::kInvalidArgument,
       "cluster: layers and include_rank_step_times need a cluster (cluster or cluster_spec)"},
      {"layers negative",
       [](v1::PlanRequest& r) {
         r.set_cluster("h200");
         r.set_layers(-1);
       },
       absl::StatusCode::kInvalidArgument, "layers: must be in [1, 100000], got -1"},
      {"query_heads not a multiple",
       [](v1::PlanRequest& r) {
         r.set_cluster("h200");
         r.set_heads(4);
         r.set_query_heads(6);
       },
       absl::StatusCode::kInvalidArgument,
       "query_heads: must be 0 (equal to heads) or a multiple of heads (4) in [1, 1024], got 6"},
      {"choose_by_step_time without a cluster",
       [](v1::PlanRequest& r) { r.set_choose_by_step_time(true); },
       absl::StatusCode::kInvalidArgument,
       "choose_by_step_time: needs a cluster (cluster or cluster_spec)"},
      {"ranks_per_node negative", [](v1::PlanRequest& r) { r.set_ranks_per_node(-1); },
       absl::StatusCode::kInvalidArgument,
       "ranks_per_node: must be in [0, 65536] (0: one node), got -1"},
      {"ranks_per_node above 65536", [](v1::PlanRequest& r) { r.set_ranks_per_node(65537); },
       absl::StatusCode::kInvalidArgument,
       "ranks_per_node: must be in [0, 65536] (0: one node), got 65537"},
      {"min_shard_tokens below -1", [](v1::PlanRequest& r) { r.set_min_shard_tokens(-2); },
       absl::StatusCode::kInvalidArgument,
       "min_shard_tokens: must be -1 (off), 0 (the default 128) or a token count in [1, 2^40], "
       "got -2"},
      {"min_shard_tokens above 2^40",
       [](v1::PlanRequest& r) { r.set_min_shard_tokens((int64_t{1} << 40) + 1); },
       absl::StatusCode::kInvalidArgument,
       "min_shard_tokens: must be -1 (off), 0 (the default 128) or a token count in [1, 2^40], "
       "got 1099511627777"},
      {"negative heads", [](v1::PlanRequest& r) { r.set_heads(-1); },
       absl::StatusCode::kInvalidArgument, "heads: must be in [1, 1024], got -1"},
      {"head_dim too big", [](v1::PlanRequest& r) { r.set_head_dim(2048); },
       absl::StatusCode::kInvalidArgument, "head_dim: must be in [1, 1024], got 2048"},
      {"dtype 3 bytes", [](v1::PlanRequest& r) { r.set_dtype_bytes(3); },
       absl::StatusCode::kInvalidArgument, "dtype_bytes: must be 1, 2 or 4, got 3"},
      {"rank_speed on pairs",
       [](v1::PlanRequest& r) {
         r.add_rank_speed(1);
         r.add_rank_speed(1);
       },
       absl::StatusCode::kInvalidArgument,
       "rank_speed: needs a cost model other than pairs (cost_profile or cost)"},
      {"rank_speed count",
       [](v1::PlanRequest& r) {
         r.set_cost_profile("cpu-fp32");
         r.add_rank_speed(1);
       },
       absl::StatusCode::kInvalidArgument,
       "rank_speed: 1 entries for 2 ranks (give none or one per rank)"},
      {"rank_speed above 2",
       [](v1::PlanRequest& r) {
         r.set_cost_profile("cpu-fp32");
         r.add_rank_speed(1);
         r.add_rank_speed(3);
       },
       absl::StatusCode::kInvalidArgument, "rank_speed[1]: must be finite and in [0.5, 2], got 3"},
  };
  for (const BadCase& c : cases) {
    v1::PlanRequest r = GoodRequest();
    c.mutate(r);
    EXPECT_EQ(RequestFromProto(r, core::BatchLimits{}).status(), absl::Status(c.code, c.message))
        << c.name;
  }
}

TEST(RequestFromProtoTest, BatchesAboveTheServerLimitsAreResourceExhausted) {
  core::BatchLimits limits;
  limits.max_docs = 1;
  EXPECT_EQ(RequestFromProto(GoodRequest(), limits).status(),
            absl::ResourceExhaustedError("doc_lens: 2 documents, above this server's limit of 1"));
  limits = core::BatchLimits{};
  limits.max_tokens = 7;
  EXPECT_EQ(RequestFromProto(GoodRequest(), limits).status(),
            absl::ResourceExhaustedError("doc_lens: 8 tokens, above this server's limit of 7"));
  limits = core::BatchLimits{};
  limits.max_cp_size = 1;
  EXPECT_EQ(RequestFromProto(GoodRequest(), limits).status(),
            absl::ResourceExhaustedError("cp_size: 2 ranks, above this server's limit of 1"));
}

// docs [5, 3] on 2 ranks with "ring": rank 0 holds doc 0 [0,4); rank 1 holds
// doc 0 [4,5) and doc 1 [0,3). Worked by hand: workloads (2p+s+1)s/2 are
// 10 and 5 + 6 = 11; rank 0's 4 tokens are doc 0's non-last shard.
struct RingPlan {
  core::Plan plan;
  core::PlanMetrics metrics;
  core::CommLayout layout;
};
RingPlan MakeRingPlan() {
  RingPlan r;
  r.plan = *core::MakePlan(core::Strategy::kRing, core::Batch{{5, 3}, 2});
  r.metrics = *core::AnalyzePlan(r.plan, core::ModelShape{});
  r.layout = *core::BuildCommLayout(r.plan);
  return r;
}

TEST(ResponseToProtoTest, RingPlanHandWorked) {
  const RingPlan ring = MakeRingPlan();
  const v1::PlanResponse p = ResponseToProto(7, core::Strategy::kRing, ring.plan, ring.metrics,
                                             nullptr, 0.25);
  EXPECT_EQ(p.batch_id(), 7u);
  EXPECT_FALSE(p.has_error());
  EXPECT_EQ(p.strategy(), "ring");
  EXPECT_EQ(p.cp_size(), 2);
  EXPECT_THAT(p.doc_lens(), ElementsAre(5, 3));
  EXPECT_EQ(p.padding(), 0);
  ASSERT_EQ(p.shards_size(), 3);
  const std::vector<std::vector<int64_t>> want = {{0, 0, 4, 0}, {0, 4, 1, 1}, {1, 0, 3, 1}};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.shards(i).doc(), want[i][0]) << i;
    EXPECT_EQ(p.shards(i).start(), want[i][1]) << i;
    EXPECT_EQ(p.shards(i).len(), want[i][2]) << i;
    EXPECT_EQ(p.shards(i).rank(), want[i][3]) << i;
  }
  const v1::PlanMetrics& m = p.metrics();
  EXPECT_DOUBLE_EQ(m.imbalance_ratio(), 11.0 / 10.5);
  EXPECT_EQ(m.comm_saving_ratio(), 0.0);
  EXPECT_EQ(m.targeted_saving_ratio(), 0.0);
  EXPECT_EQ(m.tokens_per_rank(), 4);
  EXPECT_THAT(m.rank_tokens(), ElementsAre(4, 4));
  EXPECT_THAT(m.rank_workload(), ElementsAre(10.0, 11.0));
  EXPECT_THAT(m.rank_nonlast_tokens(), ElementsAre(4, 0));
  EXPECT_THAT(m.rank_segments(), ElementsAre(1, 2));
  EXPECT_EQ(m.cut_docs(), 1);
  EXPECT_EQ(m.min_cut_shard_len(), 1);
  EXPECT_EQ(m.planning_seconds(), 0.25);
  // H*D*dtype = 32*128*2 = 8192 bytes per token. full_kv and allgather:
  // 4 * 4 tokens * (N-1) * 8192; targeted: 2 * 8192 * 4 tokens each way,
  // one phase's bottleneck 4 tokens (65536 bytes), both phases 131072.
  ASSERT_EQ(m.bytes_size(), 4);
  // all_to_all within the one group of 2 (Hq = H = 32): per rank and phase
  // 4 * 16 (Q) + 2 * 4 * 16 (K, V) + 4 * 16 (O) = 256 rows of D * 2 bytes.
  EXPECT_EQ(m.bytes(3).scheme(), "all_to_all");
  EXPECT_EQ(m.bytes(3).phase_bottleneck_bytes(), 65536);
  EXPECT_EQ(m.bytes(3).bottleneck_bytes(), 131072);
  EXPECT_THAT(m.bytes(3).phase_inter_node_sent_bytes(), ElementsAre(0, 0));
  EXPECT_EQ(m.all_to_all_inapplicable(), "");
  EXPECT_EQ(m.bytes(0).scheme(), "full_kv");
  EXPECT_THAT(m.bytes(0).sent_bytes(), ElementsAre(131072, 131072));
  EXPECT_THAT(m.bytes(0).received_bytes(), ElementsAre(131072, 131072));
  EXPECT_EQ(m.bytes(0).bottleneck_bytes(), 131072);
  EXPECT_EQ(m.bytes(1).scheme(), "allgather");
  EXPECT_EQ(m.bytes(1).bottleneck_bytes(), 131072);
  EXPECT_EQ(m.bytes(2).scheme(), "targeted");
  EXPECT_THAT(m.bytes(2).sent_bytes(), ElementsAre(65536, 65536));
  EXPECT_THAT(m.bytes(2).received_bytes(), ElementsAre(65536, 65536));
  EXPECT_EQ(m.bytes(2).bottleneck_bytes(), 131072);
  EXPECT_THAT(m.bytes(2).phase_sent_tokens(), ElementsAre(4, 0));
  EXPECT_THAT(m.bytes(2).phase_received_tokens(), ElementsAre(0, 4));
  EXPECT_EQ(m.bytes(2).phase_max_sent_tokens(), 4);
  EXPECT_EQ(m.bytes(2).phase_max_received_tokens(), 4);
  EXPECT_EQ(m.bytes(2).phase_bottleneck_tokens(), 4);
  EXPECT_EQ(m.bytes(2).phase_max_sent_bytes(), 65536);
  EXPECT_EQ(m.bytes(2).phase_max_received_bytes(), 65536);
  EXPECT_EQ(m.bytes(2).phase_bottleneck_bytes(), 65536);
  EXPECT_EQ(m.bytes(0).phase_bottleneck_tokens(), 4);
  EXPECT_EQ(m.cheaper_scheme(), "allgather");  // 4 tokens a phase either way: the tie
  EXPECT_EQ(p.layout_size(), 0);
  // core/plan_hash_test's pinned value of this plan.
  EXPECT_EQ(p.plan_hash(), "acb8cc4eb63dfe48");
  EXPECT_EQ(p.planner_version(), core::PlannerVersion());
}

TEST(ResponseToProtoTest, LayoutWhenAsked) {
  const RingPlan ring = MakeRingPlan();
  const v1::PlanResponse p = ResponseToProto(7, core::Strategy::kRing, ring.plan, ring.metrics,
                                             &ring.layout, 0.0);
  ASSERT_EQ(p.layout_size(), 2);
  const v1::RankLayout& r0 = p.layout(0);
  EXPECT_EQ(r0.rank(), 0);
  EXPECT_THAT(r0.shards(), ElementsAre(0));
  ASSERT_EQ(r0.sends_size(), 1);
  EXPECT_EQ(r0.sends(0).shard(), 0);
  EXPECT_EQ(r0.sends(0).offset(), 0);
  EXPECT_EQ(r0.sends(0).len(), 4);
  EXPECT_EQ(r0.send_tokens(), 4);
  ASSERT_EQ(r0.targeted_size(), 1);
  EXPECT_EQ(r0.targeted(0).dest(), 1);
  EXPECT_THAT(r0.targeted(0).send_indices(), ElementsAre(0));
  EXPECT_EQ(r0.targeted(0).tokens(), 4);
  const v1::RankLayout& r1 = p.layout(1);
  EXPECT_EQ(r1.rank(), 1);
  EXPECT_THAT(r1.shards(), ElementsAre(1, 2));
  EXPECT_EQ(r1.sends_size(), 0);
  EXPECT_EQ(r1.send_tokens(), 0);
  EXPECT_EQ(r1.targeted_size(), 0);
}

TEST(ResponseFromProtoTest, RoundTripsPlanAndMetrics) {
  const RingPlan ring = MakeRingPlan();
  v1::PlanResponse p = ResponseToProto(7, core::Strategy::kRing, ring.plan, ring.metrics,
                                       nullptr, 0.125);
  absl::StatusOr<PlanResult> back = ResponseFromProto(p);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->batch_id, 7u);
  EXPECT_EQ(back->strategy, "ring");
  EXPECT_EQ(back->planning_seconds, 0.125);
  EXPECT_EQ(back->plan_hash, "acb8cc4eb63dfe48");
  EXPECT_EQ(back->planner_version, core::PlannerVersion());
  EXPECT_EQ(back->plan.cp_size, 2);
  EXPECT_THAT(back->plan.doc_lens, ElementsAre(5, 3));
  EXPECT_EQ(back->plan.padding, 0);
  EXPECT_THAT(back->plan.shards,
              ElementsAre(core::Shard{0, 0, 4, 0}, core::Shard{0, 4, 1, 1},
                          core::Shard{1, 0, 3, 1}));
  const core::PlanMetrics& m = back->metrics;
  EXPECT_EQ(m.tokens_per_rank, ring.metrics.tokens_per_rank);
  EXPECT_EQ(m.padding, 0);
  EXPECT_EQ(m.rank_tokens, ring.metrics.rank_tokens);
  EXPECT_EQ(m.rank_workload, ring.metrics.rank_workload);
  EXPECT_EQ(m.imbalance, ring.metrics.imbalance);
  EXPECT_EQ(m.rank_nonlast_tokens, ring.metrics.rank_nonlast_tokens);
  EXPECT_EQ(m.max_nonlast_tokens, 4);
  EXPECT_EQ(m.comm_saving, ring.metrics.comm_saving);
  EXPECT_EQ(m.targeted_saving, ring.metrics.targeted_saving);
  for (int s = 0; s < core::kNumCommSchemes; ++s) {
    EXPECT_EQ(m.bytes[s].sent, ring.metrics.bytes[s].sent) << s;
    EXPECT_EQ(m.bytes[s].received, ring.metrics.bytes[s].received) << s;
    EXPECT_EQ(m.bytes[s].bottleneck, ring.metrics.bytes[s].bottleneck) << s;
    const core::PhaseTraffic& got = m.bytes[s].phase;
    const core::PhaseTraffic& want = ring.metrics.bytes[s].phase;
    EXPECT_EQ(got.sent_tokens, want.sent_tokens) << s;
    EXPECT_EQ(got.received_tokens, want.received_tokens) << s;
    EXPECT_EQ(got.max_sent_tokens, want.max_sent_tokens) << s;
    EXPECT_EQ(got.max_received_tokens, want.max_received_tokens) << s;
    EXPECT_EQ(got.bottleneck_tokens, want.bottleneck_tokens) << s;
    EXPECT_EQ(got.max_sent_bytes, want.max_sent_bytes) << s;
    EXPECT_EQ(got.max_received_bytes, want.max_received_bytes) << s;
    EXPECT_EQ(got.bottleneck_bytes, want.bottleneck_bytes) << s;
  }
  EXPECT_EQ(m.rank_segments, ring.metrics.rank_segments);
  EXPECT_EQ(m.cheaper_scheme, ring.metrics.cheaper_scheme);
  EXPECT_EQ(m.cut_docs, 1);
  EXPECT_EQ(m.min_cut_shard_len, 1);
  EXPECT_THAT(core::ValidatePlan(back->plan), IsOk());
}

TEST(ResponseFromProtoTest, UnknownSchemesAreSkipped) {
  const RingPlan ring = MakeRingPlan();
  v1::PlanResponse p = ResponseToProto(7, core::Strategy::kRing, ring.plan, ring.metrics,
                                       nullptr, 0.0);
  v1::SchemeBytes* extra = p.mutable_metrics()->add_bytes();
  extra->set_scheme("from_the_future");
  extra->set_bottleneck_bytes(1);
  absl::StatusOr<PlanResult> back = ResponseFromProto(p);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->metrics.bytes[2].bottleneck, 131072);
}

TEST(ResponseFromProtoTest, PerRankListsMustHaveCpSizeEntries) {
  struct Case {
    void (*edit)(v1::PlanMetrics&);
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::PlanMetrics& m) { m.clear_rank_tokens(); },
       "metrics.rank_tokens: want cp_size = 2 entries (one per rank), got 0"},
      {[](v1::PlanMetrics& m) { m.add_rank_workload(1.0); },
       "metrics.rank_workload: want cp_size = 2 entries (one per rank), got 3"},
      {[](v1::PlanMetrics& m) { m.mutable_rank_nonlast_tokens()->RemoveLast(); },
       "metrics.rank_nonlast_tokens: want cp_size = 2 entries (one per rank), got 1"},
      {[](v1::PlanMetrics& m) { m.clear_rank_segments(); },
       "metrics.rank_segments: want cp_size = 2 entries (one per rank), got 0"},
      {[](v1::PlanMetrics& m) { m.mutable_bytes(1)->mutable_sent_bytes()->RemoveLast(); },
       "metrics.bytes[1].sent_bytes: want cp_size = 2 entries (one per rank), got 1"},
      {[](v1::PlanMetrics& m) { m.mutable_bytes(2)->add_received_bytes(0); },
       "metrics.bytes[2].received_bytes: want cp_size = 2 entries (one per rank), got 3"},
      {[](v1::PlanMetrics& m) { m.add_rank_speed(1.0); },
       "metrics.rank_speed: want cp_size = 2 entries (one per rank), got 1"},
  };
  const RingPlan ring = MakeRingPlan();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    v1::PlanResponse p = ResponseToProto(7, core::Strategy::kRing, ring.plan, ring.metrics,
                                         nullptr, 0.0);
    c.edit(*p.mutable_metrics());
    EXPECT_EQ(ResponseFromProto(p).status(), absl::InvalidArgumentError(c.message));
  }
}

TEST(ResponseFromProtoTest, AResponseWithoutMetricsIsRefused) {
  v1::PlanResponse p;
  p.set_cp_size(4);
  EXPECT_EQ(ResponseFromProto(p).status(),
            absl::InvalidArgumentError(
                "metrics.rank_tokens: want cp_size = 4 entries (one per rank), got 0"));
}

TEST(RequestFromProtoTest, AHugeStrategyIsEchoedTruncated) {
  v1::PlanRequest r = GoodRequest();
  r.set_strategy(std::string(1 << 20, 'x'));
  EXPECT_EQ(RequestFromProto(r, core::BatchLimits{}).status(),
            absl::InvalidArgumentError(
                "strategy: unknown strategy \"" + std::string(64, 'x') +
                "\"... (1048576 bytes) (llama3, per_doc, ring, zigzag, whole_doc, "
                "flashcp_paper, flashcp, ilp, magi, csbp, basp)"));
  r.set_strategy("\xff\n");
  EXPECT_EQ(RequestFromProto(r, core::BatchLimits{}).status().message().substr(0, 35),
            "strategy: unknown strategy \"\\xff\\n\"");
}

TEST(MaxRequestBytesTest, HandWorkedAndAboveTheWidestValidRequest) {
  // Per field: batch_id 11, 65,536 unpacked doc_lens of 1 + 4 bytes, cp_size
  // 11, "flashcp_paper" 15, target_imbalance 9, heads, head_dim, dtype_bytes
  // 33, include_layout 2, min_shard_tokens 11, ranks_per_node 11,
  // cost_profile 2 + 64, cost 2 + 4 x 9, 1,024 unpacked rank_speed of 9;
  // query_heads 12, cluster 3 + 64, cluster_spec 4 + 8 x 9 + 38 + 2 x 11 + 2,
  // layers 12, include_rank_step_times and choose_by_step_time 3 each;
  // choose_schemes 3, inter_node_weight 10; attention_mask 2 + 1 + 15,
  // block_size 2 + 10.
  EXPECT_EQ(MaxRequestBytes(core::BatchLimits{65536, int64_t{1} << 24, 1024}), 337'381);
  const core::BatchLimits limits{100, 1000, 8};
  v1::PlanRequest r;
  r.set_batch_id(UINT64_MAX);
  for (int i = 0; i < 100; ++i) r.add_doc_lens(10);
  r.set_cp_size(8);
  r.set_strategy("flashcp_paper");
  r.set_target_imbalance(1.5);
  r.set_heads(-1);  // the widest int32 (refused later, but parsed)
  r.set_head_dim(-1);
  r.set_dtype_bytes(-1);
  r.set_include_layout(true);
  r.set_min_shard_tokens(-1);
  r.set_ranks_per_node(-1);
  r.set_cost_profile(std::string(kMaxCostProfileBytes, 'p'));  // with cost: refused, but parsed
  r.mutable_cost()->set_whole_pair(1.5);
  r.mutable_cost()->set_prefixed_pair(1.5);
  r.mutable_cost()->set_sequence(1.5);
  r.mutable_cost()->set_token(1.5);
  for (int i = 0; i < 8; ++i) r.add_rank_speed(1.5);
  r.set_query_heads(-1);
  r.set_cluster(std::string(kMaxCostProfileBytes, 'c'));
  v1::ClusterSpec* c = r.mutable_cluster_spec();
  c->set_nvlink_bytes_per_second(1.5);
  c->set_nvlink_latency_seconds(1.5);
  c->set_nic_bytes_per_second(1.5);
  c->set_nic_latency_seconds(1.5);
  c->mutable_compute()->set_whole_pair(1.5);
  c->mutable_compute()->set_prefixed_pair(1.5);
  c->mutable_compute()->set_sequence(1.5);
  c->mutable_compute()->set_token(1.5);
  c->set_profile_query_heads(-1);
  c->set_profile_head_dim(-1);
  c->set_compute_scale(1.5);
  c->set_forward_fraction(1.5);
  c->set_hbm_bytes_per_second(1.5);
  c->set_merge_passes(1.5);
  c->set_overlap_whole_shards(true);
  r.set_layers(-1);
  r.set_include_rank_step_times(true);
  r.set_choose_by_step_time(true);
  r.set_attention_mask("block_diffusion");
  r.set_block_size(-1);  // the widest int64 (refused later, but parsed)
  EXPECT_LE(static_cast<int64_t>(r.ByteSizeLong()), MaxRequestBytes(limits));
  // Unpacked doc_lens of the largest length: tag and varint each.
  EXPECT_LE(static_cast<int64_t>(r.ByteSizeLong()) - (2 + 100) + 100 * (1 + 2),
            MaxRequestBytes(limits));
}

// The bound is above the real response for every strategy, with and without
// the layout, on random batches (the ILP's on small ones).
TEST(MaxResponseBytesTest, BoundsRealResponsesOnRandomBatches) {
  std::mt19937_64 rng(99);
  for (int i = 0; i < 120; ++i) {
    PlanInput in;
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 150)(rng);
    for (int64_t d = 0; d < n; ++d) {
      const bool long_doc = std::uniform_int_distribution<int>(0, 9)(rng) == 0;
      in.batch.doc_lens.push_back(
          std::uniform_int_distribution<int64_t>(1, long_doc ? 40000 : 3000)(rng));
    }
    in.batch.cp_size = static_cast<int32_t>(std::min<int64_t>(
        core::TotalTokens(in.batch.doc_lens), std::uniform_int_distribution<int32_t>(1, 48)(rng)));
    in.batch_id = rng();
    for (core::Strategy s : core::AllStrategies()) {
      if (s == core::Strategy::kIlp) continue;  // proto links no ILP (CBC); its plans are plans
      if (s == core::Strategy::kBasp) continue;  // refuses unequal documents (basp_test)
      in.strategy = s;
      absl::StatusOr<core::Plan> plan = core::MakePlan(s, in.batch, in.options);
      ASSERT_THAT(plan, IsOk());
      absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(*plan, in.shape);
      ASSERT_THAT(metrics, IsOk());
      absl::StatusOr<core::CommLayout> layout = core::BuildCommLayout(*plan);
      ASSERT_THAT(layout, IsOk());
      for (bool with_layout : {false, true}) {
        in.include_layout = with_layout;
        const core::PlanCostReport cost{std::string(kMaxCostProfileBytes, 'p'),
                                        {1.5, 1.5, 1.5, 1.5}, true,
                                        core::PredictPlanCost(
                                            {1.5, 1.5, 1.5, 1.5}, *plan,
                                            std::vector<double>(in.batch.cp_size, 1.5))};
        v1::PlanResponse r = ResponseToProto(in.batch_id, s, *plan, *metrics,
                                             with_layout ? &*layout : nullptr, 123.25,
                                             /*ilp=*/nullptr, &cost);
        // With the layout, the step time too (per rank every other batch).
        in.step_time.reset();
        if (with_layout) {
          core::StepTimeOptions step;
          step.cluster_name = std::string(kMaxCostProfileBytes, 'c');
          step.per_rank = i % 2 == 0;
          absl::StatusOr<core::StepTimeReport> report = core::ReportStepTime(
              s, *plan, in.shape, 1, step.cluster, step.cluster_name);
          ASSERT_THAT(report, IsOk());
          StepTimeToProto(*report, step.per_rank, r.mutable_metrics());
          in.step_time = step;
        }
        EXPECT_LE(static_cast<int64_t>(r.ByteSizeLong()),
                  MaxResponseBytes(in, core::MaxPlanShards(s, in.batch)))
            << core::StrategyName(s) << " batch " << i << " layout " << with_layout;
      }
    }
  }
}

TEST(RequestFromProtoTest, BlockDiffusionMaskAndItsErrors) {
  v1::PlanRequest r = GoodRequest();
  r.set_attention_mask("block_diffusion");
  r.set_block_size(16);
  absl::StatusOr<PlanInput> in = RequestFromProto(r, core::BatchLimits{});
  ASSERT_THAT(in, IsOk());
  EXPECT_EQ(in->options.attention_mask,
            (core::AttentionMask{core::MaskKind::kBlockDiffusion, 16}));
  // RequestToProto sends it back.
  const v1::PlanRequest back =
      RequestToProto(7, in->batch, in->strategy, in->options, in->shape, false, "");
  EXPECT_EQ(back.attention_mask(), "block_diffusion");
  EXPECT_EQ(back.block_size(), 16);
  // The causal default sends neither.
  const v1::PlanRequest causal =
      RequestToProto(7, in->batch, in->strategy, core::PlanOptions{}, in->shape, false, "");
  EXPECT_EQ(causal.attention_mask(), "");
  EXPECT_EQ(causal.block_size(), 0);

  for (int64_t bad : {int64_t{0}, int64_t{-1}}) {
    r.set_block_size(bad);
    EXPECT_THAT(RequestFromProto(r, core::BatchLimits{}),
                StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("block_size: must be")));
  }
  r.set_attention_mask("");
  r.set_block_size(4);
  EXPECT_THAT(RequestFromProto(r, core::BatchLimits{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("block_size: only with attention_mask block_diffusion")));
  r.set_attention_mask("causal");
  EXPECT_THAT(RequestFromProto(r, core::BatchLimits{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("attention_mask: unknown mask \"causal\"")));
}

// A block-diffusion plan's response carries its mask, its 2n documents and
// the clean and noisy bytes, and comes back whole; the response bound holds.
TEST(ResponseToProtoTest, BlockDiffusionRoundTripsAndIsBounded) {
  std::mt19937_64 rng(25);
  for (int i = 0; i < 40; ++i) {
    PlanInput in;
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 60)(rng);
    for (int64_t d = 0; d < n; ++d) {
      in.batch.doc_lens.push_back(std::uniform_int_distribution<int64_t>(1, 3000)(rng));
    }
    in.batch.cp_size = static_cast<int32_t>(std::min<int64_t>(
        core::TotalTokens(in.batch.doc_lens), std::uniform_int_distribution<int32_t>(1, 16)(rng)));
    in.options.attention_mask = {core::MaskKind::kBlockDiffusion,
                                 std::uniform_int_distribution<int64_t>(1, 64)(rng)};
    for (core::Strategy s : {core::Strategy::kLlama3, core::Strategy::kPerDoc,
                             core::Strategy::kRing, core::Strategy::kCsbp,
                             core::Strategy::kFlashCp}) {
      in.strategy = s;
      absl::StatusOr<core::Plan> plan = core::MakePlan(s, in.batch, in.options);
      if (s == core::Strategy::kCsbp && !plan.ok()) continue;  // fewer blocks than ranks
      ASSERT_THAT(plan, IsOk()) << core::StrategyName(s);
      absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(*plan, in.shape);
      ASSERT_THAT(metrics, IsOk());
      const v1::PlanResponse r =
          ResponseToProto(in.batch_id, s, *plan, *metrics, nullptr, 1.5, nullptr, nullptr);
      EXPECT_EQ(r.attention_mask(), "block_diffusion");
      EXPECT_EQ(r.block_size(), in.options.attention_mask.block_size);
      EXPECT_EQ(r.doc_lens_size(), 2 * n);
      EXPECT_LE(static_cast<int64_t>(r.ByteSizeLong()),
                MaxResponseBytes(in, core::MaxPlanShards(s, in.batch, in.options.attention_mask)))
          << core::StrategyName(s);
      absl::StatusOr<PlanResult> back = ResponseFromProto(r);
      ASSERT_THAT(back, IsOk());
      EXPECT_EQ(back->plan.mask, plan->mask);
      EXPECT_EQ(back->plan.shards, plan->shards);
      EXPECT_THAT(core::ValidatePlan(back->plan), IsOk());
      EXPECT_EQ(back->metrics.rank_noisy_tokens, metrics->rank_noisy_tokens);
      EXPECT_EQ(back->metrics.cut_noisy_blocks, metrics->cut_noisy_blocks);
      for (core::CommScheme scheme : core::kAllCommSchemes) {
        const core::PhaseTraffic& a = back->metrics.bytes[static_cast<int>(scheme)].phase;
        const core::PhaseTraffic& b = metrics->bytes[static_cast<int>(scheme)].phase;
        EXPECT_EQ(a.clean_received_tokens, b.clean_received_tokens);
        EXPECT_EQ(a.noisy_received_tokens, b.noisy_received_tokens);
        EXPECT_EQ(a.max_clean_received_bytes, b.max_clean_received_bytes);
        EXPECT_EQ(a.max_noisy_received_bytes, b.max_noisy_received_bytes);
      }
    }
  }
}

TEST(ErrorResponseTest, CarriesCodeAndMessageBack) {
  const v1::PlanResponse p =
      ErrorResponseToProto(3, absl::InvalidArgumentError("cp_size: must be at least 1, got 0"));
  EXPECT_EQ(p.batch_id(), 3u);
  ASSERT_TRUE(p.has_error());
  EXPECT_EQ(p.error().code(), 3);  // google.rpc.Code INVALID_ARGUMENT
  EXPECT_EQ(p.error().message(), "cp_size: must be at least 1, got 0");
  EXPECT_EQ(p.shards_size(), 0);
  EXPECT_FALSE(p.has_metrics());
  EXPECT_EQ(ResponseFromProto(p).status(),
            absl::InvalidArgumentError("cp_size: must be at least 1, got 0"));
}

TEST(ErrorResponseTest, CodesOutsideTheErrorRangeBecomeUnknown) {
  v1::Error e;
  e.set_code(0);
  e.set_message("odd");
  EXPECT_EQ(ErrorFromProto(e), absl::UnknownError("error code 0: odd"));
  e.set_code(17);
  EXPECT_EQ(ErrorFromProto(e), absl::UnknownError("error code 17: odd"));
  e.set_code(12);
  EXPECT_THAT(ErrorFromProto(e), StatusIs(absl::StatusCode::kUnimplemented, "odd"));
}

}  // namespace
}  // namespace flashcp::proto
