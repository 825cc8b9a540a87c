// core/internal/whole_doc_place against plain references: the same steps
// written the obvious way (a scan over every rank for each choice, sums
// recomputed, documents erased one at a time), so that the tuned routines
// (tournament tree, ordered receivers, skip cursors, compaction) can be
// checked for the exact same shards, workloads, held documents and return.
#include "core/internal/whole_doc_place.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/internal/flashcp_pieces.h"
#include "core/random.h"
#include "core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core::internal {
namespace {

using ::testing::ElementsAre;

// PlaceWholeDocs, plainly: each document to the rank of least key, the
// lowest rank on ties.
void PlainPlace(const Batch& batch, const std::vector<int32_t>& docs,
                const std::vector<int64_t>& need, double rho, std::vector<double>& workload,
                WholeDocPlacement& placement) {
  const int32_t n = batch.cp_size;
  placement.tokens.assign(n, 0);
  placement.held.assign(n, {});
  placement.docs = static_cast<int64_t>(docs.size());
  const auto key = [&](int32_t q) {
    return workload[q] - rho * static_cast<double>(placement.tokens[q] - need[q]);
  };
  for (int32_t d : docs) {
    int32_t best = 0;
    for (int32_t q = 1; q < n; ++q) {
      if (key(q) < key(best)) best = q;
    }
    const int64_t len = batch.doc_lens[d];
    workload[best] += RangeWorkload(0, len);
    placement.tokens[best] += len;
    placement.held[best].push_back(d);
  }
}

// How often the reference took each rule's branch (that the random draws
// reach them all).
struct Branches {
  int64_t whole_moves = 0, swaps = 0, kept_tails = 0, capped = 0;
};

// EqualizeWholeDocs, plainly: donors in rank order; each piece to the
// least-loaded rank (lowest on ties) whose deficit is large enough, found by
// a scan.
class PlainEqualizer {
 public:
  PlainEqualizer(const Batch& batch, const std::vector<int64_t>& need, WholeDocPlacement& placement,
                 std::vector<double>& workload, std::vector<Shard>& out,
                 const WholeDocOptions& options, Branches& branches)
      : branches_(branches),
        lens_(batch.doc_lens),
        m_(options.min_shard),
        options_(options),
        held_(placement.held),
        workload_(workload),
        out_(out) {
    for (int32_t r = 0; r < batch.cp_size; ++r) deficit_.push_back(need[r] - placement.tokens[r]);
  }

  bool Run() {
    for (size_t r = 0; r < deficit_.size(); ++r) {
      const int64_t excess = -deficit_[r];
      if (excess <= 0) continue;
      deficit_[r] = 0;
      Donate(static_cast<int32_t>(r), excess);
    }
    return cap_decided_;
  }

 private:
  // The least-loaded rank with a deficit of at least `at_least` (>= 1), or -1.
  int32_t LeastLoaded(int64_t at_least) const {
    int32_t best = -1;
    for (int32_t q = 0; q < static_cast<int32_t>(deficit_.size()); ++q) {
      if (deficit_[q] < at_least) continue;
      if (best < 0 || workload_[q] < workload_[best]) best = q;
    }
    return best;
  }

  void Hand(int32_t d, int64_t start, int64_t len, int32_t from, int32_t to) {
    out_.push_back(Shard{d, start, len, to});
    workload_[to] += RangeWorkload(start, len);
    workload_[from] -= RangeWorkload(start, len);
  }

  int64_t Sum(const std::vector<int32_t>& docs, size_t from) const {
    int64_t sum = 0;
    for (size_t i = from; i < docs.size(); ++i) sum += lens_[docs[i]];
    return sum;
  }

  void Donate(int32_t r, int64_t excess) {
    std::vector<int32_t>& mine = held_[r];
    // Whole documents, shortest (last) first, while one fits the excess
    // and some deficit.
    while (options_.whole_moves && excess > 0 && !mine.empty()) {
      const int64_t len = lens_[mine.back()];
      const int32_t to = len <= excess ? LeastLoaded(len) : -1;
      if (to < 0) break;
      Hand(mine.back(), 0, len, r, to);
      deficit_[to] -= len;
      excess -= len;
      mine.pop_back();
      ++branches_.whole_moves;
    }
    // Then heads, longest document first; a cut document leaves `mine`.
    size_t j = 0;
    while (excess > 0 && j < mine.size()) {
      const int32_t d = mine[j];
      const int64_t head = Cut(r, d, Sum(mine, j + 1), excess);
      if (head == 0) {
        ++j;
        continue;
      }
      if (head < lens_[d]) out_.push_back(Shard{d, head, lens_[d] - head, r});
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(j));
    }
  }

  // Heads of d while the excess lasts; returns the tokens handed out.
  int64_t Cut(int32_t r, int32_t d, int64_t later, int64_t& excess) {
    const int64_t len = lens_[d];
    int64_t head = 0;
    while (excess > 0 && head < len) {
      const int64_t rest = len - head;
      int32_t to = m_ > 0 ? LeastLoaded(std::min(m_, excess)) : -1;
      if (to < 0) to = LeastLoaded(1);
      int64_t take = std::min({excess, deficit_[to], rest});
      int64_t back = 0;  // tokens of a document `to` returns whole
      if (m_ > 0 && take < m_) {
        const int32_t swap = SwapFor(to, take, rest, later, excess);
        if (swap >= 0) {
          back = lens_[swap];
          Hand(swap, 0, back, to, r);
          std::erase(held_[to], swap);
          ++branches_.swaps;
        }
      }
      bool last = false;
      // A tail under m: an m-token tail kept instead where the donor can
      // still give its excess. (Sending the whole rest never applies here:
      // take is already the least of rest, excess and the deficit.)
      if (m_ > 0 && back == 0 && rest - take > 0 && rest - take < m_ && rest - m_ >= m_ &&
          later >= excess - (rest - m_)) {
        take = rest - m_;
        last = true;
        ++branches_.kept_tails;
      }
      Hand(d, head, take + back, r, to);
      deficit_[to] -= take;
      excess -= take;
      head += take + back;
      if (last) break;
    }
    return head;
  }

  // The shortest whole document of `to` (the last of equal ones) that makes
  // a head of at least m, if that head leaves no tail under m and the donor
  // enough to give; else -1.
  int32_t SwapFor(int32_t to, int64_t take, int64_t rest, int64_t later, int64_t excess) {
    int32_t best = -1;
    for (int32_t d : held_[to]) {
      if (lens_[d] >= m_ - take && (best < 0 || lens_[d] <= lens_[best])) best = d;
    }
    if (best < 0) return -1;
    const int64_t h = take + lens_[best];
    if (h > rest || (h < rest && rest - h < m_) || rest - h + later < excess - take) return -1;
    if (options_.max_swap_head > 0 && h > options_.max_swap_head) {
      cap_decided_ = true;
      ++branches_.capped;
      return -1;
    }
    return best;
  }

  Branches& branches_;
  const std::vector<int64_t>& lens_;
  const int64_t m_;
  const WholeDocOptions& options_;
  std::vector<std::vector<int32_t>>& held_;
  std::vector<double>& workload_;
  std::vector<Shard>& out_;
  std::vector<int64_t> deficit_;
  bool cap_decided_ = false;
};

bool PlainEqualize(const Batch& batch, const std::vector<int64_t>& need,
                   WholeDocPlacement& placement, std::vector<double>& workload,
                   std::vector<Shard>& out, const WholeDocOptions& options, Branches& branches) {
  return PlainEqualizer(batch, need, placement, workload, out, options, branches).Run();
}

// Random documents: many one-token ones, short ones, long ones, and now and
// then some past 2^27 tokens (workloads past 2^53, where sums round).
std::vector<int64_t> RandomLens(SplitMix64Rng& rng, int64_t count) {
  const int64_t kind = rng.Between(0, 9);
  std::vector<int64_t> lens;
  for (int64_t i = 0; i < count; ++i) {
    if (kind == 0) {
      lens.push_back(1);
    } else if (kind <= 3) {
      lens.push_back(rng.Between(1, 8));
    } else if (kind == 9) {
      lens.push_back(rng.Between(0, 3) == 0 ? rng.Between(int64_t{1} << 27, int64_t{1} << 31)
                                          : rng.Between(1, 5000));
    } else {
      lens.push_back(rng.Between(0, 4) == 0 ? 1 : rng.Between(1, 300));
    }
  }
  return lens;
}

// Tokens each rank must take, summing to `total`: the planners' even split
// with padding (ceil(total / n) each, the last ones short or empty), or a
// random split with empty ranks.
std::vector<int64_t> RandomNeed(SplitMix64Rng& rng, int64_t total, int32_t n) {
  std::vector<int64_t> need(n, 0);
  if (rng.Between(0, 1) == 0) {
    const int64_t c = TokensPerRank(total, n);
    int64_t left = total;
    for (int32_t r = 0; r < n; ++r) left -= need[r] = std::min(c, left);
    return need;
  }
  for (int64_t t = total; t > 0;) {  // chunks to random ranks
    const int64_t chunk = std::min(t, rng.Between(1, std::max<int64_t>(1, total / 3)));
    need[rng.Between(0, n - 1)] += chunk;
    t -= chunk;
  }
  return need;
}

struct RandomCase {
  Batch batch;
  std::vector<int32_t> docs;  // the ones placed, longest first
  std::vector<int64_t> need;
  std::vector<double> workload;  // from other pieces
  WholeDocOptions options;
};

RandomCase MakeCase(SplitMix64Rng& rng) {
  RandomCase c;
  c.batch.cp_size =
      static_cast<int32_t>(rng.Between(0, 7) == 0 ? rng.Between(10, 40) : rng.Between(1, 8));
  const int32_t n = c.batch.cp_size;
  const int64_t count = rng.Between(0, 5) == 0 ? rng.Between(1, 2) : rng.Between(1, 4 * n + 4);
  c.batch.doc_lens = RandomLens(rng, count);
  // A subset of the batch's documents (the rest are other pieces').
  int64_t total = 0;
  for (int32_t d = 0; d < static_cast<int32_t>(count); ++d) {
    if (d == 0 || rng.Between(0, 4) != 0) {
      c.docs.push_back(d);
      total += c.batch.doc_lens[d];
    }
  }
  std::stable_sort(c.docs.begin(), c.docs.end(),
                   [&](int32_t a, int32_t b) { return c.batch.doc_lens[a] > c.batch.doc_lens[b]; });
  c.need = RandomNeed(rng, total, n);
  // Equal workloads (ties) often, small integers, or fractions.
  const int64_t base = rng.Between(0, 2);
  for (int32_t r = 0; r < n; ++r) {
    c.workload.push_back(base == 0   ? 0.0
                         : base == 1 ? static_cast<double>(rng.Between(0, 40))
                                     : static_cast<double>(rng.Between(0, 1000)) * 0.37);
  }
  const int64_t m = std::vector<int64_t>{0, 0, 1, 2, 3, 4, 8, 32}[rng.Between(0, 7)];
  const int64_t cap = std::vector<int64_t>{0, 0, m, 2 * m, rng.Between(1, 64)}[rng.Between(0, 4)];
  c.options =
      WholeDocOptions{rng.Between(0, 2) == 0 ? 0.0 : 0.25 * static_cast<double>(rng.Between(1, 12)),
                      rng.Between(0, 1) == 1, m, cap};
  return c;
}

// Each document placed at random (held longest first, as the contract
// asks), its workload added.
void RandomPlace(SplitMix64Rng& rng, const RandomCase& c, std::vector<double>& workload,
                 WholeDocPlacement& placement) {
  placement.tokens.assign(c.batch.cp_size, 0);
  placement.held.assign(c.batch.cp_size, {});
  placement.docs = static_cast<int64_t>(c.docs.size());
  for (int32_t d : c.docs) {
    const int64_t r = rng.Between(0, c.batch.cp_size - 1);
    placement.held[r].push_back(d);
    placement.tokens[r] += c.batch.doc_lens[d];
    workload[r] += RangeWorkload(0, c.batch.doc_lens[d]);
  }
}

// Every placed document covered exactly once, and every rank left with
// exactly the tokens it needs.
void ExpectCoversAndMeetsNeed(const RandomCase& c, const std::vector<Shard>& shards, int trial) {
  std::vector<int64_t> got(c.batch.cp_size, 0), covered(c.batch.doc_lens.size(), 0);
  for (const Shard& s : shards) {
    got[s.rank] += s.len;
    covered[s.doc] += s.len;
  }
  EXPECT_EQ(got, c.need) << "trial " << trial;
  for (int32_t d : c.docs) EXPECT_EQ(covered[d], c.batch.doc_lens[d]) << "trial " << trial;
}

TEST(WholeDocPlaceTest, PlaceMatchesThePlainReference) {
  SplitMix64Rng rng(20260301);
  WholeDocScratch scratch;  // reused, as a planner does
  for (int trial = 0; trial < 20000; ++trial) {
    const RandomCase c = MakeCase(rng);
    std::vector<double> work = c.workload, plain_work = c.workload;
    WholeDocPlacement placement, plain;
    PlaceWholeDocs(c.batch, c.docs, c.need, c.options.rho, work, placement, scratch);
    PlainPlace(c.batch, c.docs, c.need, c.options.rho, plain_work, plain);
    ASSERT_EQ(work, plain_work) << "trial " << trial;
    ASSERT_EQ(placement.tokens, plain.tokens) << "trial " << trial;
    ASSERT_EQ(placement.held, plain.held) << "trial " << trial;
    ASSERT_EQ(placement.docs, plain.docs) << "trial " << trial;
  }
}

TEST(WholeDocPlaceTest, EqualizeMatchesThePlainReference) {
  SplitMix64Rng rng(20260302);
  WholeDocScratch scratch;
  Branches branches;
  int64_t cuts = 0;
  for (int trial = 0; trial < 50000; ++trial) {
    const RandomCase c = MakeCase(rng);
    std::vector<double> work = c.workload;
    WholeDocPlacement placement;
    // Half as the planners place, half at random (far from balanced).
    if (trial % 2 == 0) {
      PlaceWholeDocs(c.batch, c.docs, c.need, c.options.rho, work, placement, scratch);
    } else {
      RandomPlace(rng, c, work, placement);
    }
    WholeDocPlacement plain = placement;
    std::vector<double> plain_work = work;
    // Appended after earlier pieces, as the planners do.
    std::vector<Shard> out = {Shard{0, 0, 0, 0}}, plain_out = out;
    const bool decided =
        EqualizeWholeDocs(c.batch, c.need, placement, work, out, c.options, scratch);
    const bool plain_decided =
        PlainEqualize(c.batch, c.need, plain, plain_work, plain_out, c.options, branches);
    ASSERT_EQ(decided, plain_decided) << "trial " << trial;
    ASSERT_EQ(out, plain_out) << "trial " << trial;
    ASSERT_EQ(work, plain_work) << "trial " << trial;
    ASSERT_EQ(placement.held, plain.held) << "trial " << trial;
    ASSERT_EQ(placement.tokens, plain.tokens) << "trial " << trial;
    out.erase(out.begin());
    AppendHeldWhole(c.batch, placement, out);
    ExpectCoversAndMeetsNeed(c, out, trial);
    for (const Shard& s : out) cuts += s.start > 0 ? 1 : 0;
  }
  // The draws reached every rule.
  EXPECT_GT(cuts, 5000);
  EXPECT_GT(branches.whole_moves, 1000);
  EXPECT_GT(branches.swaps, 100);
  EXPECT_GT(branches.kept_tails, 100);
  EXPECT_GT(branches.capped, 50);
}

// Both the tuned routine and the reference on one hand-worked case.
struct Equalized {
  bool decided = false;
  std::vector<Shard> out;
  std::vector<std::vector<int32_t>> held;
  std::vector<double> workload;
};

Equalized EqualizeBoth(const Batch& batch, const std::vector<int64_t>& need,
                       const WholeDocPlacement& placement, const std::vector<double>& workload,
                       const WholeDocOptions& options) {
  Equalized tuned{false, {}, {}, workload}, plain = tuned;
  WholeDocPlacement a = placement, b = placement;
  WholeDocScratch scratch;
  Branches branches;
  tuned.decided = EqualizeWholeDocs(batch, need, a, tuned.workload, tuned.out, options, scratch);
  plain.decided = PlainEqualize(batch, need, b, plain.workload, plain.out, options, branches);
  tuned.held = a.held;
  plain.held = b.held;
  EXPECT_EQ(tuned.decided, plain.decided);
  EXPECT_EQ(tuned.out, plain.out);
  EXPECT_EQ(tuned.held, plain.held);
  EXPECT_EQ(tuned.workload, plain.workload);
  return tuned;
}

// Rank 0 holds docs [10, 6] (W 55 + 21) and needs 9, rank 1 nothing and
// needs 7. m = 4: the 7-token head would leave doc 0 a 3-token tail, and
// rank 1 cannot take all 10, so the head is [0, 6) (W 21), rank 0 keeps an
// m-token tail [6, 10) and doc 1 goes on: head [0, 1) (W 1) to rank 1, a
// sliver, since rank 1 has no document to give back; tail [1, 6) stays.
// Without the rule: [0, 7) to rank 1 (W 28), tail [7, 10).
TEST(WholeDocPlaceTest, KeepsAMinShardTail) {
  const Batch batch{{10, 6}, 2};
  const WholeDocPlacement placement{{16, 0}, {{0, 1}, {}}, 2};
  const Equalized with_rule = EqualizeBoth(batch, {9, 7}, placement, {76, 0}, {0, false, 4});
  EXPECT_FALSE(with_rule.decided);
  EXPECT_THAT(with_rule.out, ElementsAre(Shard{0, 0, 6, 1}, Shard{0, 6, 4, 0}, Shard{1, 0, 1, 1},
                                         Shard{1, 1, 5, 0}));
  EXPECT_THAT(with_rule.held, ElementsAre(ElementsAre(), ElementsAre()));
  EXPECT_THAT(with_rule.workload, ElementsAre(54.0, 22.0));
  const Equalized without = EqualizeBoth(batch, {9, 7}, placement, {76, 0}, {});
  EXPECT_THAT(without.out, ElementsAre(Shard{0, 0, 7, 1}, Shard{0, 7, 3, 0}));
  EXPECT_THAT(without.held, ElementsAre(ElementsAre(1), ElementsAre()));
  EXPECT_THAT(without.workload, ElementsAre(48.0, 28.0));
}

// Rank 0 holds doc 0 (12 tokens, W 78) and needs 4; rank 1 holds doc 1 (1
// token, W 1) and needs 2; rank 2 doc 2 (2 tokens, W 3) and needs 9. m = 4:
// the 8 excess tokens go first to rank 2, the least-loaded rank that can
// take m: [0, 7) (W 28, then full); then [7, 8) (W 8) to rank 1, which has
// no document of at least 3 tokens to give back; rank 0 keeps [8, 12) (W
// 42). Without the rule rank 1, the least loaded, takes [0, 1) first.
TEST(WholeDocPlaceTest, SendsHeadsWhereAMinShardFits) {
  const Batch batch{{12, 1, 2}, 3};
  const WholeDocPlacement placement{{12, 1, 2}, {{0}, {1}, {2}}, 3};
  const Equalized with_rule = EqualizeBoth(batch, {4, 2, 9}, placement, {78, 1, 3}, {0, true, 4});
  EXPECT_THAT(with_rule.out, ElementsAre(Shard{0, 0, 7, 2}, Shard{0, 7, 1, 1}, Shard{0, 8, 4, 0}));
  EXPECT_THAT(with_rule.workload, ElementsAre(42.0, 9.0, 31.0));
  const Equalized without = EqualizeBoth(batch, {4, 2, 9}, placement, {78, 1, 3}, {0, true});
  EXPECT_THAT(without.out, ElementsAre(Shard{0, 0, 1, 1}, Shard{0, 1, 7, 2}, Shard{0, 8, 4, 0}));
  EXPECT_THAT(without.workload, ElementsAre(42.0, 2.0, 38.0));
  EXPECT_THAT(without.held, ElementsAre(ElementsAre(), ElementsAre(1), ElementsAre(2)));
}

}  // namespace
}  // namespace flashcp::core::internal
