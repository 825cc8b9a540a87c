// The cuDNN graph cache across steps on a real device: one long-lived
// CudnnAttention runs two steps whose batches differ but share a shape class
// (worker/graph_cache.h), each forward and backward against the fp64 CPU
// reference (cp_check.h's CheckAttention and tolerances), with cuDNN's
// workspace from the caller (a stand-in for torch's caching allocator: one
// buffer, grown only when a call asks for more). The graphs are built on the
// first step only. Needs a GPU (label "gpu"); skips without one.
#include <memory>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cuda/cp_check.h"
#include "worker/cuda/cudnn_attention.h"
#include "worker/cuda/gpu_test_util.h"
#include "worker/graph_cache.h"

namespace flashcp::worker::cuda {
namespace {

using core::testing::IsOk;

// Attention over a long-lived CudnnAttention with the caller's workspace:
// what the flashcp binding does with torch's allocator, in C++.
class CallerWorkspace final : public Attention {
 public:
  explicit CallerWorkspace(CudnnAttention& a) : a_(a) {}
  absl::string_view name() const override { return "cudnn+caller workspace"; }
  absl::Status Forward(const VarlenBatch& batch, const AttentionForwardArgs& args,
                       cudaStream_t stream) override {
    return a_.Forward(batch, args, stream, [this](size_t bytes) { return Get(bytes); });
  }
  absl::Status Backward(const VarlenBatch& batch, const AttentionBackwardArgs& args,
                        cudaStream_t stream) override {
    return a_.Backward(batch, args, stream, [this](size_t bytes) { return Get(bytes); });
  }
  int requests = 0;     // workspace requests (one per graph execution that needs one)
  int allocations = 0;  // cudaMallocs the stand-in made

 private:
  absl::StatusOr<void*> Get(size_t bytes) {
    ++requests;
    if (bytes > buffer_.size()) ++allocations;
    if (absl::Status s = buffer_.Reserve(bytes); !s.ok()) return s;
    return static_cast<void*>(buffer_.data());
  }
  CudnnAttention& a_;
  DeviceBuffer<uint8_t> buffer_;
};

TEST(GraphCacheGpuTest, SecondStepOfAShapeClassBuildsNoGraph) {
  FLASHCP_SKIP_WITHOUT_GPU();
  const AttentionShape shape{8, 2, 128, 0.0f};
  // Two steps' prefixed shards: three sequences each, queries at most 128,
  // keys at most 1024 after rounding: one class, different lengths.
  const std::vector<int32_t> q1 = {100, 7, 64}, kv1 = {900, 7, 300};
  const std::vector<int32_t> q2 = {20, 128, 65}, kv2 = {513, 129, 1000};
  ASSERT_EQ(MakeGraphKey(false, false, q1, kv1), MakeGraphKey(false, false, q2, kv2));
  auto created = CudnnAttention::Create(shape, {.allow_fallback = false});
  ASSERT_THAT(created.status(), IsOk());
  CudnnAttention& cudnn = **created;
  CallerWorkspace attention(cudnn);

  auto step1 = CheckAttention(attention, shape, q1, kv1, /*seed=*/11, /*gaps=*/true);
  ASSERT_THAT(step1.status(), IsOk());
  EXPECT_TRUE(step1->ok()) << step1->ToString();
  const GraphCacheStats after1 = cudnn.graph_stats();
  EXPECT_EQ(after1.builds, 2);  // forward and backward
  EXPECT_EQ(after1.misses, 2);
  EXPECT_EQ(after1.rejected, 0);
  EXPECT_EQ(after1.size, 2);
  EXPECT_EQ(cudnn.fallback_reason(), "");

  const int allocations1 = attention.allocations;
  auto step2 = CheckAttention(attention, shape, q2, kv2, /*seed=*/12, /*gaps=*/true);
  ASSERT_THAT(step2.status(), IsOk());
  EXPECT_TRUE(step2->ok()) << step2->ToString();
  const GraphCacheStats after2 = cudnn.graph_stats();
  EXPECT_EQ(after2.builds, 2) << "the second step of the class built a graph";
  EXPECT_EQ(after2.misses, 2);
  EXPECT_EQ(after2.hits, after1.hits + 2);
  EXPECT_EQ(after2.size, 2);
  // Same graphs, same workspace sizes: the stand-in allocator grew no more.
  EXPECT_EQ(attention.allocations, allocations1);
  EXPECT_GT(attention.requests, 0);
}

TEST(GraphCacheGpuTest, EvictsBeyondMaxGraphsAndStillMatches) {
  FLASHCP_SKIP_WITHOUT_GPU();
  const AttentionShape shape{4, 4, 64, 0.0f};
  auto created = CudnnAttention::Create(shape, {.allow_fallback = false, .max_graphs = 2});
  ASSERT_THAT(created.status(), IsOk());
  CudnnAttention& cudnn = **created;
  CallerWorkspace attention(cudnn);
  // Two classes (one and two sequences): four graphs through a cache of two.
  for (const auto& [q, kv] : {std::pair<std::vector<int32_t>, std::vector<int32_t>>{{50}, {50}},
                              {{30, 40}, {30, 40}}, {{60}, {60}}}) {
    auto check = CheckAttention(attention, shape, q, kv, /*seed=*/3);
    ASSERT_THAT(check.status(), IsOk());
    EXPECT_TRUE(check->ok()) << check->ToString();
  }
  const GraphCacheStats s = cudnn.graph_stats();
  EXPECT_EQ(s.capacity, 2);
  EXPECT_EQ(s.size, 2);
  EXPECT_EQ(s.builds, 6);  // the third step's class was evicted by the second's
  EXPECT_EQ(s.evictions, 4);
}

}  // namespace
}  // namespace flashcp::worker::cuda
