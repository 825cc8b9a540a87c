// core/internal/targeted_phase against a per-token reference: rank r receives
// token t of document d when r owns a later token of d and not t itself; t's
// owner sends it. Inter-node: sender and receiver on different nodes.
#include "core/internal/targeted_phase.h"

#include <array>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "core/types.h"
#include "gtest/gtest.h"

namespace flashcp::core::internal {
namespace {

struct Reference {
  std::vector<int64_t> sent, recv, pairs;
  std::array<std::vector<int64_t>, 2> rank_inter;
  int64_t inter = 0;
};

Reference PerToken(const Plan& plan, int32_t per_node) {
  const int32_t n = plan.cp_size;
  Reference ref;
  ref.sent.assign(n, 0);
  ref.recv.assign(n, 0);
  ref.pairs.assign(static_cast<size_t>(n) * n, 0);
  ref.rank_inter = {std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0)};
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    std::vector<int32_t> owner(plan.doc_lens[d], -1);
    for (const Shard& s : plan.shards) {
      if (s.doc != static_cast<int32_t>(d)) continue;
      for (int64_t t = s.start; t < s.start + s.len; ++t) owner[t] = s.rank;
    }
    std::set<int32_t> later;  // owners of tokens after t
    for (int64_t t = plan.doc_lens[d] - 1; t >= 0; --t) {
      const int32_t src = owner[t];
      for (int32_t dest : later) {
        if (dest == src) continue;
        ++ref.sent[src];
        ++ref.recv[dest];
        ++ref.pairs[static_cast<size_t>(src) * n + dest];
        if (src / per_node != dest / per_node) {
          ++ref.inter;
          ++ref.rank_inter[0][src];
          ++ref.rank_inter[1][dest];
        }
      }
      later.insert(src);
    }
  }
  return ref;
}

TEST(TargetedPhaseTest, MatchesThePerTokenReferenceOnRandomPlans) {
  std::mt19937_64 rng(20261207);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t n = std::uniform_int_distribution<int32_t>(1, 8)(rng);
    const int32_t docs = std::uniform_int_distribution<int32_t>(1, 12)(rng);
    std::vector<int64_t> lens;
    for (int32_t i = 0; i < docs; ++i) {
      lens.push_back(std::uniform_int_distribution<int64_t>(1, 200)(rng));
    }
    const Strategy strategy =
        std::array{Strategy::kFlashCp, Strategy::kZigzag, Strategy::kPerDoc,
                   Strategy::kLlama3}[trial % 4];
    absl::StatusOr<Plan> plan = MakePlan(strategy, Batch{lens, n});
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int32_t per_node = std::uniform_int_distribution<int32_t>(1, n)(rng);
    const Reference ref = PerToken(*plan, per_node);
    std::vector<int64_t> sent, recv, pairs(static_cast<size_t>(n) * n, 0);
    std::array<std::vector<int64_t>, 2> rank_inter;
    int64_t inter = -1;
    TargetedPhase(*plan, IndexByDoc(*plan), sent, recv, per_node, &inter, &pairs, &rank_inter);
    EXPECT_EQ(sent, ref.sent) << "trial " << trial;
    EXPECT_EQ(recv, ref.recv) << "trial " << trial;
    EXPECT_EQ(pairs, ref.pairs) << "trial " << trial;
    EXPECT_EQ(inter, ref.inter) << "trial " << trial;
    EXPECT_EQ(rank_inter, ref.rank_inter) << "trial " << trial;
    checked += ref.inter > 0 ? 1 : 0;
  }
  EXPECT_GT(checked, 30);  // the inter-node counts were exercised, not all zero
}

TEST(TargetedPhaseTest, IndexByDocSortsEachDocumentsShardsByStart) {
  Plan plan;
  plan.cp_size = 2;
  plan.doc_lens = {10, 4};
  plan.shards = {Shard{0, 5, 5, 0}, Shard{1, 0, 4, 1}, Shard{0, 0, 5, 1}};
  const DocIndex index = IndexByDoc(plan);
  EXPECT_EQ(index.begin, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(index.shards, (std::vector<int32_t>{2, 0, 1}));
}

}  // namespace
}  // namespace flashcp::core::internal
