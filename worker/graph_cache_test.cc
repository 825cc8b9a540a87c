// The shape-class key (exact keys for given lengths) and the LRU policy of
// the graph cache with a fake graph builder (hits, misses, builds, rejected
// builds, eviction order, counters). No GPU.
#include "worker/graph_cache.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::worker {
namespace {

using core::testing::StatusIs;
using ::testing::ElementsAre;

GraphKey K(bool backward, bool top_left, int64_t b, int64_t s_q, int64_t s_kv) {
  GraphKey k;
  k.backward = backward;
  k.top_left = top_left;
  k.sequences = b;
  k.max_q = s_q;
  k.max_kv = s_kv;
  return k;
}

TEST(GraphLenTest, NextPowerOfTwoAtLeast64) {
  EXPECT_EQ(GraphLen(0), 64);
  EXPECT_EQ(GraphLen(1), 64);
  EXPECT_EQ(GraphLen(64), 64);
  EXPECT_EQ(GraphLen(65), 128);
  EXPECT_EQ(GraphLen(128), 128);
  EXPECT_EQ(GraphLen(129), 256);
  EXPECT_EQ(GraphLen(4096), 4096);
  EXPECT_EQ(GraphLen(4097), 8192);
  EXPECT_EQ(GraphLen(int64_t{1} << 31), int64_t{1} << 31);
}

struct KeyCase {
  const char* name;
  bool backward, always_bottom_right;
  std::vector<int32_t> q_len, kv_len;
  GraphKey want;
};

TEST(MakeGraphKeyTest, ExactKeys) {
  const std::vector<KeyCase> cases = {
      {"whole documents", false, false, {5, 77, 1}, {5, 77, 1}, K(false, true, 3, 128, 128)},
      {"whole, backward", true, false, {5, 77, 1}, {5, 77, 1}, K(true, true, 3, 128, 128)},
      {"whole, bottom-right asked", false, true, {5, 64}, {5, 64}, K(false, false, 2, 64, 64)},
      {"prefixed shard", false, false, {64, 100}, {64, 500}, K(false, false, 2, 128, 512)},
      {"one prefixed of many", true, false, {10, 20, 30}, {10, 20, 31},
       K(true, false, 3, 64, 64)},
      {"long document", false, false, {8192}, {8192}, K(false, true, 1, 8192, 8192)},
      {"just past a power", false, false, {8193}, {8193}, K(false, true, 1, 16384, 16384)},
      {"tail of a long doc", false, false, {128}, {2048}, K(false, false, 1, 128, 2048)},
      {"empty group", false, false, {}, {}, K(false, true, 0, 64, 64)},
  };
  for (const KeyCase& c : cases) {
    const GraphKey got = MakeGraphKey(c.backward, c.always_bottom_right, c.q_len, c.kv_len);
    EXPECT_EQ(got, c.want) << c.name << ": got " << GraphKeyString(got) << ", want "
                           << GraphKeyString(c.want);
  }
}

TEST(MakeGraphKeyTest, TwoBatchesOfOneClassShareAKey) {
  // Two steps' whole shards: different lengths, same count, same rounded
  // maxima (the GPU test's two steps are built the same way).
  EXPECT_EQ(MakeGraphKey(false, false, {300, 40, 7}, {300, 40, 7}),
            MakeGraphKey(false, false, {500, 2, 129}, {500, 2, 129}));
  EXPECT_FALSE(MakeGraphKey(false, false, {300, 40, 7}, {300, 40, 7}) ==
               MakeGraphKey(false, false, {513, 2, 129}, {513, 2, 129}));
}

TEST(GraphKeyStringTest, NamesEveryField) {
  EXPECT_EQ(GraphKeyString(K(true, true, 3, 128, 256)), "bwd top_left b=3 s_q=128 s_kv=256");
  EXPECT_EQ(GraphKeyString(K(false, false, 1, 64, 64)), "fwd bottom_right b=1 s_q=64 s_kv=64");
}

// A fake graph: the key it was built for, plus a serial number.
struct FakeGraph {
  std::string built_for;
  int serial = 0;
};

class FakeBuilder {
 public:
  absl::StatusOr<FakeGraph> operator()(const GraphKey& key) {
    ++calls;
    if (key.sequences == reject_sequences)
      return absl::FailedPreconditionError("cuDNN rejects b=" + std::to_string(key.sequences));
    return FakeGraph{GraphKeyString(key), calls};
  }
  int calls = 0;
  int64_t reject_sequences = -1;
};

TEST(GraphCacheTest, HitsMissesBuildsAndRecency) {
  GraphCache<FakeGraph> cache(3);
  FakeBuilder builder;
  std::vector<absl::StatusOr<FakeGraph>> evicted;
  const GraphKey a = K(false, true, 1, 64, 64), b = K(true, true, 1, 64, 64),
                 c = K(false, false, 2, 128, 512);
  auto get = [&](const GraphKey& k) -> absl::StatusOr<FakeGraph>& {
    return cache.Get(k, [&] { return builder(k); }, &evicted);
  };
  EXPECT_EQ(get(a)->serial, 1);
  EXPECT_EQ(get(b)->serial, 2);
  EXPECT_EQ(get(a)->serial, 1);  // a hit: not rebuilt
  EXPECT_EQ(get(c)->serial, 3);
  EXPECT_EQ(get(b)->serial, 2);
  EXPECT_EQ(builder.calls, 3);
  EXPECT_THAT(cache.Keys(), ElementsAre(b, c, a));
  const GraphCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 3);
  EXPECT_EQ(s.builds, 3);
  EXPECT_EQ(s.rejected, 0);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.size, 3);
  EXPECT_EQ(s.capacity, 3);
  EXPECT_TRUE(evicted.empty());
}

TEST(GraphCacheTest, EvictsLeastRecentlyUsedFirst) {
  GraphCache<FakeGraph> cache(2);
  FakeBuilder builder;
  std::vector<absl::StatusOr<FakeGraph>> evicted;
  auto get = [&](const GraphKey& k) -> absl::StatusOr<FakeGraph>& {
    return cache.Get(k, [&] { return builder(k); }, &evicted);
  };
  const GraphKey a = K(false, true, 1, 64, 64), b = K(false, true, 2, 64, 64),
                 c = K(false, true, 3, 64, 64);
  get(a);
  get(b);
  get(a);  // b is now the least recently used
  get(c);  // evicts b
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0]->built_for, GraphKeyString(b));
  EXPECT_THAT(cache.Keys(), ElementsAre(c, a));
  get(b);  // rebuilt (a miss), evicts a
  ASSERT_EQ(evicted.size(), 2u);
  EXPECT_EQ(evicted[1]->built_for, GraphKeyString(a));
  EXPECT_THAT(cache.Keys(), ElementsAre(b, c));
  EXPECT_EQ(builder.calls, 4);
  const GraphCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 4);
  EXPECT_EQ(s.builds, 4);
  EXPECT_EQ(s.evictions, 2);
  EXPECT_EQ(s.size, 2);
}

TEST(GraphCacheTest, RejectedBuildIsCachedAndNotRetried) {
  GraphCache<FakeGraph> cache(4);
  FakeBuilder builder;
  builder.reject_sequences = 7;
  const GraphKey bad = K(true, false, 7, 64, 64);
  auto get = [&](const GraphKey& k) -> absl::StatusOr<FakeGraph>& {
    return cache.Get(k, [&] { return builder(k); }, nullptr);
  };
  EXPECT_THAT(get(bad).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cuDNN rejects b=7"));
  EXPECT_THAT(get(bad).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cuDNN rejects b=7"));
  EXPECT_EQ(builder.calls, 1);
  const GraphCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.builds, 0);
  EXPECT_EQ(s.rejected, 1);
}

TEST(GraphCacheTest, CapacityAtLeastOneAndClearKeepsCounters) {
  GraphCache<FakeGraph> cache(0);
  FakeBuilder builder;
  std::vector<absl::StatusOr<FakeGraph>> evicted;
  const GraphKey a = K(false, true, 1, 64, 64), b = K(false, true, 2, 64, 64);
  cache.Get(a, [&] { return builder(a); }, &evicted);
  cache.Get(b, [&] { return builder(b); }, &evicted);
  EXPECT_EQ(cache.stats().capacity, 1);
  EXPECT_THAT(cache.Keys(), ElementsAre(b));
  EXPECT_EQ(evicted.size(), 1u);
  cache.Clear();
  EXPECT_TRUE(cache.Keys().empty());
  EXPECT_EQ(cache.stats().size, 0);
  EXPECT_EQ(cache.stats().misses, 2);
  EXPECT_EQ(cache.stats().evictions, 1);
}

// A move-only value (a frontend graph handle is a shared_ptr; a unique_ptr
// is the stricter case): the cache never copies.
TEST(GraphCacheTest, HoldsMoveOnlyValues) {
  GraphCache<std::unique_ptr<int>> cache(1);
  const GraphKey a = K(false, true, 1, 64, 64), b = K(false, true, 2, 64, 64);
  std::vector<absl::StatusOr<std::unique_ptr<int>>> evicted;
  EXPECT_EQ(**cache.Get(a, [] { return std::make_unique<int>(5); }, &evicted), 5);
  EXPECT_EQ(**cache.Get(b, [] { return std::make_unique<int>(6); }, &evicted), 6);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(**evicted[0], 5);
}

}  // namespace
}  // namespace flashcp::worker
