// The whole GPU CP step (ranks as threads on one GPU, device-local
// communicator) against the CPU reference over the packed batch, for every
// scheme and several strategies, with cuDNN and with the plain kernels; and
// the bytes every rank moved equal the plan analysis's prediction; the same
// under the all-to-all (heads, gpu_a2a_step.h). Under the
// block-diffusion mask: the masked kernels (masked_attention_kernels.h) in the
// step against the fp64 block-diffusion oracle (worker/mask_reference.h, the
// one the CPU engine's engine_mask_test checks against).
#include <random>
#include <vector>

#include "core/mask.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cuda/cp_check.h"
#include "worker/cuda/gpu_test_util.h"

namespace flashcp::worker::cuda {
namespace {

using core::testing::IsOk;

struct Case {
  std::vector<int64_t> docs;
  int32_t n;
};

TEST(GpuCpStepTest, MatchesReferenceForEveryScheme) {
  FLASHCP_SKIP_WITHOUT_GPU();
  // Small enough that the fp64 reference (once per case, cached) stays fast.
  const std::vector<Case> cases = {{{1}, 1},
                                   {{700}, 2},
                                   {{300, 1, 1, 45, 500, 2, 60}, 3},
                                   {{600, 100, 7, 7, 200, 300}, 4},
                                   {{1024}, 8}};
  for (const Case& c : cases) {
    CpReferenceCache cache;
    const uint64_t seed = std::random_device{}();
    for (AttentionBackend backend : {AttentionBackend::kPlain, AttentionBackend::kCudnn}) {
      for (core::Strategy strategy : {core::Strategy::kFlashCp, core::Strategy::kLlama3,
                                      core::Strategy::kPerDoc, core::Strategy::kZigzag}) {
        auto plan = core::MakePlan(strategy, core::Batch{c.docs, c.n});
        ASSERT_THAT(plan, IsOk());
        for (core::CommScheme scheme : core::kKvCommSchemes) {
          CpCheckOptions options;
          options.scheme = scheme;
          options.shape = {.heads_q = 4, .heads_kv = 2, .head_dim = 128};
          options.backend = backend;
          options.seed = seed;
          options.reference_cache = &cache;
          SCOPED_TRACE(testing::Message()
                       << (backend == AttentionBackend::kCudnn ? "cudnn " : "plain ")
                       << core::StrategyName(strategy) << " " << core::CommSchemeName(scheme)
                       << " n=" << c.n << " seed=" << options.seed);
          auto check = RunCpCheck(*plan, options);
          ASSERT_THAT(check, IsOk());
          EXPECT_TRUE(check->errors.ok()) << check->errors.ToString();
          EXPECT_EQ(check->bytes_sent, check->predicted_sent);
          EXPECT_EQ(check->bytes_received, check->predicted_received);
          EXPECT_EQ(check->fallback, "");
        }
      }
    }
  }
}

TEST(GpuCpStepTest, MatchesReferenceUnderBlockDiffusion) {
  FLASHCP_SKIP_WITHOUT_GPU();
  // Short, long and one-token documents (2C = 220), as the CPU engine's test.
  const std::vector<int64_t> docs = {1, 37, 3, 1, 50, 5, 1, 12};
  int ran = 0;
  for (int32_t n : {1, 2, 3, 4}) {
    for (int64_t b : {1, 4, 16}) {
      CpReferenceCache cache;
      const uint64_t seed = std::random_device{}();
      core::PlanOptions plan_options;
      plan_options.attention_mask = {core::MaskKind::kBlockDiffusion, b};
      for (core::Strategy strategy : core::AllStrategies()) {
        if (!core::PlansMask(strategy, plan_options.attention_mask)) continue;
        auto plan = core::MakePlan(strategy, core::Batch{docs, n}, plan_options);
        // csbp refuses a batch with fewer blocks than ranks.
        if (strategy == core::Strategy::kCsbp &&
            plan.status().code() == absl::StatusCode::kFailedPrecondition)
          continue;
        ASSERT_THAT(plan, IsOk());
        for (core::CommScheme scheme : core::kKvCommSchemes) {
          CpCheckOptions options;
          options.scheme = scheme;
          options.shape = {.heads_q = 4, .heads_kv = 2, .head_dim = 64};
          options.backend = AttentionBackend::kPlain;  // unused: the masked kernels run
          options.seed = seed;
          options.reference_cache = &cache;
          SCOPED_TRACE(testing::Message() << core::StrategyName(strategy) << " "
                                          << core::CommSchemeName(scheme) << " n=" << n
                                          << " b=" << b << " seed=" << seed);
          auto check = RunCpCheck(*plan, options);
          ASSERT_THAT(check, IsOk());
          EXPECT_TRUE(check->errors.ok()) << check->errors.ToString();
          EXPECT_EQ(check->bytes_sent, check->predicted_sent);
          EXPECT_EQ(check->bytes_received, check->predicted_received);
          ++ran;
        }
      }
    }
  }
  EXPECT_GE(ran, 4 * 3 * 3);
}

TEST(GpuCpStepTest, MatchesReferenceUnderAllToAll) {
  FLASHCP_SKIP_WITHOUT_GPU();
  // The all-to-all (gpu_a2a_step.h) through GpuCpRank: heads over each rank
  // group of the plan, documents whole, against the fp64 reference (LSE
  // stays with the heads, not compared), bytes equal to the analysis's
  // bytes[all_to_all] (bf16, Hq). Shapes: MHA, GQA in the attention's order,
  // and (6, 3) where position 0 of a group of 2 reads KV heads 0, 0, 1 (each
  // query head gets its KV head's copy). A group whose size does not divide
  // Hq is FailedPrecondition naming query_heads, as the CPU engine's.
  const std::vector<Case> cases = {{{1}, 1},
                                   {{700}, 2},
                                   {{300, 1, 1, 45, 500, 2, 60}, 3},
                                   {{600, 100, 7, 7, 200, 300}, 4},
                                   {{512, 512}, 4},
                                   {{1024}, 8}};
  const AttentionShape shapes[] = {{.heads_q = 8, .heads_kv = 8, .head_dim = 64},
                                   {.heads_q = 8, .heads_kv = 2, .head_dim = 64},
                                   {.heads_q = 6, .heads_kv = 3, .head_dim = 64}};
  int ran = 0, refused = 0;
  for (const Case& c : cases) {
    for (const AttentionShape& shape : shapes) {
      CpReferenceCache cache;
      const uint64_t seed = std::random_device{}();
      for (AttentionBackend backend : {AttentionBackend::kPlain, AttentionBackend::kCudnn}) {
        for (core::Strategy strategy : {core::Strategy::kFlashCp, core::Strategy::kPerDoc,
                                        core::Strategy::kWholeDoc}) {
          auto plan = core::MakePlan(strategy, core::Batch{c.docs, c.n});
          ASSERT_THAT(plan, IsOk());
          CpCheckOptions options;
          options.scheme = core::CommScheme::kAllToAll;
          options.shape = shape;
          options.backend = backend;
          options.seed = seed;
          options.reference_cache = &cache;
          SCOPED_TRACE(testing::Message()
                       << (backend == AttentionBackend::kCudnn ? "cudnn " : "plain ")
                       << core::StrategyName(strategy) << " n=" << c.n << " hq=" << shape.heads_q
                       << " hkv=" << shape.heads_kv << " seed=" << seed);
          auto check = RunCpCheck(*plan, options);
          if (check.status().code() == absl::StatusCode::kFailedPrecondition) {
            EXPECT_THAT(std::string(check.status().message()), testing::HasSubstr("query_heads"));
            ++refused;
            continue;
          }
          ASSERT_THAT(check, IsOk());
          EXPECT_TRUE(check->errors.ok()) << check->errors.ToString();
          EXPECT_EQ(check->errors.lse.count, 0);  // not compared
          EXPECT_EQ(check->bytes_sent, check->predicted_sent);
          EXPECT_EQ(check->bytes_received, check->predicted_received);
          EXPECT_EQ(check->fallback, "");
          ++ran;
        }
      }
    }
  }
  EXPECT_GE(ran, 45);
  EXPECT_GE(refused, 1);  // groups of 3 cannot split 8 query heads
}

TEST(GpuCpStepTest, MatchesReferenceUnderTwoLevel) {
  FLASHCP_SKIP_WITHOUT_GPU();
  // The two-level scheme (gpu_a2a_step.h over the node part, a GpuCpRank
  // over the head-parallel rows for the KV across nodes) over one group of
  // every rank, against the fp64 reference (LSE not compared), bytes equal to
  // core::GroupedSchemeBytes' (bf16, Hq). (6, 3) over node parts of 2, whose
  // position 0 reads KV heads 0, 0, 1, is Unimplemented naming query_heads.
  struct TwoLevelCase {
    std::vector<int64_t> docs;
    int32_t n, per_node;
  };
  const std::vector<TwoLevelCase> cases = {{{108, 11, 67, 131}, 4, 2},
                                           {{600, 100, 7, 7, 200, 300}, 8, 2},
                                           {{512, 512, 300, 1}, 8, 4}};
  const AttentionShape shapes[] = {{.heads_q = 8, .heads_kv = 8, .head_dim = 64},
                                   {.heads_q = 8, .heads_kv = 2, .head_dim = 64},
                                   {.heads_q = 6, .heads_kv = 3, .head_dim = 64}};
  int ran = 0, refused = 0;
  for (const TwoLevelCase& c : cases) {
    for (const AttentionShape& shape : shapes) {
      if (shape.heads_q % c.per_node != 0) continue;
      CpReferenceCache cache;
      const uint64_t seed = std::random_device{}();
      for (AttentionBackend backend : {AttentionBackend::kPlain, AttentionBackend::kCudnn}) {
        for (core::Strategy strategy : {core::Strategy::kFlashCp, core::Strategy::kPerDoc}) {
          auto plan = core::MakePlan(strategy, core::Batch{c.docs, c.n});
          ASSERT_THAT(plan, IsOk());
          CpCheckOptions options;
          options.scheme = core::CommScheme::kAllToAll;
          options.two_level_ranks_per_node = c.per_node;
          options.shape = shape;
          options.backend = backend;
          options.seed = seed;
          options.reference_cache = &cache;
          SCOPED_TRACE(testing::Message()
                       << (backend == AttentionBackend::kCudnn ? "cudnn " : "plain ")
                       << core::StrategyName(strategy) << " n=" << c.n
                       << " per_node=" << c.per_node << " hq=" << shape.heads_q
                       << " hkv=" << shape.heads_kv << " seed=" << seed);
          auto check = RunCpCheck(*plan, options);
          if (check.status().code() == absl::StatusCode::kUnimplemented) {
            EXPECT_EQ(shape.heads_q, 6);
            EXPECT_THAT(std::string(check.status().message()), testing::HasSubstr("query_heads"));
            ++refused;
            continue;
          }
          ASSERT_THAT(check, IsOk());
          EXPECT_TRUE(check->errors.ok()) << check->errors.ToString();
          EXPECT_EQ(check->errors.lse.count, 0);  // not compared
          EXPECT_EQ(check->bytes_sent, check->predicted_sent);
          EXPECT_EQ(check->bytes_received, check->predicted_received);
          ++ran;
        }
      }
    }
  }
  EXPECT_EQ(ran, 6 * 2 * 2);      // (n, per_node, shape) cases that run, x backends x strategies
  EXPECT_EQ(refused, 2 * 2 * 2);  // (6, 3) at 2 a node, N = 4 and 8
}

}  // namespace
}  // namespace flashcp::worker::cuda
