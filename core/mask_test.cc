#include "core/mask.h"

#include <set>
#include <tuple>
#include <vector>

#include "core/analysis.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MaskTest, NamesRoundTripAndUnknownIsInvalid) {
  EXPECT_EQ(MaskKindName(MaskKind::kCausalDocument), "causal_document");
  EXPECT_EQ(MaskKindName(MaskKind::kBlockDiffusion), "block_diffusion");
  EXPECT_EQ(*ParseMaskKind(""), MaskKind::kCausalDocument);
  EXPECT_EQ(*ParseMaskKind("causal_document"), MaskKind::kCausalDocument);
  EXPECT_EQ(*ParseMaskKind("block_diffusion"), MaskKind::kBlockDiffusion);
  EXPECT_THAT(ParseMaskKind("bd3lm"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("attention_mask: unknown")));
}

TEST(MaskTest, BlockSizeRules) {
  EXPECT_THAT(ValidateAttentionMask({}), IsOk());
  EXPECT_THAT(ValidateAttentionMask({MaskKind::kBlockDiffusion, 1}), IsOk());
  for (int64_t bad : {int64_t{0}, int64_t{-4}, (int64_t{1} << 40) + 1}) {
    EXPECT_THAT(ValidateAttentionMask({MaskKind::kBlockDiffusion, bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size: must be")))
        << bad;
  }
  EXPECT_THAT(ValidateAttentionMask({MaskKind::kCausalDocument, 16}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block_size: only with attention_mask block_diffusion")));
}

// Hand-worked: L = 10, b = 4: blocks [0,4), [4,8) and the partial [8,10).
// Noisy block j (full): b*b + b*j*b = 16, 32; partial j = 2 of r = 2 tokens:
// r * (r + 8) = 20. Clean block j: b*(j+1)*b = 16, 32; partial: r * L = 20.
TEST(MaskTest, HandWorkedWorkloads) {
  EXPECT_EQ(NoisyRangeWorkload(10, 4, 0, 4), 16.0);
  EXPECT_EQ(NoisyRangeWorkload(10, 4, 4, 4), 32.0);
  EXPECT_EQ(NoisyRangeWorkload(10, 4, 8, 2), 20.0);
  EXPECT_EQ(CleanRangeWorkload(10, 4, 0, 4), 16.0);
  EXPECT_EQ(CleanRangeWorkload(10, 4, 4, 4), 32.0);
  EXPECT_EQ(CleanRangeWorkload(10, 4, 8, 2), 20.0);
  // [3, 9): token 3 sees 4 keys, tokens 4-7 8 each, token 8 10 (both copies).
  EXPECT_EQ(NoisyRangeWorkload(10, 4, 3, 6), 4.0 + 32.0 + 10.0);
  EXPECT_EQ(CleanRangeWorkload(10, 4, 3, 6), 4.0 + 32.0 + 10.0);
  EXPECT_EQ(NoisyRangeWorkload(10, 4, 9, 1), 10.0);  // own partial block 2 + clean [0, 8)
  EXPECT_EQ(CleanRangeWorkload(10, 4, 0, 1), 4.0);   // block-causal: sees all of block 0
  EXPECT_EQ(BlockDiffusionDocWorkload(10, 4), 136.0);
  // b divides L: L (L + b). b = 1: 2 * L(L+1)/2.
  EXPECT_EQ(BlockDiffusionDocWorkload(8, 4), 96.0);
  EXPECT_EQ(BlockDiffusionDocWorkload(7, 1), 56.0);
  EXPECT_EQ(BlockDiffusionDocWorkload(262144, 64), 262144.0 * (262144.0 + 64.0));
  // A one-token document: 1 noisy pair (itself), 1 clean pair.
  EXPECT_EQ(BlockDiffusionDocWorkload(1, 16), 2.0);
}

// The mask's table, one (query, key) pair of one document at a time.
bool Allowed(bool q_noisy, int64_t q, bool k_noisy, int64_t k, int64_t b) {
  const int64_t j = q / b, kb = k / b;
  if (q_noisy) return k_noisy ? kb == j : kb < j;
  return !k_noisy && kb <= j;
}

// Brute force over every (query, key) pair of a plan: each rank's workload,
// and the K/V tokens (plan document, position) each rank's queries see.
struct Oracle {
  std::vector<double> workload;
  std::vector<std::set<std::pair<int32_t, int64_t>>> needed;
};

Oracle BruteForce(const Plan& plan) {
  const int32_t docs = static_cast<int32_t>(plan.doc_lens.size());
  const bool bd = IsBlockDiffusion(plan.mask);
  const int32_t n = docs / 2;
  Oracle o;
  o.workload.assign(plan.cp_size, 0.0);
  o.needed.resize(plan.cp_size);
  for (const Shard& s : plan.shards) {
    for (int64_t q = s.start; q < s.start + s.len; ++q) {
      for (int32_t kd = 0; kd < docs; ++kd) {
        const bool same_source = bd ? (kd % n == s.doc % n) : kd == s.doc;
        if (!same_source) continue;
        for (int64_t k = 0; k < plan.doc_lens[kd]; ++k) {
          const bool ok = bd ? Allowed(s.doc < n, q, kd < n, k, plan.mask.block_size) : k <= q;
          if (!ok) continue;
          o.workload[s.rank] += 1.0;
          o.needed[s.rank].insert({kd, k});
        }
      }
    }
  }
  return o;
}

std::vector<int64_t> RandomDocs(SplitMix64Rng& rng, int64_t max_docs, int64_t max_len) {
  std::vector<int64_t> docs(1 + rng.Next() % max_docs);
  for (int64_t& d : docs) d = 1 + static_cast<int64_t>(rng.Next() % max_len);
  return docs;
}

// Workload, traffic and the compacted buffers against the brute force, on
// every block-diffusion strategy's plans of small random batches (and on
// causal plans, where the generic rule must equal analysis's own).
TEST(MaskTest, MatchesBruteForceOnSmallBatches) {
  SplitMix64Rng rng(25);
  int checked = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const Batch batch{RandomDocs(rng, 5, 23), static_cast<int32_t>(1 + rng.Next() % 4)};
    if (TotalTokens(batch.doc_lens) < batch.cp_size) continue;
    const int64_t b = 1 + static_cast<int64_t>(rng.Next() % 6);
    for (Strategy s : {Strategy::kLlama3, Strategy::kPerDoc, Strategy::kRing, Strategy::kCsbp,
                       Strategy::kFlashCp}) {
      PlanOptions options;
      options.attention_mask = {MaskKind::kBlockDiffusion, b};
      options.min_shard_tokens = 0;
      absl::StatusOr<Plan> plan = MakePlan(s, batch, options);
      if (s == Strategy::kCsbp && !plan.ok()) {
        EXPECT_THAT(plan, StatusIs(absl::StatusCode::kFailedPrecondition));
        continue;
      }
      ASSERT_THAT(plan, IsOk()) << StrategyName(s);
      ASSERT_THAT(ValidatePlan(*plan), IsOk());
      const Oracle o = BruteForce(*plan);
      const MaskTraffic t = ComputeMaskTraffic(*plan);
      absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{1, 1, 1});
      ASSERT_THAT(m, IsOk());
      const int32_t n = plan->cp_size;
      const int32_t half = static_cast<int32_t>(plan->doc_lens.size() / 2);
      std::vector<int64_t> recv(n, 0), clean_recv(n, 0), sent(n, 0), elsewhere(n, 0);
      std::vector<std::vector<int32_t>> owner(plan->doc_lens.size());
      for (size_t d = 0; d < plan->doc_lens.size(); ++d) owner[d].assign(plan->doc_lens[d], -1);
      for (const Shard& sh : plan->shards) {
        for (int64_t k = sh.start; k < sh.start + sh.len; ++k) owner[sh.doc][k] = sh.rank;
      }
      std::set<std::pair<int32_t, int64_t>> wanted_elsewhere;
      for (int32_t r = 0; r < n; ++r) {
        EXPECT_EQ(m->rank_workload[r], o.workload[r]) << StrategyName(s) << " rank " << r;
        for (const auto& [d, k] : o.needed[r]) {
          const int32_t q = owner[d][k];
          if (q == r) continue;
          ++recv[r];
          ++sent[q];
          if (d >= half) ++clean_recv[r];
          wanted_elsewhere.insert({d, k});
        }
      }
      for (const auto& [d, k] : wanted_elsewhere) ++elsewhere[owner[d][k]];
      EXPECT_EQ(t.received_tokens, recv) << StrategyName(s);
      EXPECT_EQ(t.sent_tokens, sent) << StrategyName(s);
      EXPECT_EQ(t.clean_received_tokens, clean_recv) << StrategyName(s);
      EXPECT_EQ(t.needed_elsewhere_tokens, elsewhere) << StrategyName(s);
      EXPECT_EQ(m->rank_nonlast_tokens, elsewhere);
      const PhaseTraffic& targeted = m->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
      EXPECT_EQ(targeted.received_tokens, recv);
      EXPECT_EQ(targeted.clean_received_tokens, clean_recv);
      ++checked;

      // The same batch under the causal mask: the generic rule equals
      // analysis's own targeted exchange and non-last counts.
      absl::StatusOr<Plan> causal = MakePlan(s == Strategy::kCsbp ? Strategy::kLlama3 : s, batch);
      ASSERT_THAT(causal, IsOk());
      const MaskTraffic ct = ComputeMaskTraffic(*causal);
      absl::StatusOr<PlanMetrics> cm = AnalyzePlan(*causal, ModelShape{1, 1, 1});
      ASSERT_THAT(cm, IsOk());
      const PhaseTraffic& cp = cm->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
      EXPECT_EQ(ct.sent_tokens, cp.sent_tokens);
      EXPECT_EQ(ct.received_tokens, cp.received_tokens);
      EXPECT_EQ(ct.needed_elsewhere_tokens, cm->rank_nonlast_tokens);
      EXPECT_EQ(ct.pair_tokens, TargetedPairTokens(*causal));
      const Oracle co = BruteForce(*causal);
      for (int32_t r = 0; r < n; ++r) EXPECT_EQ(cm->rank_workload[r], co.workload[r]);
    }
  }
  EXPECT_GT(checked, 500);
}

// One document of 8 tokens, b = 4, N = 2 as llama3 over the 16-token
// [noisy ; clean] sequence: rank 0 holds noisy [0,4) and clean [4,8), rank 1
// noisy [4,8) and clean [0,4). Rank 0's noisy block 0 needs no clean; its
// clean block 1 needs clean [0,8): 4 from rank 1. Rank 1's noisy block 1
// needs clean [0,4) (its own); its clean block 0 needs clean [0,4) (own).
TEST(MaskTest, HandWorkedLlama3Exchange) {
  PlanOptions options;
  options.attention_mask = {MaskKind::kBlockDiffusion, 4};
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kLlama3, Batch{{8}, 2}, options);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(plan->doc_lens, ElementsAre(8, 8));
  EXPECT_THAT(plan->shards, ElementsAre(Shard{0, 0, 4, 0}, Shard{1, 4, 4, 0},
                                        Shard{0, 4, 4, 1}, Shard{1, 0, 4, 1}));
  absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{1, 1, 2});
  ASSERT_THAT(m, IsOk());
  // rank 0: noisy block 0 = 16, clean block 1 = 32; rank 1: 32 + 16.
  EXPECT_THAT(m->rank_workload, ElementsAre(48.0, 48.0));
  EXPECT_THAT(m->rank_noisy_tokens, ElementsAre(4, 4));
  const PhaseTraffic& t = m->bytes[static_cast<int>(CommScheme::kTargeted)].phase;
  EXPECT_THAT(t.received_tokens, ElementsAre(4, 0));
  EXPECT_THAT(t.sent_tokens, ElementsAre(0, 4));
  EXPECT_THAT(t.clean_received_tokens, ElementsAre(4, 0));
  EXPECT_THAT(t.noisy_received_tokens, ElementsAre(0, 0));
  EXPECT_EQ(t.max_clean_received_bytes, 4 * 2 * 2);  // K and V, 2 bytes
  // full_kv: each rank receives the peer's 8 tokens, 4 clean and 4 noisy.
  const PhaseTraffic& f = m->bytes[static_cast<int>(CommScheme::kFullKv)].phase;
  EXPECT_THAT(f.received_tokens, ElementsAre(8, 8));
  EXPECT_THAT(f.clean_received_tokens, ElementsAre(4, 4));
  EXPECT_THAT(f.noisy_received_tokens, ElementsAre(4, 4));
  EXPECT_EQ(m->cut_noisy_blocks, 0);
}

TEST(MaskTest, PlanValidityUnderTheMask) {
  Plan plan;
  plan.cp_size = 1;
  plan.doc_lens = {3, 4};
  plan.shards = {Shard{0, 0, 3, 0}, Shard{1, 0, 4, 0}};
  EXPECT_THAT(ValidatePlan(plan), IsOk());  // causal: two documents
  plan.mask = {MaskKind::kBlockDiffusion, 2};
  EXPECT_THAT(ValidatePlan(plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("doc_lens[1]: the clean copy")));
  plan.doc_lens = {3, 3, 3};
  plan.shards = {Shard{0, 0, 3, 0}, Shard{1, 0, 3, 0}, Shard{2, 0, 3, 0}};
  EXPECT_THAT(ValidatePlan(plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("doc_lens: a block_diffusion")));
  plan.doc_lens = {3, 3};
  plan.shards = {Shard{0, 0, 3, 0}, Shard{1, 0, 3, 0}};
  EXPECT_THAT(ValidatePlan(plan), IsOk());
  plan.mask.block_size = 0;
  EXPECT_THAT(ValidatePlan(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
}

TEST(MaskTest, MakePlanRejectsBadMasks) {
  PlanOptions options;
  options.attention_mask = {MaskKind::kBlockDiffusion, 0};
  EXPECT_THAT(MakePlan(Strategy::kLlama3, Batch{{8}, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
  options.attention_mask = {MaskKind::kCausalDocument, 4};
  EXPECT_THAT(MakePlan(Strategy::kLlama3, Batch{{8}, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
  options.attention_mask = {MaskKind::kBlockDiffusion, 4};
  EXPECT_THAT(MakePlan(Strategy::kMagi, Batch{{8}, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("strategy: magi does not plan attention_mask block_diffusion")));
  absl::StatusOr<Plan> plan = MakePlan(Strategy::kLlama3, Batch{{8}, 2}, options);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(BuildCommLayout(*plan), IsOk());  // mask_layout_test.cc checks it
}

}  // namespace
}  // namespace flashcp::core

namespace flashcp::core {
namespace {

// core/mask_rule.h is constexpr (and __host__ __device__ under nvcc): the
// CUDA kernels evaluate this very function. The table of core/mask.h, b = 4.
static_assert(BlockDiffusionSees(4, true, 5, true, 7));    // noisy q, own noisy block
static_assert(!BlockDiffusionSees(4, true, 5, true, 3));   // noisy q, earlier noisy block
static_assert(BlockDiffusionSees(4, true, 5, false, 3));   // noisy q, earlier clean block
static_assert(!BlockDiffusionSees(4, true, 5, false, 4));  // noisy q, own clean block
static_assert(!BlockDiffusionSees(4, false, 5, true, 5));  // clean q never sees noisy
static_assert(BlockDiffusionSees(4, false, 5, false, 7));  // clean q, own clean block
static_assert(!BlockDiffusionSees(4, false, 5, false, 8)); // clean q, later clean block

}  // namespace
}  // namespace flashcp::core
