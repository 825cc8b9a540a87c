#include "core/pipeline.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/internal/pipeline_internal.h"
#include "core/pipeline_json.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

PipelineRequest Req(std::vector<int64_t> docs, int32_t pp) {
  PipelineRequest r;
  r.doc_lens = std::move(docs);
  r.pp_size = pp;
  return r;
}

TEST(PipelineRequestTest, DefaultsAreDerived) {
  PipelineRequest req = Req({1000, 2000}, 4);
  const auto r = CompletePipelineRequest(req);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->profile.act_token_bytes, 34.0 * 4096);
  EXPECT_EQ(r->profile.ckpt_token_bytes, 2.0 * 4096);
  EXPECT_EQ(r->profile.kv_token_bytes, 4.0 * 4096);
  EXPECT_EQ(r->profile.logits_token_bytes, 4.0 * 32000);
  EXPECT_DOUBLE_EQ(r->profile.fwd_pair_s, 4.0 * 4096 / 200e12);
  EXPECT_DOUBLE_EQ(r->profile.bwd_token_s, 2 * r->profile.fwd_token_s);
  // LLaMA-2-7B layer: 2 D^2 + 2 D D_kv + 3 D F parameters, 8 layers a stage.
  const double layer = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008;
  EXPECT_DOUBLE_EQ(internal::ModelStateBytes(*r, 1), 16 * 8 * layer);
  EXPECT_DOUBLE_EQ(internal::ModelStateBytes(*r, 0), 16 * (8 * layer + 32000.0 * 4096));
}

TEST(PipelineRequestTest, BadFieldsAreNamed) {
  struct Case {
    PipelineRequest req;
    const char* field;
  };
  PipelineRequest base = Req({100, 200}, 4);
  std::vector<Case> cases;
  cases.push_back({Req({}, 4), "doc_lens"});
  cases.push_back({Req({100, 0}, 4), "doc_lens[1]"});
  cases.push_back({Req({100}, 0), "pp_size"});
  PipelineRequest r = base;
  r.pp_size = 3;
  cases.push_back({r, "model.layers"});
  r = base;
  r.sp_size = 0;
  cases.push_back({r, "sp_size"});
  r = base;
  r.memory_budget_bytes = 0;
  cases.push_back({r, "memory_budget_bytes"});
  r = base;
  r.profile.fwd_token_s = -1;
  cases.push_back({r, "profile.fwd_token_s"});
  r = base;
  r.profile.act_token_bytes = 10;
  cases.push_back({r, "profile.act_token_bytes"});
  r = base;
  r.model.hidden = 0;
  cases.push_back({r, "model.hidden"});
  for (const Case& c : cases) {
    EXPECT_THAT(PlanPipeline(c.req), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
}

TEST(PipelinePlanTest, DefaultsPlanForFourStages) {
  const auto plan = PlanPipeline(Req({65536, 30000, 4000, 3000, 2000, 1000, 500}, 4));
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->ckpt.size(), 4u);
  EXPECT_EQ(plan->ckpt_solver, "greedy");
  EXPECT_GT(plan->prediction.iteration_s, 0);
  EXPECT_EQ(plan->prediction.stage_peak_bytes.size(), 4u);
  for (double peak : plan->prediction.stage_peak_bytes) EXPECT_LE(peak, 80.0 * (1 << 30));
}

TEST(PipelinePlanTest, NothingFitsSaysByHowMuch) {
  PipelineRequest req = Req({131072}, 4);
  req.memory_budget_bytes = 30e9;  // model states alone take ~28 GB on stage 0
  const auto plan = PlanPipeline(req);
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr("bytes")));
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("GiB) more")));
}

TEST(PipelinePlanTest, StopTokenStops) {
  PipelineOptions o;
  o.stop = StopToken([] { return absl::CancelledError("stop"); });
  EXPECT_THAT(PlanPipeline(Req({100, 200}, 2), o),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST(PipelineScheduleTest, BackwardReversesSharedDocumentRuns) {
  std::vector<PipelineChunk> chunks = {
      {ChunkKind::kSplit, {{0, 0, 10}}},
      {ChunkKind::kSplit, {{0, 10, 10}}},
      {ChunkKind::kHybrid, {{0, 20, 5}, {1, 0, 3}}},
      {ChunkKind::kPacked, {{2, 0, 4}}},
  };
  EXPECT_THAT(internal::BackwardOrder(chunks, {0, 1, 2, 3}), ElementsAre(2, 1, 0, 3));
}

TEST(PipelineScheduleTest, OneFOneBPerStage) {
  PipelineGroup g{{0, 1, 2, 3}, {0, 1, 2, 3}};
  const auto orders = internal::StageOrders(2, g);
  auto str = [](const std::vector<internal::StageOp>& ops) {
    std::string s;
    for (const auto& op : ops) s += (op.backward ? "B" : "F") + std::to_string(op.chunk) + " ";
    return s;
  };
  EXPECT_EQ(str(orders[0]), "F0 F1 B0 F2 B1 F3 B2 B3 ");
  EXPECT_EQ(str(orders[1]), "F0 B0 F1 B1 F2 B2 F3 B3 ");
  // A split document (chunks 0-2) needs its last slice's forward before any
  // backward: the window grows by its 3 - 1 extra chunks on every stage.
  PipelineGroup s{{0, 1, 2, 3}, {2, 1, 0, 3}};
  const auto split = internal::StageOrders(2, s);
  EXPECT_EQ(str(split[1]), "F0 F1 F2 B2 F3 B1 B0 B3 ");
  EXPECT_EQ(str(split[0]), "F0 F1 F2 F3 B2 B1 B0 B3 ");
}

TEST(PipelineScheduleTest, PublicStageOrderIsTheSimulators) {
  const PipelineGroup s{{0, 1, 2, 3}, {2, 1, 0, 3}};
  const auto orders = PipelineStageOrder(2, s);
  const auto internal_orders = internal::StageOrders(2, s);
  ASSERT_EQ(orders.size(), 2u);
  for (int32_t p = 0; p < 2; ++p) {
    ASSERT_EQ(orders[p].size(), internal_orders[p].size());
    for (size_t i = 0; i < orders[p].size(); ++i) {
      EXPECT_EQ(orders[p][i].stage, p);
      EXPECT_EQ(orders[p][i].chunk, internal_orders[p][i].chunk);
      EXPECT_EQ(orders[p][i].backward, internal_orders[p][i].backward);
    }
  }
  EXPECT_EQ(orders[1][3].chunk, 2);
  EXPECT_TRUE(orders[1][3].backward);
}

TEST(PipelineRequestTest, NamedProfiles) {
  EXPECT_THAT(PipelineProfileNames(), ElementsAre("analytic", "cpu_tiny_decoder"));
  const auto cpu = NamedPipelineProfile("cpu_tiny_decoder");
  ASSERT_THAT(cpu, IsOk());
  EXPECT_EQ(cpu->fwd_pair_s, 3.387e-8);
  EXPECT_EQ(cpu->bwd_chunk_s, 7.843e-4);
  EXPECT_EQ(cpu->act_token_bytes, 8248);
  EXPECT_EQ(cpu->state_bytes_per_param, 8);
  EXPECT_THAT(NamedPipelineProfile("h100"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("known: analytic, cpu_tiny_decoder")));
}

TEST(PipelineRequestTest, CoefficientsAreSetByName) {
  PipelineProfile p;
  ASSERT_THAT(SetPipelineCoefficient(p, "fwd_pair_s", 3e-9), IsOk());
  ASSERT_THAT(SetPipelineCoefficient(p, "state_bytes_per_param", 8), IsOk());
  EXPECT_EQ(p.fwd_pair_s, 3e-9);
  EXPECT_EQ(p.state_bytes_per_param, 8);
  EXPECT_THAT(SetPipelineCoefficient(p, "fwd_flops", 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("profile.fwd_flops")));
}

// Two stages of one layer each, 100-token chunks: forward 0.1 s, backward
// 0.2 s, sends free (hidden 8, bandwidth 1e15 B/s, no latency).
PipelineRequest TinyRequest() {
  PipelineRequest r = Req({100, 100}, 2);
  r.model = PipelineModel{2, 8, 8, 8, 8, 2};
  r.profile.fwd_pair_s = 1e-30;
  r.profile.fwd_token_s = 1e-3;
  r.profile.fwd_chunk_s = 0;
  r.profile.bwd_pair_s = 1e-30;
  r.profile.bwd_token_s = 2e-3;
  r.profile.p2p_latency_s = 0;
  r.profile.p2p_bytes_per_s = 1e15;
  r.memory_budget_bytes = 1e12;
  return *CompletePipelineRequest(r);
}

PipelinePlan TinyPlan() {
  PipelinePlan p;
  p.chunks = {{ChunkKind::kPacked, {{0, 0, 100}}}, {ChunkKind::kPacked, {{1, 0, 100}}}};
  p.pipelines = {{{0, 1}, {0, 1}}};
  p.ckpt = {{0, 0}, {0, 0}};
  return p;
}

TEST(PipelineSimTest, ReplaysOneFOneBByHand) {
  const PipelineRequest r = TinyRequest();
  PipelinePlan p = TinyPlan();
  auto sim = SimulatePipeline(r, p);
  ASSERT_THAT(sim, IsOk());
  EXPECT_NEAR(sim->iteration_s, 0.9, 1e-9);
  EXPECT_NEAR(sim->bubble_share, 1.0 / 3, 1e-9);
  EXPECT_EQ(sim->recompute_s, 0);
  // Stage 0 holds both chunks' layer (34 D = 272 B a token) and, during
  // B0, one layer's working set: 3 x 272 x 100 bytes above model states.
  EXPECT_NEAR(sim->stage_peak_bytes[0] - sim->stage_model_state_bytes[0], 3 * 272 * 100, 1e-6);
  // Stage 1 also holds logits (4 V = 32 B a token) of one chunk at a time.
  EXPECT_NEAR(sim->stage_peak_bytes[1] - sim->stage_model_state_bytes[1], 2 * 272 * 100 + 32 * 100,
              1e-6);

  // Recompute on stage 0 hides behind stage 1's backward; on stage 1 it
  // delays everything after it.
  p.ckpt = {{1, 0}, {0, 0}};
  sim = SimulatePipeline(r, p);
  ASSERT_THAT(sim, IsOk());
  EXPECT_NEAR(sim->iteration_s, 0.9, 1e-9);
  EXPECT_NEAR(sim->recompute_s, 0.05, 1e-9);
  p.ckpt = {{0, 0}, {1, 0}};
  sim = SimulatePipeline(r, p);
  ASSERT_THAT(sim, IsOk());
  EXPECT_NEAR(sim->iteration_s, 1.0, 1e-9);
  // A checkpointed layer keeps e D = 16 B a token instead of 272; the
  // backward's working layer (272 B) and the logits (32 B) stay.
  p.ckpt = {{0, 0}, {1, 1}};
  sim = SimulatePipeline(r, p);
  ASSERT_THAT(sim, IsOk());
  EXPECT_NEAR(sim->iteration_s, 1.1, 1e-9);
  EXPECT_NEAR(sim->stage_peak_bytes[1] - sim->stage_model_state_bytes[1],
              16 * 100 + 272 * 100 + 32 * 100, 1e-6);
}

TEST(PipelineJsonTest, WritesThePlanAndDrawsItsReplay) {
  const PipelineRequest r = TinyRequest();
  PipelinePlan p = TinyPlan();
  p.ckpt = {{1, 0}, {0, 0}};
  p.ckpt_solver = "greedy";
  auto sim = SimulatePipeline(r, p);
  ASSERT_THAT(sim, IsOk());
  p.prediction = *sim;
  p.prediction.stage_peak_bytes = {1.5, 2};  // short numbers for the exact string
  p.prediction.stage_model_state_bytes = {0.5, 1};
  p.prediction.iteration_s = 0.875;
  p.prediction.bubble_share = 0.25;
  p.prediction.recompute_s = 0.0625;
  EXPECT_EQ(PipelinePlanToJson(p, 3, 0.5),
            "{\"batch_id\":3,\"strategy\":\"dpp\",\"chunks\":[{\"kind\":\"packed\",\"slices\":"
            "[{\"doc\":0,\"start\":0,\"len\":100}]},{\"kind\":\"packed\",\"slices\":[{\"doc\":1,"
            "\"start\":0,\"len\":100}]}],\"pipelines\":[{\"forward\":[0,1],\"backward\":[0,1]}],"
            "\"ckpt\":[[1,0],[0,0]],\"slice_count\":0,\"ckpt_solver\":\"greedy\",\"ckpt_gap\":0,"
            "\"ckpt_optimal\":false,\"prediction\":{\"iteration_s\":0.875,\"bubble_share\":0.25,"
            "\"recompute_s\":0.0625,\"stage_peak_bytes\":[1.5,2],\"stage_model_state_bytes\":[0.5,1]},"
            "\"planning_seconds\":0.5}");
  const auto svg = PipelinePlanToSvg(p);
  ASSERT_THAT(svg, IsOk());
  // 8 ops, one of them with a hatched recompute part.
  size_t boxes = 0, hatched = 0;
  for (size_t at = svg->find("<title>chunk"); at != std::string::npos;
       at = svg->find("<title>chunk", at + 1)) {
    ++boxes;
  }
  for (size_t at = svg->find("url(#hatch)"); at != std::string::npos;
       at = svg->find("url(#hatch)", at + 1)) {
    ++hatched;
  }
  EXPECT_EQ(boxes, 8u);
  EXPECT_EQ(hatched, 1u);
  p.prediction.ops.clear();
  EXPECT_THAT(PipelinePlanToSvg(p), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PipelineSimTest, RejectsBrokenPlans) {
  const PipelineRequest r = TinyRequest();
  PipelinePlan p = TinyPlan();
  p.chunks[1].slices[0].len = 99;
  EXPECT_THAT(SimulatePipeline(r, p), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("chunks[1]: not a valid packed")));
  p.chunks[1].kind = ChunkKind::kSplit;
  EXPECT_THAT(SimulatePipeline(r, p), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("doc_lens[1]: token 99")));
  p = TinyPlan();
  p.ckpt[1][0] = 2;
  EXPECT_THAT(SimulatePipeline(r, p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ckpt[1][0]")));
  p = TinyPlan();
  p.chunks = {{ChunkKind::kPacked, {{0, 0, 50}}}, {ChunkKind::kSplit, {{0, 50, 50}}}};
  p.chunks[0].kind = ChunkKind::kSplit;
  p.chunks.push_back({ChunkKind::kPacked, {{1, 0, 100}}});
  p.pipelines = {{{0, 2, 1}, {0, 2, 1}}};
  p.ckpt = {{0, 0, 0}, {0, 0, 0}};
  EXPECT_THAT(SimulatePipeline(r, p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("consecutive")));
  // Two tails in one chunk.
  PipelineRequest r2 = r;
  r2.doc_lens = {100, 100};
  p.chunks = {{ChunkKind::kSplit, {{0, 0, 50}}},
              {ChunkKind::kSplit, {{1, 0, 50}}},
              {ChunkKind::kHybrid, {{0, 50, 50}, {1, 50, 50}}}};
  p.pipelines = {{{0, 1, 2}, internal::BackwardOrder(p.chunks, {0, 1, 2})}};
  EXPECT_THAT(SimulatePipeline(r2, p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 tail slices")));
}

TEST(PipelineCkptTest, GreedyLowersMostCostlyFirst) {
  CkptProblem p;
  p.vars = 2;
  p.max_value = 4;
  p.cost = {2.0, 1.0};
  // 3 c0 + 2 c1 >= 7.
  p.rows = {CkptRow{{{0, 3.0}, {1, 2.0}}, 7.0}};
  const auto s = SolveCkptGreedy(p);
  ASSERT_THAT(s, IsOk());
  // c0 drops first as far as the row allows with c1 = 4 (3 c0 >= -1: 0).
  EXPECT_THAT(s->values, ElementsAre(0, 4));
  p.rows[0].rhs = 21;  // 3*4 + 2*4 = 20 < 21
  EXPECT_THAT(SolveCkptGreedy(p),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("1 bytes more")));
}

TEST(PipelineStrategiesTest, EveryStrategyPlansAndReplays) {
  PipelineRequest req = Req({40000, 20000, 9000, 5000, 3000, 3000, 1200, 800, 500, 300}, 4);
  for (PipelineStrategy s : kAllPipelineStrategies) {
    PipelineOptions o;
    o.strategy = s;
    const auto plan = PlanPipeline(req, o);
    ASSERT_THAT(plan, IsOk()) << PipelineStrategyName(s);
    EXPECT_EQ(plan->strategy, s);
    const auto r = CompletePipelineRequest(req);
    const auto sim = SimulatePipeline(*r, *plan);
    ASSERT_THAT(sim, IsOk());
    EXPECT_EQ(sim->iteration_s, plan->prediction.iteration_s) << PipelineStrategyName(s);
    EXPECT_LE(PipelineOverBudget(*r, *sim), 0) << PipelineStrategyName(s);
  }
  EXPECT_THAT(ParsePipelineStrategy("token_level"), IsOk());
  EXPECT_THAT(ParsePipelineStrategy("nope"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dpp_full_ckpt")));
}


// A batch of pipeline_bench's table (wlbllm, 64 documents, d_p = 4, no
// memory pressure) that token_level won while every cut document followed
// the longest one's mesh: cutting each on its own work-balanced mesh (no
// small tails left alone) makes DPP's plan faster than token_level's.
TEST(PipelineStrategiesTest, PerDocumentMeshesBeatTokenLevelOnATableBatch) {
  const PipelineRequest req = Req({
      1568, 5683, 701, 1512, 5183, 2295, 890, 5290, 801, 788, 902, 5009, 4907, 2287, 1034, 4481,
      3282, 400, 887, 6124, 2947, 3977, 926, 3027, 4448, 3761, 787, 1091, 3979, 1149, 1905, 6121,
      2916, 3013, 2838, 1655, 5597, 2677, 1715, 2459, 2850, 5127, 124, 496, 1866, 6070, 730,
      4539, 2913, 413, 5288, 877, 764, 2694, 3933, 178, 2938, 1445, 343, 3642, 5960, 2076, 2660,
      2802}, 4);
  PipelineOptions o;
  const auto dpp = PlanPipeline(req, o);
  o.strategy = PipelineStrategy::kTokenLevel;
  const auto token = PlanPipeline(req, o);
  ASSERT_THAT(dpp, IsOk());
  ASSERT_THAT(token, IsOk());
  EXPECT_LT(dpp->prediction.iteration_s, token->prediction.iteration_s);
  // Some document other than the longest is cut off its mesh: a split
  // slice that starts at no boundary of the longest document's slices.
  std::vector<int64_t> mesh;
  const int32_t longest = 19;  // 6124 tokens
  for (const PipelineChunk& c : dpp->chunks) {
    for (const PipelineSlice& s : c.slices) {
      if (s.doc == longest) mesh.push_back(s.start);
    }
  }
  bool off_mesh = false;
  for (const PipelineChunk& c : dpp->chunks) {
    for (const PipelineSlice& s : c.slices) {
      off_mesh |= s.start > 0 && std::find(mesh.begin(), mesh.end(), s.start) == mesh.end();
    }
  }
  EXPECT_TRUE(off_mesh);
}

}  // namespace
}  // namespace flashcp::core
