// Both attention implementations (plain CUDA kernels, cuDNN SDPA) against the
// CPU reference on fresh random bf16 inputs: whole documents, shards with a
// prefix (q_len < kv_len), gaps between sequences, GQA. Needs a GPU (label
// "gpu"); skips without one.
#include <memory>
#include <random>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cuda/attention_kernels.h"
#include "worker/cuda/cp_check.h"
#include "worker/cuda/cudnn_attention.h"
#include "worker/cuda/gpu_test_util.h"

namespace flashcp::worker::cuda {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;

struct Case {
  const char* name;
  std::vector<int32_t> q_len, kv_len;
  bool gaps;
};

std::vector<Case> Cases() {
  return {
      {"one token", {1}, {1}, false},
      {"single 300", {300}, {300}, false},
      {"single 1000", {1000}, {1000}, false},
      {"packed docs", {5, 77, 1, 256, 33}, {5, 77, 1, 256, 33}, false},
      {"shards with prefix", {64, 1, 100, 17}, {64, 40, 500, 17}, false},
      {"prefix and gaps", {30, 200, 9}, {90, 200, 700}, true},
      {"tail of a long doc", {128}, {2048}, false},
      // s_q = 1 graphs: on the H200, a rank whose pieces were all one token
      // once left a row of LSE unwritten (2026-11-29).
      {"one query, two keys", {1}, {2}, false},
      {"one-query shards", {1, 1}, {2, 5}, false},
  };
}

std::vector<AttentionShape> Shapes() {
  return {{.heads_q = 2, .heads_kv = 2, .head_dim = 128},
          {.heads_q = 4, .heads_kv = 2, .head_dim = 128},
          {.heads_q = 2, .heads_kv = 1, .head_dim = 64}};
}

uint64_t FreshSeed() { return std::random_device{}(); }

TEST(PlainAttentionTest, MatchesReference) {
  FLASHCP_SKIP_WITHOUT_GPU();
  for (const AttentionShape& shape : Shapes()) {
    auto plain = PlainAttention::Create(shape);
    ASSERT_THAT(plain, IsOk());
    for (const Case& c : Cases()) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE(testing::Message() << c.name << " hq=" << shape.heads_q << " hkv="
                                      << shape.heads_kv << " d=" << shape.head_dim << " seed=" << seed);
      auto check = CheckAttention(**plain, shape, c.q_len, c.kv_len, seed, c.gaps);
      ASSERT_THAT(check, IsOk());
      EXPECT_TRUE(check->ok()) << check->ToString();
    }
  }
}

TEST(CudnnAttentionTest, MatchesReferenceWithoutFallback) {
  FLASHCP_SKIP_WITHOUT_GPU();
  // As the workers run it, then with the plans autotuned, then with the
  // bottom-right mask on whole documents too (each picks other cuDNN graphs).
  const std::vector<CudnnOptions> configs = {{.allow_fallback = false},
                                             {.allow_fallback = false, .autotune = true},
                                             {.allow_fallback = false, .always_bottom_right = true}};
  for (const CudnnOptions& options : configs) {
    for (const AttentionShape& shape : Shapes()) {
      if (shape.head_dim != 128) continue;  // the fast path's shape
      auto cudnn = CudnnAttention::Create(shape, options);
      ASSERT_THAT(cudnn, IsOk());
      for (const Case& c : Cases()) {
        const uint64_t seed = FreshSeed();
        SCOPED_TRACE(testing::Message() << c.name << " hq=" << shape.heads_q << " hkv="
                                        << shape.heads_kv << " seed=" << seed << " autotune="
                                        << options.autotune << " always_bottom_right="
                                        << options.always_bottom_right << " cuDNN "
                                        << CudnnRuntimeVersion());
        auto check = CheckAttention(**cudnn, shape, c.q_len, c.kv_len, seed, c.gaps);
        ASSERT_THAT(check, IsOk());
        EXPECT_TRUE(check->ok()) << check->ToString();
      }
    }
  }
}

TEST(PlainAttentionTest, RejectsUnsupportedHeadDim) {
  EXPECT_THAT(PlainAttention::Create({.heads_q = 2, .heads_kv = 2, .head_dim = 96}),
              StatusIs(absl::StatusCode::kUnimplemented, testing::HasSubstr("96")));
}

TEST(VarlenBatchTest, RejectsOverlapsAndBadLengths) {
  FLASHCP_SKIP_WITHOUT_GPU();
  const AttentionShape shape{.heads_q = 2, .heads_kv = 2, .head_dim = 128};
  EXPECT_THAT(VarlenBatch::Create({5}, {4}, shape, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, testing::HasSubstr("q_len (5)")));
  EXPECT_THAT(VarlenBatch::Create({0, 3}, {4, 4}, {0, 10}, {4, 4}, shape, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, testing::HasSubstr("sequence 1")));
}

TEST(ErrorStatsTest, NanNeverPasses) {
  const std::vector<float> want = {1, 2, 3};
  const std::vector<float> got = {1, std::nanf(""), 3};
  const ErrorStats e = Compare(got, want);
  EXPECT_EQ(e.nonfinite, 1);
  EXPECT_FALSE(Within(e, kBf16Tolerance));
  EXPECT_TRUE(Within(Compare(want, want), kBf16Tolerance));
}

}  // namespace
}  // namespace flashcp::worker::cuda
