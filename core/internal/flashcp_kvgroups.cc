// flashcp's capacity groups (flashcp_kvgroups.h).
#include "core/internal/flashcp_kvgroups.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/internal/flashcp_pieces.h"
#include "core/internal/strategies_internal.h"
#include "core/internal/whole_doc_place.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

// One rank's share of a cut document: two mirrored chunks of `len` tokens.
struct Pair {
  int32_t rank;
  int64_t len;  // tokens of each of its two chunks
};

// Levels the pair lengths of one document of `len` tokens so that its ranks
// end level in `work` (a pair of l tokens is l (L + 1) pairs wherever it
// sits), each pair in [m, what its rank's target leaves]; updates `work`
// and `group_tokens` with the new lengths. Leaves all as they are where
// the group cannot hold the document within its ranks' targets. `base`
// and `hi` are scratch.
void LevelGroup(int64_t len, int64_t m, const std::vector<int64_t>& targets,
                std::vector<Pair>& group, std::vector<double>& work,
                std::vector<int64_t>& group_tokens, std::vector<double>& base,
                std::vector<int64_t>& hi) {
  const int64_t odd = len % 2;
  const double per = static_cast<double>(len + 1);
  const int64_t half = len / 2;
  base.clear();
  hi.clear();
  int64_t hi_sum = 0;
  bool fits = true;
  for (const Pair& p : group) {
    base.push_back(work[p.rank] - static_cast<double>(p.len) * per);
    const int64_t other = group_tokens[p.rank] - 2 * p.len - odd;
    hi.push_back((targets[p.rank] - other - odd) / 2);
    fits = fits && hi.back() >= m;
    hi_sum += hi.back();
  }
  if (!fits || hi_sum < half) return;
  if (group.size() == 1) {  // its one pair holds half the document, as the search would end
    Pair& p = group[0];
    group_tokens[p.rank] += 2 * (half - p.len);
    p.len = half;
    work[p.rank] = base[0] + static_cast<double>(half) * per;
    return;
  }
  const auto length = [&](size_t i, double level) {
    return std::clamp((level - base[i]) / per, static_cast<double>(m),
                      static_cast<double>(hi[i]));
  };
  const auto total_at = [&](double level) {
    double sum = 0;
    for (size_t i = 0; i < group.size(); ++i) sum += length(i, level);
    return sum;
  };
  double lo_level = *std::min_element(base.begin(), base.end());
  double hi_level =
      *std::max_element(base.begin(), base.end()) + per * static_cast<double>(half);
  // Sixty halvings, stopped early once every length's floor is the
  // same at both ends: lengths are monotone in the level (so are their
  // rounded values) and the final level lies between the two, so the
  // floors it yields are already known. Tried only once the interval
  // is under 1/16 token of length, where it mostly succeeds.
  const auto settled = [&] {
    for (size_t i = 0; i < group.size(); ++i) {
      if (std::floor(length(i, lo_level)) != std::floor(length(i, hi_level))) return false;
    }
    return true;
  };
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo_level + hi_level);
    (total_at(mid) < static_cast<double>(half) ? lo_level : hi_level) = mid;
    if (16.0 * (hi_level - lo_level) < per && settled()) break;
  }
  int64_t sum = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    group_tokens[group[i].rank] -= 2 * group[i].len;
    group[i].len = static_cast<int64_t>(std::floor(length(i, hi_level)));
    sum += group[i].len;
  }
  // Rounding: the tokens short go one each to the ranks below their
  // cap, those over come off ranks above the minimum shard.
  for (size_t i = 0; sum < half; i = (i + 1) % group.size()) {
    if (group[i].len < hi[i]) {
      ++group[i].len;
      ++sum;
    }
  }
  for (size_t i = 0; sum > half; i = (i + 1) % group.size()) {
    if (group[i].len > m) {
      --group[i].len;
      --sum;
    }
  }
  for (size_t i = 0; i < group.size(); ++i) {
    const Pair& p = group[i];
    work[p.rank] = base[i] + static_cast<double>(p.len) * per;
    group_tokens[p.rank] += 2 * p.len;
  }
}

// The groups as pieces into `attempt` (cleared): per document (order[h],
// h < groups.size()) the longest pair outermost (ties: the order taken),
// the middle token of an odd document with the innermost pair; each rank's
// pairs and tokens of them into `group_work` and `group_tokens`.
void EmitGroups(const Batch& batch, const std::vector<int32_t>& order,
                std::vector<std::vector<Pair>>& groups, std::vector<Shard>& attempt,
                std::vector<double>& group_work, std::vector<int64_t>& group_tokens) {
  const size_t cut = groups.size();
  attempt.clear();
  std::fill(group_tokens.begin(), group_tokens.end(), 0);
  std::fill(group_work.begin(), group_work.end(), 0.0);
  for (size_t h = 0; h < cut; ++h) {
    std::vector<Pair>& group = groups[h];
    const int32_t d = order[h];
    const int64_t len = batch.doc_lens[d];
    std::stable_sort(group.begin(), group.end(),
                     [](const Pair& x, const Pair& y) { return x.len > y.len; });
    int64_t front = 0, back = len;
    for (const Pair& p : group) {
      attempt.push_back(Shard{d, front, p.len, p.rank});
      attempt.push_back(Shard{d, back - p.len, p.len, p.rank});
      group_work[p.rank] += RangeWorkload(front, p.len) + RangeWorkload(back - p.len, p.len);
      group_tokens[p.rank] += 2 * p.len;
      front += p.len;
      back -= p.len;
    }
    if (back > front) {
      const int32_t r = group.back().rank;
      attempt.push_back(Shard{d, front, back - front, r});
      group_work[r] += RangeWorkload(front, back - front);
      group_tokens[r] += back - front;
    }
  }
}

// Which documents a capacity-group candidate cuts (a prefix of the order)
// and its rho and per-rank capacity in effective pairs.
struct CutSet {
  size_t cut = 0;
  double rho = 0;
  double capacity = 0;
};

// The cut documents: the longest while a document is longer than C/N or
// over the budget in effective pairs (rho over the documents after it);
// rho and the number of ranks the groups need found together (a few rounds
// of: rho given the free ranks, the groups' ranks given rho). False where
// nothing is cut or no capacity is left.
bool FindCutSet(const Batch& batch, const FlashCpOptions& options, const KvGroupParams& params,
                int64_t per_rank, CutSet& set) {
  const int32_t n = batch.cp_size;
  const std::vector<int32_t>& order = options.order;
  const double budget = params.alpha * options.mean_work;
  // Suffix sums over `order`: pairs and tokens of order[h..].
  const size_t docs = order.size();
  std::vector<double> suffix_work(docs + 1, 0.0);
  std::vector<int64_t> suffix_tokens(docs + 1, 0);
  for (size_t h = docs; h-- > 0;) {
    const int64_t len = batch.doc_lens[order[h]];
    suffix_work[h] = suffix_work[h + 1] + RangeWorkload(0, len);
    suffix_tokens[h] = suffix_tokens[h + 1] + len;
  }
  // rho of the whole documents order[h..] where `free_ranks` ranks hold
  // none of the cut ones: those take C/N tokens and the mean pairs each of
  // them, the grouped ranks the rest.
  const auto density = [&](size_t h, int64_t free_ranks) {
    const double work = suffix_work[h] - static_cast<double>(free_ranks) * options.mean_work;
    const double tokens = static_cast<double>(suffix_tokens[h] - free_ranks * per_rank);
    return tokens > 0 && work > 0 ? params.rho_scale * work / tokens : 0.0;
  };
  size_t cut = 0;
  double rho = 0;
  int64_t free_ranks = 0;
  for (int round = 0; round < 3; ++round) {
    rho = 0;
    for (cut = 0; cut < docs; ++cut) {
      const int64_t len = batch.doc_lens[order[cut]];
      const double r = density(cut + 1, free_ranks);
      const double effective = RangeWorkload(0, len) - r * static_cast<double>(len);
      if (len <= per_rank && effective <= budget - r * static_cast<double>(per_rank)) break;
    }
    if (cut == 0) return false;  // nothing to group: the Whole-Doc plans cover it
    rho = density(cut, free_ranks);
    const double cap = budget - rho * static_cast<double>(per_rank);
    if (cap <= 0) return false;
    double need = 0;
    for (size_t h = 0; h < cut; ++h) {
      const int64_t len = batch.doc_lens[order[h]];
      need += (RangeWorkload(0, len) - rho * static_cast<double>(len)) / cap;
    }
    const int64_t next = std::max<int64_t>(0, n - static_cast<int64_t>(std::ceil(need)));
    if (next == free_ranks) break;
    free_ranks = next;
  }
  set = CutSet{cut, rho, budget - rho * static_cast<double>(per_rank)};
  return set.capacity > 0;
}

// The cut documents' groups (per cut document order[h], its ranks and pair
// lengths) and the deal that makes them, with its scratch.
class GroupDeal {
 public:
  GroupDeal(const Batch& batch, const std::vector<int32_t>& order, size_t cut, int64_t m)
      : batch_(batch), order_(order), m_(m), groups_(cut), ranks_(batch.cp_size),
        in_group_(batch.cp_size, 0) {
    kept_.reserve(batch.cp_size);
    changed_.reserve(batch.cp_size);
  }

  std::vector<std::vector<Pair>>& groups() { return groups_; }

  // Deals each cut document's pairs to the ranks with the most `free`
  // (pairs less r_rho x tokens still free), as long as each rank's `free`
  // and `space` (tokens) allow, adding to `work`; false where some document
  // does not fit.
  bool Deal(double r_rho, std::vector<double>& free, std::vector<int64_t>& space,
            std::vector<double>& work) {
    // The ranks by `free` descending, ties by rank (a total order: no
    // stable sort's buffer needed). A document's deal lowers only its
    // group's `free`: those ranks are then taken out, sorted and merged
    // back, which gives the same order as sorting all again.
    const auto before = [&](int32_t x, int32_t y) {
      return free[x] > free[y] || (free[x] == free[y] && x < y);
    };
    std::iota(ranks_.begin(), ranks_.end(), 0);
    std::sort(ranks_.begin(), ranks_.end(), before);
    for (size_t h = 0; h < groups_.size(); ++h) {
      if (h > 0) {
        for (const Pair& p : groups_[h - 1]) in_group_[p.rank] = 1;
        ResortChangedRanks(ranks_, in_group_, before, kept_, changed_);
        for (const Pair& p : groups_[h - 1]) in_group_[p.rank] = 0;
      }
      if (!DealDocument(h, r_rho, free, space, work)) return false;
    }
    return true;
  }

 private:
  // Document order[h]'s pairs over ranks_ in order.
  bool DealDocument(size_t h, double r_rho, std::vector<double>& free,
                    std::vector<int64_t>& space, std::vector<double>& work) {
    const int64_t len = batch_.doc_lens[order_[h]];
    const int64_t odd = len % 2;
    // Pairs less r_rho x tokens per token of a pair's length (a pair of l
    // tokens each side: l (L + 1) pairs, 2 l tokens).
    const double unit = std::max(1.0, static_cast<double>(len + 1) - 2.0 * r_rho);
    std::vector<Pair>& group = groups_[h];
    group.clear();
    group.reserve(batch_.cp_size);  // at most one pair per rank: allocated once, kept across passes
    int64_t remaining = len / 2;
    for (int32_t r : ranks_) {
      if (remaining == 0) break;
      // Room for both chunks and (should it be the innermost) the middle token.
      const int64_t fit_room = (space[r] - odd) / 2;
      int64_t take = std::min(
          {static_cast<int64_t>(std::floor(std::max(0.0, free[r]) / unit)), fit_room, remaining});
      if (take < m_) continue;
      const int64_t rest = remaining - take;
      if (rest > 0 && rest < m_) {
        take -= m_ - rest;  // leave the next rank a whole minimum shard
        if (take < m_) continue;
      }
      group.push_back(Pair{r, take});
      remaining -= take;
      const double pairs = static_cast<double>(take) * static_cast<double>(len + 1);
      work[r] += pairs;
      free[r] -= pairs - r_rho * static_cast<double>(2 * take);
      space[r] -= 2 * take;
    }
    if (remaining > 0 || group.empty()) return false;
    if (odd != 0) {  // the middle token: with the shortest pair
      space[std::min_element(group.begin(), group.end(),
                             [](const Pair& x, const Pair& y) { return x.len < y.len; })
                ->rank] -= 1;
    }
    return true;
  }

  const Batch& batch_;
  const std::vector<int32_t>& order_;
  const int64_t m_;
  std::vector<std::vector<Pair>> groups_;
  std::vector<int32_t> ranks_, kept_, changed_;
  std::vector<uint8_t> in_group_;
};

// Levelling: each group's pair lengths again, so that its ranks end level
// (a pair of l tokens is l (L + 1) pairs wherever it sits, so lengths move
// workload between the group's ranks at 2 tokens per L + 1 pairs); the
// token counts this changes go back by equalization. Three rounds, as
// groups share ranks. `group_tokens`: per rank its pairs' tokens, and a
// token more for each odd document it is in (whichever pair ends innermost
// takes the middle one).
void LevelGroups(const Batch& batch, const std::vector<int32_t>& order, int64_t m,
                 const std::vector<int64_t>& targets, std::vector<std::vector<Pair>>& groups,
                 std::vector<double>& work, std::vector<int64_t>& group_tokens,
                 std::vector<double>& base, std::vector<int64_t>& hi) {
  std::fill(group_tokens.begin(), group_tokens.end(), 0);
  for (size_t h = 0; h < groups.size(); ++h) {
    const int64_t odd = batch.doc_lens[order[h]] % 2;
    for (const Pair& p : groups[h]) group_tokens[p.rank] += 2 * p.len + odd;
  }
  for (int round = 0; round < 3; ++round) {
    for (size_t h = 0; h < groups.size(); ++h) {
      LevelGroup(batch.doc_lens[order[h]], m, targets, groups[h], work, group_tokens, base, hi);
    }
  }
}

}  // namespace

bool KvGroupPieces(const Batch& batch, const FlashCpOptions& options, const KvGroupParams& params,
                   std::vector<Shard>& out) {
  const int32_t n = batch.cp_size;
  const std::vector<int32_t>& order = options.order;
  const int64_t per_rank = TokensPerRank(TotalTokens(batch.doc_lens), n);
  const int64_t m = std::max<int64_t>(options.min_shard, 1);
  CutSet set;
  if (!FindCutSet(batch, options, params, per_rank, set)) return false;
  const double lpt_rho = params.lpt_scale * options.median_density;

  const std::vector<int64_t> targets = RankTargets(batch);
  std::vector<int64_t> room = targets;
  std::vector<double> workload(n, 0.0);
  std::vector<double> left(n, set.capacity);  // effective pairs still free per rank
  GroupDeal deal(batch, order, set.cut, m);
  // A first deal, by rho's guess, only steers LPT below: where some document
  // does not fit it, what was dealt still does.
  deal.Deal(set.rho, left, room, workload);
  for (int64_t& r : room) r = std::max<int64_t>(r, 0);
  // The rest whole by LPT into the room left.
  const std::vector<int32_t> rest(order.begin() + static_cast<std::ptrdiff_t>(set.cut),
                                  order.end());
  WholeDocScratch scratch;
  WholeDocPlacement placement;
  PlaceWholeDocs(batch, rest, room, lpt_rho, workload, placement, scratch);
  std::vector<double> whole(n, 0.0);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t d : placement.held[r]) whole[r] += RangeWorkload(0, batch.doc_lens[d]);
  }
  // Passes: the groups dealt again, now that the whole documents' pairs per
  // rank are known (rho no longer guessed), within R x mean and each rank's
  // tokens, then levelled, then the tokens equalized (by heads). Each pass
  // after the first knows what the last one's equalization added to or
  // took from each rank (`moved`, pairs) and deals and levels with it; the
  // pass with the least maximum rank workload is kept.
  const size_t out_size = out.size();
  std::vector<double> moved(n, 0.0), work(n), group_work(n);
  std::vector<int64_t> group_tokens(n), needed(n);
  std::vector<double> base;
  std::vector<int64_t> hi;
  std::vector<Shard> attempt;
  WholeDocPlacement equalized;
  double best_max = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass < kKvGroupPasses; ++pass) {
    for (int32_t r = 0; r < n; ++r) {
      left[r] = options.max_work - whole[r] - moved[r];
      room[r] = targets[r];
      work[r] = whole[r] + moved[r];
    }
    if (!deal.Deal(0.0, left, room, work)) break;
    LevelGroups(batch, order, m, targets, deal.groups(), work, group_tokens, base, hi);
    EmitGroups(batch, order, deal.groups(), attempt, group_work, group_tokens);
    bool over = false;  // some rank holds more group tokens than its target
    for (int32_t r = 0; r < n; ++r) {
      needed[r] = targets[r] - group_tokens[r];
      work[r] = group_work[r] + whole[r];
      over = over || needed[r] < 0;
    }
    if (over) break;
    equalized = placement;  // reuses last pass's buffers
    EqualizeWholeDocs(batch, needed, equalized, work, attempt,
                      WholeDocOptions{lpt_rho, true, m, 4 * m}, scratch);
    AppendHeldWhole(batch, equalized, attempt);
    const double peak = *std::max_element(work.begin(), work.end());
    if (peak < best_max) {
      best_max = peak;
      out.resize(out_size);
      out.insert(out.end(), attempt.begin(), attempt.end());
    }
    if (peak <= options.max_work) break;  // within R: no pass does better
    // A pass is a function of `moved` alone: where it comes back the same,
    // every later pass repeats this one.
    bool same = true;
    for (int32_t r = 0; r < n; ++r) {
      const double next = work[r] - group_work[r] - whole[r];
      same = same && next == moved[r];
      moved[r] = next;
    }
    if (same) break;
  }
  return best_max < std::numeric_limits<double>::infinity();
}

absl::Status KvGroupCandidates(const Batch& batch, const FlashCpOptions& options,
                               const RankBand& /*band*/, const StageAtN& at,
                               CandidateJudge& judge) {
  const size_t count = std::min(at.variants, std::size(kKvGroupParams));
  for (size_t v = 0; v < count; ++v) {
    FLASHCP_RETURN_IF_ERROR(options.CheckStop());
    std::vector<Shard> pieces;
    if (KvGroupPieces(batch, options, kKvGroupParams[v], pieces)) judge.Offer(pieces);
  }
  return absl::OkStatus();
}

}  // namespace flashcp::core::internal
