// flashcp's search stage (flashcp_search.h): the walk over k and the
// candidates it keeps, hand-worked.
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/datasets.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_search.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/per_doc.h"
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

PlanOptions NoMinShard() {
  PlanOptions o;
  o.min_shard_tokens = 0;
  return o;
}

TEST(FlashCpOptionsTest, DerivedFromTheBatch) {
  // [8, 2, 2] on 2 ranks: W 36 + 3 + 3 = 42, mean 21, R * mean 21.42; the
  // median document (2 tokens) has (2 + 1) / 2 pairs per token.
  const Batch batch{{8, 2, 2}, 2};
  const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, NoMinShard());
  EXPECT_THAT(o.order, ElementsAre(0, 1, 2));
  EXPECT_THAT(o.targets, ElementsAre(6, 6));
  EXPECT_DOUBLE_EQ(o.total_work, 42.0);
  EXPECT_DOUBLE_EQ(o.mean_work, 21.0);
  EXPECT_DOUBLE_EQ(o.max_work, 1.02 * 21.0);
  EXPECT_DOUBLE_EQ(o.median_density, 1.5);
  EXPECT_EQ(o.sliver_cost, 0);
  EXPECT_THAT(o.CheckStop(), IsOk());
}

TEST(CompactedSearchTest, WalksToTheFewestPerDocDocuments) {
  // [8, 2, 2] on 2 ranks (FlashCpTest.FallsBackToPerDocForTheLongDocument):
  // k = 0 misses R at every rho, k = 1 (doc 0 zigzagged) meets it with
  // docs 1 and 2 whole, one per rank: 21 and 21.
  const Batch batch{{8, 2, 2}, 2};
  const PlanOptions plan_options = NoMinShard();
  const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, plan_options);
  internal::CompactedSearch search(batch, o);
  ASSERT_THAT(search.FindBoundary(), IsOk());
  EXPECT_EQ(search.best().k, 1u);
  EXPECT_FALSE(search.best().reduced);  // min_shard 0: the full 2N-chunk zigzag
  EXPECT_DOUBLE_EQ(search.best().score.imbalance, 1.0);
  EXPECT_EQ(search.best().score.max_nonlast, 4);
  EXPECT_EQ(search.best().score.cut_docs, 1);
  internal::SearchCandidate best = search.TakeBest();
  EXPECT_EQ(best.k, 1u);
  const Plan plan = internal::FinishPlan(
      batch, search.Assemble(std::move(best.pieces), best.placement, best.k, best.reduced));
  EXPECT_THAT(plan.shards, ElementsAre(Shard{0, 0, 2, 0}, Shard{0, 6, 2, 0}, Shard{1, 0, 2, 0},
                                       Shard{0, 2, 4, 1}, Shard{2, 0, 2, 1}));
}

// Docs [40, 20] on 2 ranks, each where LPT put it, needing 38 and 22
// tokens, m = 4: rank 0 must hand 2 tokens to rank 1, a sliver head, so it
// sends the head [0, 22) instead and takes doc 1 (20 tokens) back whole.
internal::WholeDocPlacement TwoRankPlacement() {
  return internal::WholeDocPlacement{{40, 20}, {{0}, {1}}, 2};
}

TEST(EqualizeWholeDocsTest, SaysWhetherTheSwapCapDecided) {
  const Batch batch{{40, 20}, 2};
  const std::vector<int64_t> need = {38, 22};
  internal::WholeDocScratch scratch;
  const auto equalize = [&](int64_t cap, std::vector<Shard>& out) {
    internal::WholeDocPlacement placement = TwoRankPlacement();
    std::vector<double> work = {820, 210};  // W(0, 40), W(0, 20)
    return internal::EqualizeWholeDocs(batch, need, placement, work, out,
                                       internal::WholeDocOptions{0, true, 4, cap}, scratch);
  };
  // Uncapped, and capped at 32 >= 22: the swap.
  std::vector<Shard> uncapped, at32, at16;
  EXPECT_FALSE(equalize(0, uncapped));
  EXPECT_THAT(uncapped, ElementsAre(Shard{1, 0, 20, 0}, Shard{0, 0, 22, 1}, Shard{0, 22, 18, 0}));
  EXPECT_FALSE(equalize(32, at32));  // the cap decided nothing: the same as uncapped
  EXPECT_EQ(at32, uncapped);
  // Capped at 16 < 22: the 2-token sliver head.
  EXPECT_TRUE(equalize(16, at16));
  EXPECT_THAT(at16, ElementsAre(Shard{0, 0, 2, 1}, Shard{0, 2, 38, 0}));
}

// Rank 0 holds docs [6, 3, 2, 1] (12 tokens, W 31), rank 1 doc 4 (4
// tokens, W 10), rank 2 nothing; they need 6, 5, 5. Whole moves, shortest
// first, to the least-loaded receiver that fits: doc 3, then doc 2, to rank
// 2 (W 1, then 4; deficit 2 left). Doc 1 (3 tokens) fits no deficit, so
// heads follow: [0, 2) of doc 0 to rank 2 (full), [2, 3) to rank 1; rank 0
// keeps the tail [3, 6) and doc 1 whole, in order.
TEST(EqualizeWholeDocsTest, MovesShortDocumentsWholeThenCutsHeads) {
  const Batch batch{{6, 3, 2, 1, 4}, 3};
  internal::WholeDocPlacement placement{{12, 4, 0}, {{0, 1, 2, 3}, {4}, {}}, 5};
  std::vector<double> work = {31, 10, 0};
  std::vector<Shard> out;
  internal::WholeDocScratch scratch;
  EXPECT_FALSE(internal::EqualizeWholeDocs(batch, {6, 5, 5}, placement, work, out,
                                           internal::WholeDocOptions{0, true}, scratch));
  EXPECT_THAT(out, ElementsAre(Shard{3, 0, 1, 2}, Shard{2, 0, 2, 2}, Shard{0, 0, 2, 2},
                               Shard{0, 2, 1, 1}, Shard{0, 3, 3, 0}));
  EXPECT_THAT(placement.held, ElementsAre(ElementsAre(1), ElementsAre(4), ElementsAre()));
  EXPECT_THAT(work, ElementsAre(21.0, 13.0, 7.0));
}

// Receivers of equal workload are served lowest rank first, and one served
// goes behind those it now ties with at a lower rank. Rank 0 holds docs
// [3, 1, 1, 1] (6 tokens, W 9) and must keep 1; rank 1 holds a 1-token doc
// (W 1) and needs 1 more, ranks 2 and 3 need 2 each. Doc 3 goes to rank 2
// (W 0 -> 1: now after rank 3 at W 0 and rank 1 at W 1), doc 2 to rank 3
// (then after ranks 1 and 2, all at W 1), doc 1 to rank 1 (full); doc 0's
// head [0, 1) to rank 2, [1, 2) to rank 3, its tail stays.
TEST(EqualizeWholeDocsTest, EqualReceiversTakeTurnsByRank) {
  const Batch batch{{1, 1, 1, 1, 3}, 4};
  internal::WholeDocPlacement placement{{6, 1, 0, 0}, {{4, 1, 2, 3}, {0}, {}, {}}, 5};
  std::vector<double> work = {9, 1, 0, 0};
  std::vector<Shard> out;
  internal::WholeDocScratch scratch;
  internal::EqualizeWholeDocs(batch, {1, 2, 2, 2}, placement, work, out,
                              internal::WholeDocOptions{0, true}, scratch);
  EXPECT_THAT(out, ElementsAre(Shard{3, 0, 1, 2}, Shard{2, 0, 1, 3}, Shard{1, 0, 1, 1},
                               Shard{4, 0, 1, 2}, Shard{4, 1, 1, 3}, Shard{4, 2, 1, 0}));
  EXPECT_THAT(placement.held,
              ElementsAre(ElementsAre(), ElementsAre(0), ElementsAre(), ElementsAre()));
  EXPECT_THAT(work, ElementsAre(3.0, 2.0, 2.0, 3.0));
}

// The fallback's first pass takes the candidates FindBoundary made; a
// search that never ran FindBoundary makes them all anew. Both pools must
// be the same, in the same order.
TEST(CompactedSearchTest, FallbackPoolIsTheSameWithoutTheSearch) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> docs =
      SampleBatches(Dataset::kPile, 131072, 4, 1);
  ASSERT_THAT(docs, IsOk());
  size_t compared = 0;
  for (const std::vector<int64_t>& d : *docs) {
    const Batch batch{d, 8};
    const PlanOptions plan_options;
    const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, plan_options);
    internal::CompactedSearch searched(batch, o), fresh(batch, o);
    ASSERT_THAT(searched.FindBoundary(), IsOk());
    const size_t k0 = searched.TakeBest().k;
    absl::StatusOr<std::vector<internal::SearchCandidate>> a = searched.FallbackCandidates(k0);
    absl::StatusOr<std::vector<internal::SearchCandidate>> b = fresh.FallbackCandidates(k0);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    ASSERT_EQ(a->size(), b->size());
    for (size_t i = 0; i < a->size(); ++i) {
      const internal::SearchCandidate& x = (*a)[i];
      const internal::SearchCandidate& y = (*b)[i];
      EXPECT_EQ(x.k, y.k);
      EXPECT_EQ(x.reduced, y.reduced);
      EXPECT_TRUE(internal::SameScore(x.score, y.score));
      EXPECT_EQ(x.pieces, y.pieces);
      EXPECT_EQ(x.placement.held, y.placement.held);
    }
    compared += a->size();
  }
  EXPECT_GT(compared, 0u);
}

// A reduced zigzag over a list made in two steps (a prefix, then the rest
// from the prefix's cursor and rooms) is the one made in one step.
TEST(AppendPerDocPiecesTest, APrefixContinues) {
  const Batch batch{{3000, 1500, 900, 700, 520, 300, 130}, 4};
  const std::vector<int32_t> docs = {0, 1, 2, 3, 4, 5, 6};
  std::vector<int64_t> room_once = {1800, 1800, 1800, 1800}, room_split = room_once;
  internal::PerDocCursor once, split;
  std::vector<Shard> all, parts;
  std::vector<size_t> begins;
  internal::AppendPerDocPieces(batch, docs, 128, &room_once, once, all, &begins);
  const std::span<const int32_t> list(docs);
  internal::AppendPerDocPieces(batch, list.first(3), 128, &room_split, split, parts);
  EXPECT_EQ(parts.size(), begins[3]);  // the prefix's pieces end where doc 3 begins
  internal::AppendPerDocPieces(batch, list.subspan(3), 128, &room_split, split, parts);
  EXPECT_EQ(parts, all);
  EXPECT_EQ(room_split, room_once);
  ASSERT_EQ(begins.size(), docs.size());
  EXPECT_EQ(begins[0], 0u);
  // Doc 0 (3000 tokens, c = 4 ranks) is 8 chunks; doc 6 (130 tokens) stays whole.
  EXPECT_EQ(begins[1], 8u);
  EXPECT_EQ(all.back(), (Shard{6, 0, 130, all.back().rank}));
  EXPECT_EQ(all.size(), begins[6] + 1);
}

// Workloads added a prefix at a time are PieceWorkloads' sums, exactly:
// ranks 0 and 1 take [0, 3) and [3, 5) of doc 0 (W 6 and 9), then [5, 6)
// (W 6) and doc 1 whole (W 3).
TEST(AddPieceWorkloadsTest, PrefixThenRestIsTheWhole) {
  const std::vector<Shard> pieces = {Shard{0, 0, 3, 0}, Shard{0, 3, 2, 1}, Shard{0, 5, 1, 0},
                                     Shard{1, 0, 2, 1}};
  std::vector<double> w(2, 0.0);
  const std::span<const Shard> list(pieces);
  internal::AddPieceWorkloads(list.first(2), w);
  EXPECT_THAT(w, ElementsAre(6.0, 9.0));
  internal::AddPieceWorkloads(list.subspan(2), w);
  EXPECT_THAT(w, ElementsAre(12.0, 12.0));
  EXPECT_EQ(w, internal::PieceWorkloads(2, pieces));
}

TEST(CompactedSearchTest, StopsWithTheTokensStatus) {
  PlanOptions plan_options = NoMinShard();
  plan_options.stop = StopToken([] { return absl::CancelledError("enough"); });
  const Batch batch{{8, 2, 2}, 2};
  const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, plan_options);
  internal::CompactedSearch search(batch, o);
  EXPECT_EQ(search.FindBoundary(), absl::CancelledError("enough"));
  EXPECT_EQ(search.FallbackCandidates(0).status(), absl::CancelledError("enough"));
}

// Assemble's full 2N-chunk zigzag of the k longest documents is
// PerDocPieces of them, whichever k are asked for and in whatever order
// (the search keeps one run over the order and takes its prefixes).
TEST(CompactedSearchTest, AssemblesTheFullZigzagOfAnyK) {
  absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(Dataset::kPile, 1 << 17, 1, 17);
  ASSERT_THAT(docs.status(), IsOk());
  const Batch batch{*std::move(docs), 32};
  const internal::FlashCpOptions o = internal::FlashCpOptions::For(batch, PlanOptions{});
  internal::CompactedSearch search(batch, o);
  const size_t n = o.order.size();
  for (const size_t k : {n, n / 2, n - 1, size_t{0}, size_t{1}, n / 3, n}) {
    const std::vector<int32_t> first(o.order.begin(),
                                     o.order.begin() + static_cast<std::ptrdiff_t>(k));
    EXPECT_EQ(search.Assemble({}, internal::WholeDocPlacement{}, k, false),
              internal::PerDocPieces(batch, first))
        << "k " << k;
  }
}

}  // namespace
}  // namespace flashcp::core
