// The all-to-all scheme's layout (a2a_layout.h) and step (a2a_step.h): the
// layout's invariants on many plans; the step's outputs and gradients against
// the double-accumulated reference (GQA included) and its bytes equal to
// core::AnalyzePlan's exactly, on real Gloo groups of threads.
#include "worker/a2a_step.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/rank_groups.h"
#include "core/strategies.h"
#include "core/two_level.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/a2a_layout.h"
#include "worker/attention_reference.h"
#include "worker/cp_layout.h"
#include "worker/cpstep.h"
#include "worker/engine.h"
#include "worker/testing/gloo_ranks.h"
#include "worker/two_level_layout.h"

namespace flashcp::worker {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;

// Observed errors of the engine's kernels against the double reference are
// below 1e-6 (engine_test.cc); the all-to-all adds only fp32 sums of a
// replicated KV head's gradients.
constexpr double kTol = 1e-5;

std::vector<core::Strategy> Strategies() {
  std::vector<core::Strategy> out;
  for (core::Strategy s : core::AllStrategies())
    if (s != core::Strategy::kIlp) out.push_back(s);  // the worker links no CBC
  return out;
}

// Per rank, per local row: the token's index in the packed batch (-1: padding).
std::vector<std::vector<int64_t>> GlobalRows(const core::Plan& plan,
                                             const core::CommLayout& layout) {
  std::vector<int64_t> doc_first(plan.doc_lens.size(), 0);
  for (size_t d = 1; d < plan.doc_lens.size(); ++d)
    doc_first[d] = doc_first[d - 1] + plan.doc_lens[d - 1];
  const int64_t rows = core::TokensPerRank(core::TotalTokens(plan.doc_lens), plan.cp_size);
  std::vector<std::vector<int64_t>> out(plan.cp_size, std::vector<int64_t>(rows, -1));
  for (int32_t r = 0; r < plan.cp_size; ++r) {
    const core::RankLayout& rl = layout.ranks[r];
    for (size_t i = 0; i < rl.shards.size(); ++i) {
      const core::Shard& s = plan.shards[rl.shards[i]];
      for (int64_t t = 0; t < s.len; ++t) out[r][rl.shard_offset[i] + t] = doc_first[s.doc] + s.start + t;
    }
  }
  return out;
}

// A rank's local rows of a packed tensor `g` (rows of `width` floats): row i
// is g's row global_rows[i], zeros for padding.
std::vector<float> LocalRows(const std::vector<int64_t>& global_rows, const std::vector<float>& g,
                             int64_t width) {
  std::vector<float> out(global_rows.size() * width, 0.0f);
  for (size_t i = 0; i < global_rows.size(); ++i)
    if (global_rows[i] >= 0)
      std::copy_n(g.data() + global_rows[i] * width, width, out.data() + i * width);
  return out;
}

TEST(AllToAllLayoutTest, GroupsRowsAndDocumentsOnRandomPlans) {
  std::mt19937_64 rng(27);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 9);
    std::vector<int64_t> lens;
    const int docs = 1 + static_cast<int>(rng() % 12);
    for (int d = 0; d < docs; ++d) lens.push_back(1 + static_cast<int64_t>(rng() % 90));
    if (core::TotalTokens(lens) < n) lens.push_back(n);  // at least a token a rank
    for (core::Strategy strategy : Strategies()) {
      if (strategy == core::Strategy::kBasp) continue;  // equal documents only
      absl::StatusOr<core::Plan> plan = core::MakePlan(strategy, core::Batch{lens, n});
      ASSERT_THAT(plan, IsOk());
      absl::StatusOr<core::CommLayout> layout = core::BuildCommLayout(*plan);
      ASSERT_THAT(layout, IsOk());
      const std::vector<std::vector<int32_t>> groups = core::PlanRankGroups(*plan);
      const std::vector<std::vector<int64_t>> global = GlobalRows(*plan, *layout);
      std::vector<int64_t> doc_first(lens.size(), 0);
      for (size_t d = 1; d < lens.size(); ++d) doc_first[d] = doc_first[d - 1] + lens[d - 1];
      for (int32_t r = 0; r < n; ++r) {
        absl::StatusOr<CpRankLayout> p =
            BuildCpRankLayout(*plan, *layout, r, core::CommScheme::kAllToAll);
        ASSERT_THAT(p, IsOk());
        const AllToAllLayout& a = p->a2a;
        EXPECT_EQ(p->collective, Collective::kAllToAll);
        EXPECT_TRUE(p->pack_rows.empty() && p->sends.empty() && p->stage_src.empty());
        // Its group is PlanRankGroups' group of r, at r's position.
        const auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) {
          return std::find(x.begin(), x.end(), r) != x.end();
        });
        ASSERT_NE(g, groups.end());
        ASSERT_EQ(a.group, *g);
        EXPECT_EQ(a.group[a.position], r);
        EXPECT_EQ(AttentionRows(*p), a.rows);
        // doc_row is a permutation onto the group's documents in document
        // order: head-parallel row doc_start[i] + t holds position t of the
        // i-th document.
        std::vector<int64_t> token_of_row(a.rows, -2);
        for (size_t j = 0; j < a.group.size(); ++j) {
          for (int64_t t = 0; t < a.tokens[j]; ++t) {
            const int64_t row = a.doc_row[a.first[j] + t];
            ASSERT_GE(row, 0);
            ASSERT_LT(row, a.rows);
            ASSERT_EQ(token_of_row[row], -2) << "row " << row << " twice";
            token_of_row[row] = global[a.group[j]][t];
          }
        }
        int64_t at = 0;
        for (size_t i = 0; i < a.doc_start.size(); ++i) {
          ASSERT_EQ(a.doc_start[i], at);
          EXPECT_EQ(p->whole_start[i], a.doc_start[i]);
          // The document whose first token head-parallel row doc_start[i] holds.
          const int64_t g0 = token_of_row[at];
          const auto d = std::upper_bound(doc_first.begin(), doc_first.end(), g0) - doc_first.begin() - 1;
          ASSERT_EQ(g0, doc_first[d]);
          ASSERT_EQ(a.doc_len[i], lens[d]);
          for (int64_t t = 0; t < lens[d]; ++t) ASSERT_EQ(token_of_row[at + t], g0 + t);
          at += lens[d];
        }
        EXPECT_EQ(at, a.rows);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 5000);
}

struct Case {
  std::string name;
  std::vector<int64_t> doc_lens;
};

// One long document (one group of N under every strategy), equal documents
// (basp's batches) and a mixed batch with short documents and padding.
std::vector<Case> Cases(int32_t n) {
  return {{"single_doc", {67 * n + 3}},
          {"equal_docs", std::vector<int64_t>(n >= 4 ? n / 2 : 1, 16 * n)},
          {"mixed", {37, 1, 60, 5, 100, 1, 1, 29, 7}}};
}

// Random global inputs [tokens][heads][D] in [-1, 1).
std::vector<float> Random(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// [tokens][Hkv][D] -> [tokens][Hq][D], query head h reading KV head h / g.
std::vector<float> Expand(const std::vector<float>& kv, int64_t tokens, int32_t hq, int32_t hkv,
                          int32_t d) {
  std::vector<float> out(tokens * hq * d);
  for (int64_t t = 0; t < tokens; ++t)
    for (int32_t h = 0; h < hq; ++h)
      std::copy_n(kv.data() + (t * hkv + h / (hq / hkv)) * d, d, out.data() + (t * hq + h) * d);
  return out;
}
// The reverse's gradient: the Hq / Hkv heads of each KV head summed.
std::vector<float> Reduce(const std::vector<float>& g, int64_t tokens, int32_t hq, int32_t hkv,
                          int32_t d) {
  std::vector<float> out(tokens * hkv * d, 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int32_t h = 0; h < hq; ++h)
      for (int32_t x = 0; x < d; ++x)
        out[(t * hkv + h / (hq / hkv)) * d + x] += g[(t * hq + h) * d + x];
  return out;
}

struct Param {
  int32_t n, hkv;
};
class AllToAllStepTest : public ::testing::TestWithParam<Param> {};

// Every strategy and case at Hq = 8: O, dQ, dK, dV equal the reference, and
// every rank's bytes, per phase and in all, equal AnalyzePlan's
// bytes[kAllToAll] at dtype_bytes 4; where a group's size does not divide Hq
// the analysis says the scheme does not apply and Create refuses it.
TEST_P(AllToAllStepTest, MatchesReferenceAndPredictedBytes) {
  const auto [n, hkv] = GetParam();
  constexpr int32_t kHq = 8, kD = 8;
  const float scale = 1.0f / std::sqrt(float{kD});
  int ran = 0, refused = 0;
  for (const Case& c : Cases(n)) {
    const int64_t total = core::TotalTokens(c.doc_lens);
    std::mt19937_64 rng(total * 31 + n);
    const std::vector<float> q = Random(total * kHq * kD, rng), k = Random(total * hkv * kD, rng),
                             v = Random(total * hkv * kD, rng),
                             dout = Random(total * kHq * kD, rng);
    // The reference on KV expanded to the query heads, gradients reduced back.
    const AttentionShape full{kHq, kD, scale};
    const std::vector<float> kx = Expand(k, total, kHq, hkv, kD), vx = Expand(v, total, kHq, hkv, kD);
    std::vector<float> ro(total * kHq * kD), rlse(total * kHq), rdq(total * kHq * kD),
        rdkx(total * kHq * kD), rdvx(total * kHq * kD);
    ASSERT_THAT(ReferenceForward(full, c.doc_lens, q, kx, vx, absl::MakeSpan(ro),
                                 absl::MakeSpan(rlse)), IsOk());
    ASSERT_THAT(ReferenceBackward(full, c.doc_lens, q, kx, vx, dout, absl::MakeSpan(rdq),
                                  absl::MakeSpan(rdkx), absl::MakeSpan(rdvx)), IsOk());
    const std::vector<float> rdk = Reduce(rdkx, total, kHq, hkv, kD),
                             rdv = Reduce(rdvx, total, kHq, hkv, kD);
    for (core::Strategy strategy : Strategies()) {
      absl::StatusOr<core::Plan> plan = core::MakePlan(strategy, core::Batch{c.doc_lens, n});
      if (strategy == core::Strategy::kBasp && !plan.ok()) continue;  // unequal documents
      ASSERT_THAT(plan, IsOk()) << core::StrategyName(strategy);
      SCOPED_TRACE(absl::StrCat("N=", n, " Hkv=", hkv, " case=", c.name,
                                " strategy=", core::StrategyName(strategy)));
      core::ModelShape model;
      model.heads = hkv;
      model.head_dim = kD;
      model.dtype_bytes = 4;
      model.query_heads = kHq;
      absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(*plan, model);
      ASSERT_THAT(metrics, IsOk());
      const HeadShape shape{kHq, hkv, kD, scale};
      if (!metrics->all_to_all_inapplicable.empty()) {
        bool some_refused = false;
        for (int32_t r = 0; r < n; ++r) {
          absl::StatusOr<AllToAllStep> s = AllToAllStep::Create(*plan, r, shape);
          if (!s.ok()) {
            EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("query_heads")));
            some_refused = true;
          }
        }
        EXPECT_TRUE(some_refused);
        ++refused;
        continue;
      }
      absl::StatusOr<core::CommLayout> layout = core::BuildCommLayout(*plan);
      ASSERT_THAT(layout, IsOk());
      const std::vector<std::vector<int64_t>> global = GlobalRows(*plan, *layout);
      const core::SchemeBytes& want = metrics->bytes[static_cast<int>(core::CommScheme::kAllToAll)];
      const int64_t rows = core::TokensPerRank(total, n);
      testing::RunRanks(n, absl::Seconds(60), [&](int32_t r, Communicator& comm) {
        absl::StatusOr<AllToAllStep> step = AllToAllStep::Create(*plan, r, shape);
        ASSERT_THAT(step, IsOk());
        ASSERT_EQ(step->local_rows(), rows);
        auto local = [&](const std::vector<float>& g, int32_t heads) {
          return LocalRows(global[r], g, int64_t{heads} * kD);
        };
        const std::vector<float> lq = local(q, kHq), lk = local(k, hkv), lv = local(v, hkv),
                                 ldout = local(dout, kHq);
        std::vector<float> o(rows * kHq * kD), dq(rows * kHq * kD), dk(rows * hkv * kD),
            dv(rows * hkv * kD);
        ThreadPool pool(1);
        const CommStats before = comm.stats();
        ASSERT_THAT(step->Forward(comm, pool, lq, lk, lv, absl::MakeSpan(o)), IsOk());
        const CommStats mid = comm.stats();
        ASSERT_THAT(step->Backward(comm, pool, ldout, absl::MakeSpan(dq), absl::MakeSpan(dk),
                                   absl::MakeSpan(dv)), IsOk());
        const CommStats after = comm.stats();
        EXPECT_EQ(after.bytes_sent - before.bytes_sent, want.sent[r]) << "rank " << r;
        EXPECT_EQ(after.bytes_received - before.bytes_received, want.received[r]) << "rank " << r;
        const int64_t unit = kD * 4;  // one (token, head) row
        EXPECT_EQ(mid.bytes_sent - before.bytes_sent, want.phase.sent_tokens[r] * unit);
        EXPECT_EQ(mid.bytes_received - before.bytes_received,
                  want.phase.received_tokens[r] * unit);
        // Against the reference, real rows; the padding row is 0.
        const std::vector<float> wo = local(ro, kHq), wdq = local(rdq, kHq),
                                 wdk = local(rdk, hkv), wdv = local(rdv, hkv);
        EXPECT_LE(MaxRelError(o, wo), kTol) << "rank " << r << " o";
        EXPECT_LE(MaxRelError(dq, wdq), kTol) << "rank " << r << " dq";
        EXPECT_LE(MaxRelError(dk, wdk), kTol) << "rank " << r << " dk";
        EXPECT_LE(MaxRelError(dv, wdv), kTol) << "rank " << r << " dv";
      });
      ++ran;
    }
  }
  // The one-document case runs under every strategy (one group of N, N | 8).
  EXPECT_GE(ran, static_cast<int>(Strategies().size()));
  RecordProperty("ran", ran);
  RecordProperty("refused", refused);
}

INSTANTIATE_TEST_SUITE_P(GroupsAndHeads, AllToAllStepTest,
                         ::testing::Values(Param{2, 8}, Param{2, 2}, Param{4, 8}, Param{4, 2},
                                           Param{8, 8}, Param{8, 2}),
                         [](const auto& info) {
                           return absl::StrCat("N", info.param.n, "_Hkv", info.param.hkv);
                         });

// The engine (CpAttentionStep, flashcp-cpstep's machinery) runs the scheme
// with Hq = Hkv = heads and its bytes equal the prediction.
TEST(AllToAllEngineTest, CpStepMatchesReferenceAndBytes) {
  const core::Plan plan = *core::MakePlan(core::Strategy::kPerDoc,
                                          core::Batch{{300, 20, 5, 91}, 4});
  StepConfig config;
  config.shape = AttentionShape{4, 8, 0.35f};
  config.scheme = core::CommScheme::kAllToAll;
  const StepInputs inputs = MakeInputs(416, config.shape, 5);
  absl::StatusOr<std::vector<RankResult>> results = RunThreads(plan, config, inputs);
  ASSERT_THAT(results, IsOk());
  absl::StatusOr<StepErrors> err = CompareWithReference(plan, config.shape, inputs, *results);
  ASSERT_THAT(err, IsOk());
  EXPECT_LE(err->out, kTol);
  EXPECT_EQ(err->lse, 0.0);  // not returned under all_to_all, so not compared
  EXPECT_LE(err->dq, kTol);
  EXPECT_LE(err->dk, kTol);
  EXPECT_LE(err->dv, kTol);
  absl::StatusOr<core::PlanMetrics> m = core::AnalyzePlan(plan, core::ModelShape{4, 8, 4});
  ASSERT_THAT(m, IsOk());
  const core::SchemeBytes& want = m->bytes[static_cast<int>(core::CommScheme::kAllToAll)];
  for (int32_t r = 0; r < 4; ++r) {
    EXPECT_GT(want.sent[r], 0);
    EXPECT_EQ((*results)[r].stats.bytes_sent, want.sent[r]) << r;
    EXPECT_EQ((*results)[r].stats.bytes_received, want.received[r]) << r;
  }
}

// A communicator that counts this rank's send/recv payload by link class:
// to or from a rank on its own node (r / per_node) or on another.
class LinkCounter final : public Communicator {
 public:
  LinkCounter(Communicator& comm, int32_t per_node) : comm_(comm), per_node_(per_node) {}
  int32_t rank() const override { return comm_.rank(); }
  int32_t size() const override { return comm_.size(); }
  absl::Status AllGatherV(absl::Span<const std::byte> input, absl::Span<std::byte> output,
                          absl::Span<const int64_t> counts) override {
    return absl::UnimplementedError("LinkCounter counts send/recv only");
  }
  absl::Status ReduceScatterV(absl::Span<const float> input, absl::Span<float> output,
                              absl::Span<const int64_t> counts) override {
    return absl::UnimplementedError("LinkCounter counts send/recv only");
  }
  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) override {
    for (const SendOp& s : sends) (Inter(s.peer) ? inter_sent : intra_sent) += s.data.size();
    for (const RecvOp& r : recvs)
      (Inter(r.peer) ? inter_received : intra_received) += r.data.size();
    return comm_.SendRecv(sends, recvs);
  }
  absl::Status Barrier() override { return comm_.Barrier(); }
  CommStats stats() const override { return comm_.stats(); }

  int64_t intra_sent = 0, intra_received = 0, inter_sent = 0, inter_received = 0;

 private:
  bool Inter(int32_t peer) const { return peer / per_node_ != comm_.rank() / per_node_; }
  Communicator& comm_;
  int32_t per_node_;
};

// Runs `groups` of `plan` (CpAttentionStep::CreateMixed) on real Gloo ranks,
// forward and backward: outputs and gradients equal the reference and every
// rank's bytes equal core::GroupedSchemeBytes' exactly, and with nodes
// (ranks_per_node > 0) its bytes to and from other nodes too.
void RunMixed(const core::Plan& plan, const std::vector<core::RankGroup>& groups, int32_t kH,
              int32_t kD, int32_t ranks_per_node = 0) {
  const int32_t n = plan.cp_size;
  const AttentionShape shape{kH, kD, 0.3f};
  const int64_t total = core::TotalTokens(plan.doc_lens);
  std::mt19937_64 rng(9);
  const std::vector<float> q = Random(total * kH * kD, rng), k = Random(total * kH * kD, rng),
                           v = Random(total * kH * kD, rng), dout = Random(total * kH * kD, rng);
  std::vector<float> ro(total * kH * kD), rlse(total * kH), rdq(total * kH * kD),
      rdk(total * kH * kD), rdv(total * kH * kD);
  ASSERT_THAT(ReferenceForward(shape, plan.doc_lens, q, k, v, absl::MakeSpan(ro),
                               absl::MakeSpan(rlse)), IsOk());
  ASSERT_THAT(ReferenceBackward(shape, plan.doc_lens, q, k, v, dout, absl::MakeSpan(rdq),
                                absl::MakeSpan(rdk), absl::MakeSpan(rdv)), IsOk());
  const core::ModelShape model{kH, kD, 4};
  absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(plan, model, ranks_per_node);
  ASSERT_THAT(metrics, IsOk());
  absl::StatusOr<core::SchemeBytes> want =
      core::GroupedSchemeBytes(plan, *metrics, groups, model, ranks_per_node);
  ASSERT_THAT(want, IsOk());
  absl::StatusOr<core::CommLayout> layout = core::BuildCommLayout(plan);
  ASSERT_THAT(layout, IsOk());
  const std::vector<std::vector<int64_t>> global = GlobalRows(plan, *layout);
  const int64_t rows = core::TokensPerRank(total, n);
  testing::RunRanks(n, absl::Seconds(60), [&](int32_t r, Communicator& gloo) {
    absl::StatusOr<CpAttentionStep> step =
        CpAttentionStep::CreateMixed(plan, r, shape, groups, ranks_per_node);
    ASSERT_THAT(step, IsOk());
    LinkCounter comm(gloo, ranks_per_node > 0 ? ranks_per_node : n);
    auto local = [&](const std::vector<float>& g) { return LocalRows(global[r], g, kH * kD); };
    const std::vector<float> lq = local(q), lk = local(k), lv = local(v), ldout = local(dout);
    std::vector<float> o(rows * kH * kD), lse(rows * kH), dq(rows * kH * kD), dk(rows * kH * kD),
        dv(rows * kH * kD);
    ThreadPool pool(1);
    const CommStats before = comm.stats();
    ASSERT_THAT(step->Forward(comm, pool, lq, lk, lv, absl::MakeSpan(o), absl::MakeSpan(lse)),
                IsOk());
    ASSERT_THAT(step->Backward(comm, pool, ldout, absl::MakeSpan(dq), absl::MakeSpan(dk),
                               absl::MakeSpan(dv)), IsOk());
    // The groups' calls stayed aligned: a barrier over all ranks still meets.
    ASSERT_THAT(comm.Barrier(), IsOk());
    const CommStats after = comm.stats();
    EXPECT_EQ(after.bytes_sent - before.bytes_sent, want->sent[r]) << "rank " << r;
    EXPECT_EQ(after.bytes_received - before.bytes_received, want->received[r]) << "rank " << r;
    // Per link class: forward inter-node plus backward (what came in goes back).
    const core::PhaseTraffic& ph = want->phase;
    const int64_t inter = ph.inter_node_sent_bytes[r] + ph.inter_node_received_bytes[r];
    EXPECT_EQ(comm.inter_sent, inter) << "rank " << r;
    EXPECT_EQ(comm.inter_received, inter) << "rank " << r;
    EXPECT_EQ(comm.intra_sent, want->sent[r] - inter) << "rank " << r;
    EXPECT_EQ(comm.intra_received, want->received[r] - inter) << "rank " << r;
    EXPECT_LE(MaxRelError(o, local(ro)), kTol) << "rank " << r;
    EXPECT_LE(MaxRelError(dq, local(rdq)), kTol) << "rank " << r;
    EXPECT_LE(MaxRelError(dk, local(rdk)), kTol) << "rank " << r;
    EXPECT_LE(MaxRelError(dv, local(rdv)), kTol) << "rank " << r;
  });
}

// A mixed plan (CpAttentionStep::CreateMixed): each rank group runs its own
// scheme in one step. Every combination of the four schemes over the plan's
// three multi-rank groups (all_to_all only on groups whose size divides the
// heads), one-rank groups targeted: at least 4 x 4 x 3 = 48 steps (an
// all-gather group was Unimplemented before it ran point to point within its
// group).
TEST(AllToAllMixedTest, EveryCombinationOfSchemesRunsInOneStep) {
  constexpr int32_t kN = 8, kH = 4, kD = 8;
  // The first plan (of a few batches and strategies) with three groups of
  // several ranks, at least two of a size dividing kH.
  std::optional<core::Plan> plan;
  std::vector<std::vector<int32_t>> multi, single;
  for (int seed = 0; seed < 400 && !plan; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> lens;
    for (int d = 0; d < 10; ++d) lens.push_back(1 + static_cast<int64_t>(rng() % 120));
    for (core::Strategy s : {core::Strategy::kFlashCp, core::Strategy::kWholeDoc}) {
      absl::StatusOr<core::Plan> p = core::MakePlan(s, core::Batch{lens, kN});
      ASSERT_THAT(p, IsOk());
      std::vector<std::vector<int32_t>> m, o;
      int dividing = 0;
      for (const std::vector<int32_t>& ranks : core::PlanRankGroups(*p)) {
        (ranks.size() > 1 ? m : o).push_back(ranks);
        dividing += ranks.size() > 1 && kH % static_cast<int32_t>(ranks.size()) == 0;
      }
      if (m.size() == 3 && dividing >= 2) {
        plan = *p;
        multi = m;
        single = o;
        break;
      }
    }
  }
  ASSERT_TRUE(plan.has_value()) << "no plan with three multi-rank groups";
  const core::CommScheme kAll[] = {core::CommScheme::kTargeted, core::CommScheme::kAllGather,
                                   core::CommScheme::kFullKv, core::CommScheme::kAllToAll};
  int runs = 0, want_runs = 1;
  for (const std::vector<int32_t>& g : multi)
    want_runs *= kH % static_cast<int32_t>(g.size()) == 0 ? 4 : 3;
  for (int combo = 0; combo < 64; ++combo) {
    std::vector<core::RankGroup> groups;
    bool ok = true;
    for (size_t g = 0; g < multi.size(); ++g) {
      const core::CommScheme s = kAll[(combo >> (2 * g)) & 3];
      ok = ok && (s != core::CommScheme::kAllToAll ||
                  kH % static_cast<int32_t>(multi[g].size()) == 0);
      groups.push_back(core::RankGroup{multi[g], s});
    }
    if (!ok) continue;
    for (const std::vector<int32_t>& ranks : single)
      groups.push_back(core::RankGroup{ranks, core::CommScheme::kTargeted});
    SCOPED_TRACE(absl::StrCat("combination ", combo));
    RunMixed(*plan, groups, kH, kD);
    ++runs;
  }
  EXPECT_EQ(runs, want_runs);
  EXPECT_GE(runs, 48);
  // Refused: groups that are not the plan's.
  std::vector<core::RankGroup> merged = {core::RankGroup{{0, 1, 2, 3, 4, 5, 6, 7},
                                                         core::CommScheme::kTargeted}};
  EXPECT_THAT(CpAttentionStep::CreateMixed(*plan, 0, AttentionShape{kH, kD, 0.3f}, merged),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not the plan's")));
}

// A group of `plan` the two-level scheme can run with `per_node` ranks a
// node and `heads` heads: it spans nodes in equal parts whose size divides
// the heads.
bool TwoLevelRuns(const core::Plan& plan, const std::vector<int32_t>& ranks, int32_t per_node,
                  int32_t heads) {
  absl::StatusOr<core::TwoLevelParts> parts = core::TwoLevelNeeds(plan, ranks, per_node);
  return parts.ok() && heads % static_cast<int32_t>(parts->parts.front().size()) == 0;
}

// A mixed plan with two-level groups (core/two_level.h) runs in one step on
// the engine: at N = 8 with 2 and 4 ranks a node, every group the scheme
// can run is two-level, the others each of the other schemes in turn;
// outputs and gradients equal the reference, every rank's bytes and its
// bytes across nodes equal core::GroupedSchemeBytes' (TwoLevelGroupPhase's
// for the two-level groups) exactly.
TEST(TwoLevelMixedTest, TwoLevelGroupsRunBesideEveryOtherScheme) {
  constexpr int32_t kN = 8, kH = 4, kD = 8;
  int runs = 0, two_level_groups = 0, inter_node_bytes = 0, heads_refused = 0;
  for (int32_t per_node : {2, 4}) {
    // The first plan with a two-level group and another multi-rank group.
    std::optional<core::Plan> plan;
    for (int seed = 0; seed < 400 && !plan; ++seed) {
      std::mt19937_64 rng(seed + 1000 * per_node);
      std::vector<int64_t> lens;
      for (int d = 0; d < 10; ++d) lens.push_back(1 + static_cast<int64_t>(rng() % 120));
      for (core::Strategy s : {core::Strategy::kFlashCp, core::Strategy::kWholeDoc}) {
        absl::StatusOr<core::Plan> p = core::MakePlan(s, core::Batch{lens, kN});
        ASSERT_THAT(p, IsOk());
        int wide = 0, other = 0;  // two-level groups of node parts of 2 or more
        for (const std::vector<int32_t>& ranks : core::PlanRankGroups(*p)) {
          if (TwoLevelRuns(*p, ranks, per_node, kH)) {
            wide += core::TwoLevelNeeds(*p, ranks, per_node)->parts.front().size() > 1;
          } else if (ranks.size() > 1) {
            ++other;
          }
        }
        if (wide >= 1 && other >= 1) {
          plan = *p;
          break;
        }
      }
    }
    ASSERT_TRUE(plan.has_value()) << "no plan with a two-level group at " << per_node;
    const core::CommScheme kOthers[] = {core::CommScheme::kTargeted, core::CommScheme::kAllGather,
                                        core::CommScheme::kFullKv, core::CommScheme::kAllToAll};
    for (core::CommScheme other : kOthers) {
      std::vector<core::RankGroup> groups;
      for (const std::vector<int32_t>& ranks : core::PlanRankGroups(*plan)) {
        if (TwoLevelRuns(*plan, ranks, per_node, kH)) {
          groups.push_back(core::RankGroup{ranks, core::CommScheme::kAllToAll, true});
          two_level_groups += other == core::CommScheme::kTargeted;
          continue;
        }
        const bool fits = other != core::CommScheme::kAllToAll ||
                          kH % static_cast<int32_t>(ranks.size()) == 0;
        groups.push_back(core::RankGroup{ranks, fits ? other : core::CommScheme::kTargeted});
      }
      SCOPED_TRACE(absl::StrCat("ranks_per_node ", per_node, ", others ",
                                core::CommSchemeName(other)));
      RunMixed(*plan, groups, kH, kD, per_node);
      ++runs;
      const core::ModelShape model{kH, kD, 4};
      const core::SchemeBytes b = *core::GroupedSchemeBytes(
          *plan, *core::AnalyzePlan(*plan, model, per_node), groups, model, per_node);
      inter_node_bytes += b.phase.inter_node_bytes > 0;
    }
    // Refused before any exchange, on every rank, naming why.
    std::vector<core::RankGroup> two;
    size_t first_two = 0;
    for (const std::vector<int32_t>& ranks : core::PlanRankGroups(*plan)) {
      const bool runs_it = TwoLevelRuns(*plan, ranks, per_node, kH);
      // The first two-level group of node parts of 2 or more.
      if (runs_it && (two.empty() || !two[first_two].two_level ||
                      core::TwoLevelNeeds(*plan, two[first_two].ranks, per_node)
                              ->parts.front().size() == 1) &&
          core::TwoLevelNeeds(*plan, ranks, per_node)->parts.front().size() > 1)
        first_two = two.size();
      two.push_back(core::RankGroup{ranks, core::CommScheme::kAllToAll, runs_it});
      if (!runs_it) two.back().scheme = core::CommScheme::kTargeted;
    }
    ASSERT_TRUE(two[first_two].two_level);
    const AttentionShape shape{kH, kD, 0.3f};
    // An earlier two-level group of parts of one would be named first.
    for (size_t i = 0; i < first_two; ++i) {
      two[i].two_level = false;
      two[i].scheme = core::CommScheme::kTargeted;
    }
    const std::string g = absl::StrCat("groups[", first_two, "]: ");
    for (int32_t r : {0, kN - 1}) {
      EXPECT_THAT(CpAttentionStep::CreateMixed(*plan, r, shape, two, 0),
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           g + "ranks_per_node: the two-level scheme needs nodes "
                               "(ranks_per_node > 0)"));
      EXPECT_THAT(CpAttentionStep::CreateMixed(*plan, r, shape, two, kN),
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           HasSubstr(g + "ranks_per_node: the group spans one node of 8 ranks; "
                                         "the two-level scheme is the all-to-all there")));
      // P + 1 heads do not split over a node part of P > 1 ranks.
      const int32_t p = static_cast<int32_t>(
          core::TwoLevelNeeds(*plan, two[first_two].ranks, per_node)->parts.front().size());
      if (p > 1) {
        EXPECT_THAT(CpAttentionStep::CreateMixed(*plan, r, AttentionShape{p + 1, kD, 0.3f}, two,
                                                 per_node),
                    StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr(absl::StrCat(
                                 g, "query_heads: the all-to-all over a group of ", p, " ranks"))));
        ++heads_refused;
      }
      EXPECT_THAT(CpAttentionStep::CreateMixed(*plan, r, AttentionShape{0, kD, 0.3f}, two,
                                               per_node),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           "shape: heads 0, head_dim 8, scale 0.3 (each must be positive)"));
      std::vector<core::RankGroup> wrong = two;
      wrong[first_two].scheme = core::CommScheme::kTargeted;
      EXPECT_THAT(CpAttentionStep::CreateMixed(*plan, r, shape, wrong, per_node),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           g + "two_level with scheme targeted; the two-level scheme is "
                               "all_to_all within each node"));
    }
  }
  EXPECT_EQ(runs, 8);
  EXPECT_GE(two_level_groups, 2);
  EXPECT_EQ(inter_node_bytes, 8);  // every run moved KV across nodes
  EXPECT_GT(heads_refused, 0);
}

// BuildTwoLevelRankLayout by hand (core_two_level_test's zigzagged
// document: 16 tokens over 4 ranks, 2 a node; rank 0 [0, 2) + [14, 16),
// rank 1 [2, 4) + [12, 14), rank 2 [4, 6) + [10, 12), rank 3 [6, 10)).
TEST(TwoLevelLayoutTest, ZigzaggedDocumentOverTwoNodes) {
  core::Plan plan;
  plan.cp_size = 4;
  plan.doc_lens = {16};
  plan.shards = {{0, 0, 2, 0}, {0, 14, 2, 0}, {0, 2, 2, 1}, {0, 12, 2, 1},
                 {0, 4, 2, 2}, {0, 10, 2, 2}, {0, 6, 4, 3}};
  ASSERT_THAT(core::ValidatePlan(plan), IsOk());
  const core::CommLayout layout = *core::BuildCommLayout(plan);
  // Rank 0, position 0 of node 0's part {0, 1}: head-parallel rows 0-3
  // hold positions 0-3, rows 4-7 positions 12-15.
  absl::StatusOr<CpRankLayout> p = BuildTwoLevelRankLayout(plan, layout, 0, {3, 2, 1, 0}, 2);
  ASSERT_THAT(p, IsOk());
  EXPECT_TRUE(p->a2a.two_level);
  EXPECT_EQ(p->collective, Collective::kAllToAll);
  EXPECT_EQ(p->a2a.group, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(p->a2a.rows, 8);
  EXPECT_TRUE(CallsExchange(*p));
  // To rank 2 (position 0 of node 1) positions 0-3, which node 1's last
  // position (11) sees; from it positions 4-11.
  EXPECT_EQ(p->pack_rows, (std::vector<int64_t>{0, 1, 2, 3}));
  ASSERT_EQ(p->sends.size(), 1u);
  EXPECT_EQ(p->sends[0].peer, 2);
  EXPECT_EQ(p->sends[0].rows, 4);
  ASSERT_EQ(p->recvs.size(), 1u);
  EXPECT_EQ(p->recvs[0].peer, 2);
  EXPECT_EQ(p->recv_rows, 8);
  EXPECT_EQ(p->back_rows, 4);
  // Positions 0-3 whole; 12-15 on [0-3 own, 4-11 received, 12-15 own].
  EXPECT_EQ(p->whole_start, (std::vector<int64_t>{0}));
  EXPECT_EQ(p->whole_len, (std::vector<int32_t>{4}));
  EXPECT_EQ(p->prefix_q_start, (std::vector<int64_t>{4}));
  EXPECT_EQ(p->prefix_kv_len, (std::vector<int32_t>{16}));
  std::vector<int64_t> stage = {0, 1, 2, 3};
  for (int64_t x = 0; x < 8; ++x) stage.push_back(RemoteRow(x));
  for (int64_t x = 4; x < 8; ++x) stage.push_back(x);
  EXPECT_EQ(p->stage_src, stage);
  // Rank 3, position 1 of node 1's part {2, 3}: positions 4-11 are one run
  // (rows 0-7), all sent to rank 1; positions 0-3 received from it.
  p = BuildTwoLevelRankLayout(plan, layout, 3, {0, 1, 2, 3}, 2);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->pack_rows, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p->sends[0].peer, 1);
  EXPECT_EQ(p->recv_rows, 4);
  EXPECT_TRUE(p->whole_start.empty());
  EXPECT_EQ(p->stage_src, (std::vector<int64_t>{RemoteRow(0), RemoteRow(1), RemoteRow(2),
                                                RemoteRow(3), 0, 1, 2, 3, 4, 5, 6, 7}));
  // Refusals.
  EXPECT_THAT(BuildTwoLevelRankLayout(plan, layout, 0, {1, 2, 3}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "group: does not hold rank 0"));
  EXPECT_THAT(BuildTwoLevelRankLayout(plan, layout, 0, {0, 1, 1, 2, 3}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "group: rank 1 given twice"));
  EXPECT_THAT(BuildTwoLevelRankLayout(plan, layout, 0, {0, 4}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "group: rank 4 outside [0, 4)"));
  EXPECT_THAT(BuildTwoLevelRankLayout(plan, layout, 0, {0, 1, 2, 3}, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "ranks_per_node: the two-level scheme needs nodes (ranks_per_node > 0)"));
  EXPECT_THAT(BuildTwoLevelRankLayout(plan, layout, 0, {0, 1, 2, 3}, 3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("3 ranks on node 0 but 1 on node 1")));
}

struct TwoLevelParam {
  int32_t n, per_node, hkv;
};
class TwoLevelStepTest : public ::testing::TestWithParam<TwoLevelParam> {};

// AllToAllStep::CreateTwoLevel, GQA included, on every group of every
// strategy's plan (Cases) that spans nodes in equal parts: O, dQ, dK, dV
// equal the reference, and each rank's bytes forward, and forward plus
// backward, to ranks on its node and on others, equal
// core::TwoLevelGroupPhase's exactly. Ranks outside such groups idle.
TEST_P(TwoLevelStepTest, MatchesReferenceAndPredictedLinkBytes) {
  const auto [n, per_node, hkv] = GetParam();
  constexpr int32_t kHq = 8, kD = 8;
  const float scale = 1.0f / std::sqrt(float{kD});
  int ran = 0;
  for (const Case& c : Cases(n)) {
    const int64_t total = core::TotalTokens(c.doc_lens);
    std::mt19937_64 rng(total * 17 + n);
    const std::vector<float> q = Random(total * kHq * kD, rng), k = Random(total * hkv * kD, rng),
                             v = Random(total * hkv * kD, rng),
                             dout = Random(total * kHq * kD, rng);
    const AttentionShape full{kHq, kD, scale};
    const std::vector<float> kx = Expand(k, total, kHq, hkv, kD),
                             vx = Expand(v, total, kHq, hkv, kD);
    std::vector<float> ro(total * kHq * kD), rlse(total * kHq), rdq(total * kHq * kD),
        rdkx(total * kHq * kD), rdvx(total * kHq * kD);
    ASSERT_THAT(ReferenceForward(full, c.doc_lens, q, kx, vx, absl::MakeSpan(ro),
                                 absl::MakeSpan(rlse)), IsOk());
    ASSERT_THAT(ReferenceBackward(full, c.doc_lens, q, kx, vx, dout, absl::MakeSpan(rdq),
                                  absl::MakeSpan(rdkx), absl::MakeSpan(rdvx)), IsOk());
    const std::vector<float> rdk = Reduce(rdkx, total, kHq, hkv, kD),
                             rdv = Reduce(rdvx, total, kHq, hkv, kD);
    for (core::Strategy strategy : Strategies()) {
      absl::StatusOr<core::Plan> plan = core::MakePlan(strategy, core::Batch{c.doc_lens, n});
      if (strategy == core::Strategy::kBasp && !plan.ok()) continue;  // unequal documents
      ASSERT_THAT(plan, IsOk()) << core::StrategyName(strategy);
      SCOPED_TRACE(absl::StrCat("N=", n, " per_node=", per_node, " Hkv=", hkv, " case=", c.name,
                                " strategy=", core::StrategyName(strategy)));
      core::ModelShape model;
      model.heads = hkv;
      model.head_dim = kD;
      model.dtype_bytes = 4;
      model.query_heads = kHq;
      absl::StatusOr<core::PlanMetrics> metrics = core::AnalyzePlan(*plan, model, per_node);
      ASSERT_THAT(metrics, IsOk());
      // Per rank: its two-level group and position there (none: idle).
      std::vector<std::vector<int32_t>> group_of(n);
      std::vector<core::GroupPhaseBytes> want(n);
      std::vector<int32_t> pos(n, -1);
      bool any = false;
      for (const std::vector<int32_t>& ranks : core::PlanRankGroups(*plan)) {
        if (!TwoLevelRuns(*plan, ranks, per_node, kHq)) continue;
        absl::StatusOr<core::GroupPhaseBytes> b =
            core::TwoLevelGroupPhase(*plan, *metrics, ranks, model, per_node);
        ASSERT_THAT(b, IsOk());
        for (size_t i = 0; i < ranks.size(); ++i) {
          group_of[ranks[i]] = ranks;
          want[ranks[i]] = *b;
          pos[ranks[i]] = static_cast<int32_t>(i);
        }
        any = true;
      }
      if (!any) continue;
      absl::StatusOr<core::CommLayout> layout = core::BuildCommLayout(*plan);
      ASSERT_THAT(layout, IsOk());
      const std::vector<std::vector<int64_t>> global = GlobalRows(*plan, *layout);
      const int64_t rows = core::TokensPerRank(total, n);
      testing::RunRanks(n, absl::Seconds(60), [&](int32_t r, Communicator& gloo) {
        if (pos[r] < 0) return;
        absl::StatusOr<AllToAllStep> step = AllToAllStep::CreateTwoLevel(
            *plan, r, HeadShape{kHq, hkv, kD, scale}, group_of[r], per_node);
        ASSERT_THAT(step, IsOk());
        ASSERT_TRUE(step->layout().a2a.two_level);
        auto local = [&](const std::vector<float>& g, int32_t heads) {
          return LocalRows(global[r], g, int64_t{heads} * kD);
        };
        const std::vector<float> lq = local(q, kHq), lk = local(k, hkv), lv = local(v, hkv),
                                 ldout = local(dout, kHq);
        std::vector<float> o(rows * kHq * kD), dq(rows * kHq * kD), dk(rows * hkv * kD),
            dv(rows * hkv * kD);
        ThreadPool pool(1);
        LinkCounter comm(gloo, per_node);
        ASSERT_THAT(step->Forward(comm, pool, lq, lk, lv, absl::MakeSpan(o)), IsOk());
        const core::GroupPhaseBytes& w = want[r];
        const int32_t i = pos[r];
        EXPECT_EQ(comm.inter_sent, w.inter_sent[i]) << "rank " << r;
        EXPECT_EQ(comm.inter_received, w.inter_received[i]) << "rank " << r;
        EXPECT_EQ(comm.intra_sent, w.sent[i] - w.inter_sent[i]) << "rank " << r;
        EXPECT_EQ(comm.intra_received, w.received[i] - w.inter_received[i]) << "rank " << r;
        ASSERT_THAT(step->Backward(comm, pool, ldout, absl::MakeSpan(dq), absl::MakeSpan(dk),
                                   absl::MakeSpan(dv)), IsOk());
        // Backward sends what forward received, link by link.
        const int64_t inter = w.inter_sent[i] + w.inter_received[i];
        EXPECT_EQ(comm.inter_sent, inter) << "rank " << r;
        EXPECT_EQ(comm.inter_received, inter) << "rank " << r;
        EXPECT_EQ(comm.intra_sent + comm.inter_sent, w.sent[i] + w.received[i]) << "rank " << r;
        EXPECT_EQ(comm.intra_received + comm.inter_received, w.sent[i] + w.received[i])
            << "rank " << r;
        EXPECT_LE(MaxRelError(o, local(ro, kHq)), kTol) << "rank " << r << " o";
        EXPECT_LE(MaxRelError(dq, local(rdq, kHq)), kTol) << "rank " << r << " dq";
        EXPECT_LE(MaxRelError(dk, local(rdk, hkv)), kTol) << "rank " << r << " dk";
        EXPECT_LE(MaxRelError(dv, local(rdv, hkv)), kTol) << "rank " << r << " dv";
      });
      ++ran;
    }
  }
  // The one-document case is one group of N under every strategy.
  EXPECT_GE(ran, static_cast<int>(Strategies().size()));
  RecordProperty("ran", ran);
}

INSTANTIATE_TEST_SUITE_P(NodesAndHeads, TwoLevelStepTest,
                         ::testing::Values(TwoLevelParam{4, 2, 8}, TwoLevelParam{4, 2, 2},
                                           TwoLevelParam{8, 2, 2}, TwoLevelParam{8, 4, 8},
                                           TwoLevelParam{8, 4, 2}),
                         [](const auto& info) {
                           return absl::StrCat("N", info.param.n, "_G", info.param.per_node,
                                               "_Hkv", info.param.hkv);
                         });

// BuildCpRankLayout within a group: an all-gather's blocks point to point
// among the group's ranks only, at the sender's position in the group; the
// group's own largest compacted block; bad groups refused.
TEST(GroupLayoutTest, AllGatherWithinAGroupIsPointToPointAmongItsRanks) {
  // whole_doc over 4 ranks of [6, 2, 6, 2]: 16 tokens, 4 a rank; document 0
  // is [0, 2) on rank 2 and [2, 6) on rank 0, document 2 [0, 2) on rank 3
  // and [2, 6) on rank 1: groups {0, 2} and {1, 3}, each with one rank
  // sending 2 non-last tokens.
  const core::Plan plan = *core::MakePlan(core::Strategy::kWholeDoc, core::Batch{{6, 2, 6, 2}, 4});
  ASSERT_EQ(core::PlanRankGroups(plan), (std::vector<std::vector<int32_t>>{{0, 2}, {1, 3}}));
  const core::CommLayout layout = *core::BuildCommLayout(plan);
  absl::StatusOr<CpRankLayout> p =
      BuildCpRankLayout(plan, layout, 3, core::CommScheme::kAllGather, {3, 1});
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->collective, Collective::kSendRecv);
  EXPECT_EQ(p->block_rows, 2);  // rank 3 sends the 2 non-last tokens of document 2
  ASSERT_EQ(p->sends.size(), 1u);
  EXPECT_EQ(p->sends[0].peer, 1);
  EXPECT_EQ(p->sends[0].rows, 2);
  ASSERT_EQ(p->recvs.size(), 1u);
  EXPECT_EQ(p->recvs[0].peer, 1);
  EXPECT_EQ(p->recvs[0].first, 0);  // rank 1 is the group's first
  EXPECT_EQ(p->recv_rows, 4);
  absl::StatusOr<CpRankLayout> full =
      BuildCpRankLayout(plan, layout, 0, core::CommScheme::kFullKv, {0, 2});
  ASSERT_THAT(full, IsOk());
  EXPECT_EQ(full->block_rows, 4);
  EXPECT_EQ(full->recv_rows, 8);
  ASSERT_EQ(full->recvs.size(), 1u);
  EXPECT_EQ(full->recvs[0].peer, 2);
  EXPECT_EQ(full->recvs[0].first, 4);  // rank 2's block, second in the group
  // Without a group: the all-gather of all four ranks, unchanged.
  absl::StatusOr<CpRankLayout> all = BuildCpRankLayout(plan, layout, 3, core::CommScheme::kAllGather);
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->collective, Collective::kAllGather);
  EXPECT_EQ(all->recv_rows, 8);
  EXPECT_EQ(all->sends.size(), 3u);
  EXPECT_THAT(BuildCpRankLayout(plan, layout, 0, core::CommScheme::kAllGather, {1, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group: does not hold rank 0")));
  EXPECT_THAT(BuildCpRankLayout(plan, layout, 0, core::CommScheme::kAllGather, {0, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group: rank 0 given twice")));
  EXPECT_THAT(BuildCpRankLayout(plan, layout, 0, core::CommScheme::kAllGather, {0, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group: rank 4 outside [0, 4)")));
}

TEST(AllToAllStepErrorsTest, RefusesAGroupThatDoesNotDivideTheHeadsAndBadShapes) {
  // per_doc over 3 ranks: one group of 3, which 8 query heads do not split.
  const core::Plan plan = *core::MakePlan(core::Strategy::kPerDoc, core::Batch{{90, 30}, 3});
  EXPECT_THAT(AllToAllStep::Create(plan, 0, HeadShape{8, 2, 8, 0.5f}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("query_heads: the all-to-all over a group of 3 ranks")));
  EXPECT_THAT(AllToAllStep::Create(plan, 0, HeadShape{6, 4, 8, 0.5f}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_heads 4")));
  EXPECT_THAT(AllToAllStep::Create(plan, 3, HeadShape{6, 2, 8, 0.5f}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank: 3 outside")));
  absl::StatusOr<AllToAllStep> ok = AllToAllStep::Create(plan, 1, HeadShape{6, 2, 8, 0.5f});
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->heads().query[1], (core::HeadRange{2, 2}));
  EXPECT_EQ(ok->heads().kv[1], (core::HeadRange{0, 2}));  // heads 2, 3 read KV 0 and 1
}

}  // namespace
}  // namespace flashcp::worker
