// What the planner stages' property tests share (flashcp_kvfill_test,
// flashcp_kvgroups_test, flashcp_grouped_test, flashcp_repair_test,
// baselines_test): options with a minimum shard, random batches, a plan's
// shards as raw pieces, the property every stage's kept plan must have, and
// a stage's pinned result on a sampled batch.
#ifndef FLASHCP_CORE_TESTING_CANDIDATES_H_
#define FLASHCP_CORE_TESTING_CANDIDATES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/internal/flashcp_options.h"
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

// A plan's shards as raw pieces (as FinishPlan takes them) that finish to
// the same plan: about a third of the shards split into two touching pieces
// on their rank, an empty piece after about an eighth, then, with
// `shuffle`, in random order.
inline std::vector<Shard> RawPiecesOf(const std::vector<Shard>& shards, SplitMix64Rng& rng,
                                      bool shuffle) {
  const auto below = [&](int64_t k) { return static_cast<int64_t>(rng.Next() % k); };
  std::vector<Shard> raw;
  for (const Shard& s : shards) {
    if (s.len > 1 && below(3) == 0) {
      const int64_t cut = 1 + below(s.len - 1);
      raw.push_back(Shard{s.doc, s.start, cut, s.rank});
      raw.push_back(Shard{s.doc, s.start + cut, s.len - cut, s.rank});
    } else {
      raw.push_back(s);
    }
    if (below(8) == 0) raw.push_back(Shard{s.doc, s.start, 0, s.rank});
  }
  if (shuffle) {
    for (size_t i = raw.size(); i > 1; --i) {
      std::swap(raw[i - 1], raw[static_cast<size_t>(below(static_cast<int64_t>(i)))]);
    }
  }
  return raw;
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

// A stage (PreferKvFill, PreferKvGroups) run on the compacted search's plan
// of `batch` at default options: its plan is valid, meets R, has no cut
// shard under 128 tokens, and the compacted plan and it move `before` and
// `after` tokens a phase under their cheaper exchanges.
template <typename Stage>
void ExpectStageReplacesCompacted(const Batch& batch, Stage stage, int64_t before,
                                  int64_t after) {
  const PlanOptions plan_options;
  const internal::FlashCpOptions options = internal::FlashCpOptions::For(batch, plan_options);
  absl::StatusOr<Plan> compacted = internal::PlanFlashCpCompacted(batch, plan_options);
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  EXPECT_EQ(internal::Measure(*compacted, internal::ScorePlan(*compacted)).cheaper(), before);
  absl::StatusOr<Plan> plan = stage(batch, options, *compacted);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ValidatePlan(*plan).ok());
  const internal::PlanScore score = internal::ScorePlan(*plan);
  EXPECT_LE(score.imbalance, plan_options.target_imbalance);
  EXPECT_GE(score.min_cut_len, 128);
  EXPECT_EQ(internal::Measure(*plan, score).cheaper(), after);
}

}  // namespace flashcp::core::testing

#endif  // FLASHCP_CORE_TESTING_CANDIDATES_H_
