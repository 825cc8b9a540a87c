// flashcp's balancing exchanges (flashcp_balance.h).
#include "core/internal/flashcp_balance.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "core/internal/flashcp_pieces.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {
namespace {

// A set of lengths that answers "maybe" for every member and for a few
// others: one bit per hash (the low bits of a length), in at least 4 bits
// per member, so that memory grows with the members, not with their
// lengths. A "maybe" is confirmed by an exact search.
class LengthFilter {
 public:
  void Build(const std::vector<int64_t>& lens) {
    bits_ = std::max<uint64_t>(64, std::bit_ceil(4 * static_cast<uint64_t>(lens.size())));
    words_.assign(bits_ / 64, 0);
    for (const int64_t len : lens) Set(static_cast<uint64_t>(len) & (bits_ - 1));
  }
  bool MayHold(int64_t len) const {
    const uint64_t h = static_cast<uint64_t>(len) & (bits_ - 1);
    return (words_[h / 64] >> (h % 64) & 1) != 0;
  }

 private:
  void Set(uint64_t h) { words_[h / 64] |= uint64_t{1} << (h % 64); }
  uint64_t bits_ = 64;
  std::vector<uint64_t> words_ = std::vector<uint64_t>(1, 0);
};

// One balancing exchange (BalanceByWholeExchanges): rank a hands b whole x
// (or a cut piece x), takes back whole y and, where z >= 0, z (whole, or
// its head of `head` tokens); shifts `shift` pairs from a to b.
struct WholeExchange {
  double shift = 0;
  double peak = 0;
  int64_t cost = 0;  // tokens it adds to the targeted exchange
  int32_t b = -1, x = -1, y = -1, z = -1;
  int64_t head = 0;  // 0: z moves whole; else z's head of this many tokens moves
};

// BalanceByWholeExchanges' state (the plan's pieces, per rank its workload,
// whole and cut shards and their look-up tables) and steps.
class WholeExchanger {
 public:
  WholeExchanger(const Batch& batch, const Plan& plan, double max_workload, int64_t min_shard,
                 bool move_cut)
      : batch_(batch),
        n_(plan.cp_size),
        m_(std::max<int64_t>(1, min_shard)),
        max_workload_(max_workload),
        move_cut_(move_cut),
        pieces_(plan.shards),
        workload_(n_, 0.0),
        whole_(n_),
        cut_(n_),
        ranks_(n_),
        by_len_(n_),
        len_of_(n_),
        whole_len_(n_),
        has_len_(n_),
        stale_(n_, 1) {
    // Per rank, its whole documents' shards and (with move_cut) its cut
    // ones (indices into pieces).
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const Shard& s = pieces_[i];
      workload_[s.rank] += RangeWorkload(s.start, s.len);
      if (s.len == batch.doc_lens[s.doc]) {
        whole_[s.rank].push_back(static_cast<int32_t>(i));
      } else if (move_cut_) {
        cut_[s.rank].push_back(static_cast<int32_t>(i));
      }
    }
  }

  // One exchange off the heaviest rank, the best over the `tried` lightest
  // partners; false where the heaviest is within max_workload or none
  // lowers it.
  bool Step(int32_t tried) {
    a_ = static_cast<int32_t>(std::max_element(workload_.begin(), workload_.end()) -
                              workload_.begin());
    if (workload_[a_] <= max_workload_) return false;
    // The `tried` lightest ranks, lightest first (ties: the lower rank).
    std::iota(ranks_.begin(), ranks_.end(), 0);
    std::partial_sort(ranks_.begin(), ranks_.begin() + tried, ranks_.end(),
                      [&](int32_t x, int32_t y) {
                        return workload_[x] < workload_[y] ||
                               (workload_[x] == workload_[y] && x < y);
                      });
    best_ = WholeExchange{};
    best_.peak = workload_[a_];
    for (int32_t p = 0; p < tried; ++p) {
      const int32_t b = ranks_[p];
      if (b == a_) continue;
      if (stale_[b]) Refresh(b);
      for (int32_t x : whole_[a_]) TryX(b, x, false);
      for (int32_t x : cut_[a_]) TryX(b, x, true);
    }
    if (best_.b < 0) return false;
    Apply();
    return true;
  }

  std::vector<Shard>& pieces() { return pieces_; }

 private:
  // Whether an exchange of this peak and cost would replace the best so
  // far: one that brings A within max_workload first, the fewest tokens
  // cut among those; else the least peak. Checked before an exchange's z
  // is looked up, as most are not taken.
  bool Better(double peak, int64_t cost) const {
    if (peak >= workload_[a_]) return false;
    const bool fits = peak <= max_workload_;
    const bool best_fits = best_.b >= 0 && best_.peak <= max_workload_;
    if (fits != best_fits) return fits;
    if (fits) return cost < best_.cost || (cost == best_.cost && peak < best_.peak);
    return peak < best_.peak || (peak == best_.peak && cost < best_.cost);
  }

  // An exchange is taken only at a peak at or under this (Better).
  double Limit() const {
    return best_.b >= 0 && best_.peak <= max_workload_ ? max_workload_ : best_.peak;
  }

  // Rank b's whole shards stably sorted by length (ties: their order in
  // whole_), and those lengths, for the z look-up; and the lengths in
  // whole_'s order, for the y scan, and a filter of the lengths held, so
  // that most look-ups for a length none has are skipped: built again only
  // after an exchange changed the rank's whole shards.
  void Refresh(int32_t b) {
    by_len_[b] = whole_[b];
    std::stable_sort(by_len_[b].begin(), by_len_[b].end(),
                     [&](int32_t x, int32_t y) { return pieces_[x].len < pieces_[y].len; });
    len_of_[b].resize(by_len_[b].size());
    for (size_t i = 0; i < by_len_[b].size(); ++i) len_of_[b][i] = pieces_[by_len_[b][i]].len;
    whole_len_[b].resize(whole_[b].size());
    for (size_t i = 0; i < whole_[b].size(); ++i) whole_len_[b][i] = pieces_[whole_[b][i]].len;
    has_len_[b].Build(len_of_[b]);
    stale_[b] = 0;
  }

  // Every exchange of rank a's shard x with partner b.
  void TryX(int32_t b, int32_t x, bool is_cut) {
    const Shard& sx = pieces_[x];
    const int64_t lx = sx.len;
    // x's pairs beyond those of a whole document of its length: its
    // prefix's, len(x) x start (0 for a whole one).
    const double above = static_cast<double>(lx) * static_cast<double>(sx.start);
    // A cut x's KV then comes from or goes to b: its tokens count as cut.
    const int64_t moved = is_cut ? lx : 0;
    // An exchange is taken only at a peak <= Limit(), so only where it
    // shifts between wa - limit and limit - wb pairs; x's exchanges shift
    // at most above + floor(lx^2 / 4) (at len(y) = lx / 2). Tests on doubles
    // that round as the peak's own do.
    const double wa = workload_[a_], wb = workload_[b];
    double cap = Limit();
    // In doubles: lx / 2 x (lx - lx / 2) overflows int64 beyond about 3e9
    // tokens, and the product rounds as the pairs' own below do.
    if (wa - (above + static_cast<double>(lx / 2) * static_cast<double>(lx - lx / 2)) > cap) {
      return;
    }
    const std::vector<int64_t>& ylens = whole_len_[b];
    for (size_t k = 0; k < ylens.size(); ++k) {
      const int64_t ly = ylens[k];
      if (ly > lx || (ly == lx && !is_cut)) continue;
      // Both of (x, y)'s exchanges below shift the same pairs, so share a
      // peak.
      const int64_t lz = lx - ly;
      const double pairs = above + static_cast<double>(ly) * static_cast<double>(lz);
      if (wa - pairs > cap || wb + pairs > cap) continue;
      const double peak = std::max(wa - pairs, wb + pairs);
      // Each of the exchanges below costs no less than the one before it at
      // the same peak: where one is not taken, neither is the next, and
      // where one is taken, the next is not.
      if (!Better(peak, moved)) continue;
      const int32_t y = whole_[b][k];
      if (TryZ(WholeExchange{pairs, peak, moved, b, x, y, -1, 0}, ly == lx, lz)) cap = Limit();
    }
  }

  // Exchange `e` (x for y, peak and cost set) completed by a z where one
  // is needed (x_only: a cut x for a whole y of its length, none), and
  // taken; whether it was.
  bool TryZ(WholeExchange e, bool x_only, int64_t lz) {
    if (x_only) {  // a cut x for a whole y of its length: its prefix's pairs
      best_ = e;
      return true;
    }
    const int32_t b = e.b;
    const std::vector<int32_t>& sorted = by_len_[b];
    const std::vector<int64_t>& lens = len_of_[b];
    // x for y and a whole z of lz tokens: len(y) len(z) pairs, no KV.
    if (has_len_[b].MayHold(lz)) {
      size_t it = static_cast<size_t>(std::lower_bound(lens.begin(), lens.end(), lz) -
                                      lens.begin());
      while (it < lens.size() && lens[it] == lz && sorted[it] == e.y) ++it;
      if (it < lens.size() && lens[it] == lz) {
        e.z = sorted[it];
        best_ = e;
        return true;
      }
    }
    // x for y and the lz-token head of a longer whole z (>= m tokens each
    // side): len(y) lz pairs, lz tokens more to move.
    if (lz < m_ || !Better(e.peak, e.cost + lz)) return false;
    size_t longer = static_cast<size_t>(std::lower_bound(lens.begin(), lens.end(), lz + m_) -
                                        lens.begin());
    while (longer < lens.size() && sorted[longer] == e.y) ++longer;
    if (longer >= lens.size()) return false;
    e.cost += lz;
    e.z = sorted[longer];
    e.head = lz;
    best_ = e;
    return true;
  }

  // The best exchange made.
  void Apply() {
    const int32_t a = a_, b = best_.b;
    stale_[a] = stale_[b] = 1;
    workload_[a] -= best_.shift;
    workload_[b] += best_.shift;
    pieces_[best_.x].rank = b;
    pieces_[best_.y].rank = a;
    if (pieces_[best_.x].len == batch_.doc_lens[pieces_[best_.x].doc]) {
      std::replace(whole_[a].begin(), whole_[a].end(), best_.x, best_.y);
      std::replace(whole_[b].begin(), whole_[b].end(), best_.y, best_.x);
    } else {
      cut_[a].erase(std::find(cut_[a].begin(), cut_[a].end(), best_.x));
      cut_[b].push_back(best_.x);
      whole_[a].push_back(best_.y);
      whole_[b].erase(std::find(whole_[b].begin(), whole_[b].end(), best_.y));
    }
    if (best_.z < 0) return;  // x for y alone
    whole_[b].erase(std::find(whole_[b].begin(), whole_[b].end(), best_.z));
    if (best_.head == 0) {
      pieces_[best_.z].rank = a;
      whole_[a].push_back(best_.z);
      return;
    }
    const Shard z = pieces_[best_.z];
    pieces_.push_back(Shard{z.doc, 0, best_.head, a});
    Shard& tail = pieces_[best_.z];
    tail.start = best_.head;
    tail.len -= best_.head;
    if (move_cut_) {
      cut_[a].push_back(static_cast<int32_t>(pieces_.size()) - 1);
      cut_[b].push_back(best_.z);
    }
  }

  const Batch& batch_;
  const int32_t n_;
  const int64_t m_;
  const double max_workload_;
  const bool move_cut_;
  std::vector<Shard> pieces_;
  std::vector<double> workload_;
  std::vector<std::vector<int32_t>> whole_, cut_;
  std::vector<int32_t> ranks_;
  std::vector<std::vector<int32_t>> by_len_;
  std::vector<std::vector<int64_t>> len_of_, whole_len_;
  std::vector<LengthFilter> has_len_;
  std::vector<uint8_t> stale_;
  int32_t a_ = 0;  // the heaviest rank, this step's donor
  WholeExchange best_;
};

}  // namespace

Plan BalanceByWholeExchanges(const Batch& batch, const Plan& plan, double max_workload,
                             int32_t partners, int32_t max_moves, int64_t min_shard,
                             bool move_cut) {
  WholeExchanger exchanger(batch, plan, max_workload, min_shard, move_cut);
  const int32_t tried = std::clamp(partners, 0, plan.cp_size);
  bool changed = false;
  for (int32_t move = 0; move < max_moves && exchanger.Step(tried); ++move) changed = true;
  if (!changed) return plan;
  return FinishPlan(batch, std::move(exchanger.pieces()));
}

}  // namespace flashcp::core::internal
