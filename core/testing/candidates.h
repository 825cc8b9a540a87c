// What the least-KV candidate stages' tests share (flashcp_kvfill_test,
// flashcp_kvgroups_test): options with a minimum shard, random batches, and
// the property every stage's kept plan must have.
#ifndef FLASHCP_CORE_TESTING_CANDIDATES_H_
#define FLASHCP_CORE_TESTING_CANDIDATES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/internal/flashcp_score.h"
#include "core/internal/strategies_internal.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/types.h"
#include "gtest/gtest.h"

namespace flashcp::core::testing {

// Default options but the minimum shard `m` tokens.
inline PlanOptions MinShard(int64_t m) {
  PlanOptions options;
  options.min_shard_tokens = m;
  return options;
}

// Document lengths summing to `context`, log-uniform in [1, context]: many
// short documents, a few long ones.
inline std::vector<int64_t> LogUniformDocs(SplitMix64Rng& rng, int64_t context) {
  std::vector<int64_t> docs;
  for (int64_t total = 0; total < context;) {
    const double x = std::exp(rng.Uniform() * std::log(static_cast<double>(context)));
    const int64_t len = std::clamp<int64_t>(static_cast<int64_t>(x), 1, context - total);
    docs.push_back(len);
    total += len;
  }
  return docs;
}

// A stage replaced `chosen` by `kept`: `kept` meets `target`, moves strictly
// less under its cheaper exchange, has no more cut shards under `m` (where
// m > 1) and, with `allgather_held`, moves no more under the all-gather.
inline void ExpectKeptOnlyWhenBetter(const Plan& chosen, const Plan& kept, double target,
                                     int64_t m, bool allgather_held, int trial) {
  const internal::PlanScore score = internal::ScorePlan(kept);
  const internal::PlanScore chosen_score = internal::ScorePlan(chosen);
  EXPECT_LE(score.imbalance, target) << "trial " << trial;
  const internal::Exchange a = internal::Measure(kept, score);
  const internal::Exchange b = internal::Measure(chosen, chosen_score);
  EXPECT_LT(a.cheaper(), b.cheaper()) << "trial " << trial;
  if (allgather_held) {
    EXPECT_LE(a.allgather, b.allgather) << "trial " << trial;
  }
  if (m > 1) {
    EXPECT_LE(internal::CountSlivers(kept, m), internal::CountSlivers(chosen, m))
        << "trial " << trial;
  }
}

}  // namespace flashcp::core::testing

#endif  // FLASHCP_CORE_TESTING_CANDIDATES_H_
