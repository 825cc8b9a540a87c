// flashcp's stages in turn on the batch that needs the re-cut stage
// (flashcp_recut.h): search, repair, fallback repair, re-cut.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_recut.h"
#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/flashcp_search.h"
#include "core/internal/strategies_internal.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::testing::ElementsAre;

// Docs [42, 1063] on 3 ranks (FlashCpTest.RecutKeepsAShortDocumentWhole):
// the search's winner keeps a sliver of doc 0 through its repair, no
// fallback candidate repairs free of slivers within R, and the re-cut keeps
// doc 0 whole on rank 0, moving doc 1's cut points instead.
TEST(RecutCandidatesTest, ReCutReplacesTheRepairedWinner) {
  const Batch batch{{42, 1063}, 3};
  const PlanOptions plan_options;  // min_shard 128, R 1.02
  const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, plan_options);
  internal::CompactedSearch search(batch, o);
  ASSERT_THAT(search.FindBoundary(), IsOk());
  internal::SearchCandidate best = search.TakeBest();
  const internal::WinnerKey winner{best.k, best.reduced, best.pieces.size(), best.score};
  Plan plan = internal::RepairCandidate(
      batch, o, search.Assemble(std::move(best.pieces), best.placement, best.k, best.reduced),
      best.score);
  EXPECT_GT(internal::CountSlivers(plan, 128), 0);
  absl::StatusOr<std::vector<internal::SearchCandidate>> candidates =
      search.FallbackCandidates(winner.k);
  ASSERT_THAT(candidates, IsOk());
  std::stable_sort(candidates->begin(), candidates->end(),
                   [&](const internal::SearchCandidate& x, const internal::SearchCandidate& y) {
                     return internal::Better(x.score, y.score, o.target, o.sliver_cost);
                   });
  EXPECT_EQ(internal::RepairFallback(batch, o, search, *candidates, winner), std::nullopt);
  const Plan recut =
      internal::RecutCandidates(batch, o, search, *candidates, std::move(plan));
  EXPECT_THAT(recut.shards, ElementsAre(Shard{0, 0, 42, 0}, Shard{1, 0, 145, 0},
                                        Shard{1, 881, 182, 0}, Shard{1, 145, 184, 1},
                                        Shard{1, 697, 184, 1}, Shard{1, 329, 368, 2}));
}

// With no candidate and a plan that the re-cut of every document Per-Doc
// cannot beat (one whole document per rank, nothing cut), the plan stays.
TEST(RecutCandidatesTest, KeepsAPlanNothingBeats) {
  const Batch batch{{4, 4}, 2};
  const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, PlanOptions{});
  internal::CompactedSearch search(batch, o);
  const Plan plan = internal::FinishPlan(batch, {Shard{0, 0, 4, 0}, Shard{1, 0, 4, 1}});
  EXPECT_EQ(internal::RecutCandidates(batch, o, search, {}, plan).shards, plan.shards);
}

}  // namespace
}  // namespace flashcp::core
