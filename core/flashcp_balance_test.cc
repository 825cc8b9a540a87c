// core/internal/flashcp_balance against a plain reference: every step
// recomputes the workloads from the pieces, sorts all ranks, and tries every
// (partner, x, y, z) exchange with no pruning, filter or sorted look-up, so
// that the tuned exchanger can be checked for the exact same plan.
#include "core/internal/flashcp_balance.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/internal/flashcp_pieces.h"
#include "core/internal/strategies_internal.h"
#include "core/random.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core::internal {
namespace {

using ::testing::ElementsAre;

// One exchange: a hands b piece x, takes back whole y and, where z >= 0, z
// whole (head 0) or z's head of `head` tokens.
struct Exchange {
  double shift = 0, peak = 0;
  int64_t cost = 0;
  int32_t b = -1, x = -1, y = -1, z = -1;
  int64_t head = 0;
};

// How often each kind of exchange was made (that the draws reach them all).
struct Tally {
  int64_t steps = 0, whole_z = 0, head_z = 0, cut_x = 0, x_only = 0;
};

class PlainBalancer {
 public:
  PlainBalancer(const Batch& batch, const Plan& plan, double max_workload, int64_t min_shard,
                bool move_cut, Tally& tally)
      : tally_(tally),
        batch_(batch),
        pieces_(plan.shards),
        max_workload_(max_workload),
        m_(std::max<int64_t>(1, min_shard)),
        move_cut_(move_cut) {
    slot_.resize(pieces_.size());
    std::iota(slot_.begin(), slot_.end(), 0);
  }

  bool Step(int32_t tried) {
    std::vector<double> work(batch_.cp_size, 0.0);
    for (const Shard& s : pieces_) work[s.rank] += RangeWorkload(s.start, s.len);
    int32_t a = 0;
    for (int32_t r = 1; r < batch_.cp_size; ++r) {
      if (work[r] > work[a]) a = r;
    }
    if (work[a] <= max_workload_) return false;
    std::vector<int32_t> ranks(batch_.cp_size);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](int32_t p, int32_t q) { return work[p] < work[q]; });
    Exchange best;
    best.peak = work[a];
    for (int32_t p = 0; p < tried; ++p) {
      const int32_t b = ranks[p];
      if (b == a) continue;
      for (const bool cut : {false, true}) {
        if (cut && !move_cut_) continue;
        for (int32_t x : Held(a, cut)) {
          for (int32_t y : Held(b, false)) Consider(work[a], work[b], b, x, y, best);
        }
      }
    }
    if (best.b < 0) return false;
    Apply(a, best);
    return true;
  }

  const std::vector<Shard>& pieces() const { return pieces_; }

 private:
  bool Whole(int32_t i) const { return pieces_[i].len == batch_.doc_lens[pieces_[i].doc]; }

  // Rank r's whole (or cut) pieces in slot order: where a piece took
  // another's place (an exchanged x or y) it has that one's slot; where one
  // joined a rank otherwise, it comes after every other.
  std::vector<int32_t> Held(int32_t r, bool cut) const {
    std::vector<int32_t> held;
    for (int32_t i = 0; i < static_cast<int32_t>(pieces_.size()); ++i) {
      if (pieces_[i].rank == r && Whole(i) != cut) held.push_back(i);
    }
    std::sort(held.begin(), held.end(), [&](int32_t i, int32_t j) { return slot_[i] < slot_[j]; });
    return held;
  }

  // The first of the exchanges is taken where it brings A within the bound
  // with fewer tokens cut, else lowers the peak; ties keep the one before.
  bool Better(double wa, double peak, int64_t cost, const Exchange& best) const {
    if (peak >= wa) return false;
    const bool fits = peak <= max_workload_;
    const bool best_fits = best.b >= 0 && best.peak <= max_workload_;
    if (fits != best_fits) return fits;
    if (fits) return cost < best.cost || (cost == best.cost && peak < best.peak);
    return peak < best.peak || (peak == best.peak && cost < best.cost);
  }

  // x for y, and for the rest of x's length a whole z of b's of exactly that
  // length (the first in slot order), else the head of the shortest longer
  // one that leaves both sides >= m.
  void Consider(double wa, double wb, int32_t b, int32_t x, int32_t y, Exchange& best) const {
    const Shard& sx = pieces_[x];
    const bool cut = !Whole(x);
    const int64_t ly = pieces_[y].len;
    if (ly > sx.len || (ly == sx.len && !cut)) return;
    const int64_t lz = sx.len - ly;
    const double pairs = static_cast<double>(sx.len) * static_cast<double>(sx.start) +
                         static_cast<double>(ly) * static_cast<double>(lz);
    const double peak = std::max(wa - pairs, wb + pairs);
    const int64_t cost = cut ? sx.len : 0;
    Exchange e{pairs, peak, cost, b, x, y, -1, 0};
    if (lz == 0) {
      if (Better(wa, peak, cost, best)) best = e;
      return;
    }
    int32_t whole = -1, longer = -1;
    for (int32_t z : Held(b, false)) {
      const int64_t len = pieces_[z].len;
      if (z == y) continue;
      if (len == lz && whole < 0) whole = z;
      if (lz >= m_ && len >= lz + m_ && (longer < 0 || len < pieces_[longer].len)) longer = z;
    }
    if (whole >= 0 && Better(wa, peak, cost, best)) {
      e.z = whole;
      best = e;
    } else if (longer >= 0 && Better(wa, peak, cost + lz, best)) {
      e.z = longer;
      e.cost = cost + lz;
      e.head = lz;
      best = e;
    }
  }

  void Apply(int32_t a, const Exchange& e) {
    const bool whole_x = Whole(e.x);
    ++tally_.steps;
    tally_.cut_x += whole_x ? 0 : 1;
    tally_.x_only += e.z < 0 ? 1 : 0;
    tally_.whole_z += e.z >= 0 && e.head == 0 ? 1 : 0;
    tally_.head_z += e.head > 0 ? 1 : 0;
    pieces_[e.x].rank = e.b;
    pieces_[e.y].rank = a;
    if (whole_x) {
      std::swap(slot_[e.x], slot_[e.y]);
    } else {
      slot_[e.x] = next_slot_++;
      slot_[e.y] = next_slot_++;
    }
    if (e.z < 0) return;
    if (e.head == 0) {
      pieces_[e.z].rank = a;
      slot_[e.z] = next_slot_++;
      return;
    }
    pieces_.push_back(Shard{pieces_[e.z].doc, 0, e.head, a});
    slot_.push_back(next_slot_++);
    pieces_[e.z].start = e.head;
    pieces_[e.z].len -= e.head;
    slot_[e.z] = next_slot_++;
  }

  Tally& tally_;
  const Batch& batch_;
  std::vector<Shard> pieces_;
  std::vector<int64_t> slot_;
  int64_t next_slot_ = 1 << 30;
  const double max_workload_;
  const int64_t m_;
  const bool move_cut_;
};

Plan PlainBalance(const Batch& batch, const Plan& plan, double max_workload, int32_t partners,
                  int32_t max_moves, int64_t min_shard, bool move_cut, Tally& tally) {
  PlainBalancer balancer(batch, plan, max_workload, min_shard, move_cut, tally);
  const int32_t tried = std::clamp(partners, 0, plan.cp_size);
  int32_t moves = 0;
  while (moves < max_moves && balancer.Step(tried)) ++moves;
  return moves == 0 ? plan : FinishPlan(batch, balancer.pieces());
}

// A valid plan of a random batch: a planner's, or the packed sequence cut
// into 1 to 3 chunks per rank's share, dealt out shuffled (cut documents,
// several pieces per rank). Documents of at most 300 tokens keep every
// workload an exact double, so the reference may sum afresh each step.
Plan RandomPlan(SplitMix64Rng& rng, Batch& batch) {
  batch.cp_size =
      static_cast<int32_t>(rng.Between(0, 9) == 0 ? rng.Between(9, 16) : rng.Between(1, 8));
  const int64_t count = rng.Between(0, 7) == 0 ? 1 : rng.Between(1, 6 * batch.cp_size + 6);
  const int64_t kind = rng.Between(0, 4);
  batch.doc_lens.clear();
  for (int64_t i = 0; i < count; ++i) {
    batch.doc_lens.push_back(kind == 0   ? 1
                             : kind <= 2 ? rng.Between(1, 8)
                                         : (rng.Between(0, 4) == 0 ? 1 : rng.Between(1, 300)));
  }
  // A batch has at least a token per rank.
  int64_t total = TotalTokens(batch.doc_lens);
  for (; total < batch.cp_size; ++total) batch.doc_lens.push_back(1);
  const int64_t source = rng.Between(0, 5);
  if (source < 3) {
    const Strategy s =
        std::vector{Strategy::kWholeDoc, Strategy::kFlashCp, Strategy::kZigzag}[source];
    absl::StatusOr<Plan> plan = MakePlan(s, batch);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : Plan{};
  }
  std::vector<int64_t> sizes;
  std::vector<int32_t> owners;
  const std::vector<int64_t> targets = RankTargets(batch);
  for (int32_t r = 0; r < batch.cp_size; ++r) {
    for (int64_t left = targets[r]; left > 0;) {
      const int64_t size = rng.Between(0, 2) == 0 ? left : rng.Between(1, left);
      sizes.push_back(size);
      owners.push_back(r);
      left -= size;
    }
  }
  for (size_t i = sizes.size(); i > 1; --i) {  // Fisher-Yates
    const size_t j = static_cast<size_t>(rng.Between(0, static_cast<int64_t>(i) - 1));
    std::swap(sizes[i - 1], sizes[j]);
    std::swap(owners[i - 1], owners[j]);
  }
  return FinishPlan(batch, CutPacked(batch, sizes, owners));
}

TEST(BalanceByWholeExchangesTest, MatchesThePlainReference) {
  SplitMix64Rng rng(20260303);
  Tally tally;
  for (int trial = 0; trial < 10000; ++trial) {
    Batch batch;
    const Plan plan = RandomPlan(rng, batch);
    ASSERT_EQ(plan.cp_size, batch.cp_size);
    std::vector<double> work(batch.cp_size, 0.0);
    for (const Shard& s : plan.shards) work[s.rank] += RangeWorkload(s.start, s.len);
    const double low = *std::min_element(work.begin(), work.end());
    const double high = *std::max_element(work.begin(), work.end());
    // A bound of 0 (lower the peak while any exchange does), one between
    // the lightest and heaviest rank, or one already met.
    const int64_t pick = rng.Between(0, 7);
    const double bound = pick <= 2 ? 0.0
                         : pick == 7
                             ? high
                             : low + (high - low) * static_cast<double>(rng.Between(0, 8)) / 8;
    const int32_t partners = static_cast<int32_t>(rng.Between(0, batch.cp_size + 1));
    const int32_t moves = static_cast<int32_t>(rng.Between(0, 20));
    const int64_t m = std::vector<int64_t>{0, 1, 1, 2, 3, 8}[rng.Between(0, 5)];
    const bool move_cut = rng.Between(0, 1) == 1;
    const Plan tuned = BalanceByWholeExchanges(batch, plan, bound, partners, moves, m, move_cut);
    const Plan plain = PlainBalance(batch, plan, bound, partners, moves, m, move_cut, tally);
    ASSERT_EQ(tuned.shards, plain.shards) << "trial " << trial;
    ASSERT_EQ(tuned.padding, plain.padding) << "trial " << trial;
  }
  // The draws reached every kind of exchange, and chains of them.
  EXPECT_GT(tally.steps, 4000);
  EXPECT_GT(tally.whole_z, 1000);
  EXPECT_GT(tally.head_z, 2000);
  EXPECT_GT(tally.cut_x, 1000);
  EXPECT_GT(tally.x_only, 300);
}

// Equal exchanges after the first: each rank's documents are tried in slot
// order, not in the plan's order (flashcp_balance.h says "plan order", true
// of the first step only). Rank 0 holds docs 0, 1, 3 (1, 4, 1 tokens; W
// 12), rank 1 docs 2 and 4 (4, 5; W 25); bound 0, min_shard 1. Step 1:
// doc 4 for doc 0 and doc 1 (1 x 4 = 4 pairs, no cut): 16 / 21; doc 0
// takes doc 4's slot in rank 1's list and doc 1 goes last: docs 2, 0, 1.
// Step 2: doc 2 or doc 1 (4 tokens each) for doc 3 and the 3-token head of
// doc 4 (1 x 3 = 3 pairs): 19 / 18, the same exchange; doc 2, first in
// slot order, goes, though doc 1 comes first in the plan.
TEST(BalanceByWholeExchangesTest, EqualExchangesAfterTheFirstGoBySlot) {
  const Batch batch{{1, 4, 4, 1, 5}, 2};
  const Plan plan = FinishPlan(batch, {Shard{0, 0, 1, 0}, Shard{1, 0, 4, 0}, Shard{3, 0, 1, 0},
                                       Shard{2, 0, 4, 1}, Shard{4, 0, 5, 1}});
  Tally tally;
  const Plan one = BalanceByWholeExchanges(batch, plan, 0.0, 2, 1, 1);
  EXPECT_THAT(one.shards, ElementsAre(Shard{3, 0, 1, 0}, Shard{4, 0, 5, 0}, Shard{0, 0, 1, 1},
                                      Shard{1, 0, 4, 1}, Shard{2, 0, 4, 1}));
  EXPECT_EQ(PlainBalance(batch, plan, 0.0, 2, 1, 1, false, tally).shards, one.shards);
  const Plan two = BalanceByWholeExchanges(batch, plan, 0.0, 2, 8, 1);
  EXPECT_THAT(two.shards, ElementsAre(Shard{2, 0, 4, 0}, Shard{4, 3, 2, 0}, Shard{0, 0, 1, 1},
                                      Shard{1, 0, 4, 1}, Shard{3, 0, 1, 1}, Shard{4, 0, 3, 1}));
  EXPECT_EQ(PlainBalance(batch, plan, 0.0, 2, 8, 1, false, tally).shards, two.shards);
  EXPECT_EQ(tally.steps, 1 + 2);
}

}  // namespace
}  // namespace flashcp::core::internal
