// flashcp's grouped stage (flashcp_grouped.h).
#include "core/internal/flashcp_grouped.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "core/internal/flashcp_pieces.h"
#include "core/internal/flashcp_slivers.h"
#include "core/internal/strategies_internal.h"
#include "core/internal/whole_doc_place.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {

namespace {

// GroupedPieces before Whole-Doc (which alone depends on rho): the groups'
// (and, filled, the whole documents') pieces, the ranks' room and
// workload after them, and the rest of `order`.
struct Groups {
  std::vector<Shard> pieces;
  std::vector<int64_t> room;
  std::vector<double> workload;
  std::vector<int32_t> rest_docs;  // the documents left to Whole-Doc: `order`'s rest
};

// GroupDocuments' deal: its state, and each step a named member.
class GroupDealer {
 public:
  GroupDealer(const Batch& batch, double group_bound, int64_t m, int32_t ranks_per_node,
              Groups& groups)
      : batch_(batch),
        n_(batch.cp_size),
        per_node_(ranks_per_node <= 0 ? n_ : ranks_per_node),
        bound_(group_bound),
        m_(m),
        out_(groups.pieces),
        room_(groups.room),
        workload_(groups.workload),
        ranks_(n_),
        load_(n_),
        keep_order_(BandOf(n_).keep_rank_order),
        is_changed_(keep_order_ ? n_ : 0, 0),
        by_node_((n_ + per_node_ - 1) / per_node_) {
    out_.clear();
    room_ = RankTargets(batch);
    workload_.assign(n_, 0.0);
    group_.reserve(n_);  // a group has at most N ranks: allocated once
  }

  // Filled: the documents of more than small_share x the bound (a prefix of
  // `order`) are placed one by one, the rest by WholeDocPieces; a rank's
  // load is projected as its pairs plus its free tokens at the small
  // documents' density (pairs per token), what filling it with them adds.
  // Returns where the small documents start in `order`.
  size_t FindSmall(const std::vector<int32_t>& order, double small_share) {
    size_t small = 0;
    double small_work = 0, small_tokens = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t l = batch_.doc_lens[order[i]];
      if (RangeWorkload(0, l) > small_share * bound_) {
        small = i + 1;
        small_work = small_tokens = 0;
      } else {
        small_work += RangeWorkload(0, l);
        small_tokens += static_cast<double>(l);
      }
    }
    density_ = small_tokens > 0 ? small_work / small_tokens : 0.0;
    return small;
  }

  // Filled: document d whole on the rank of least projected load with room
  // for it, if that keeps the rank within the bound; whether it went there.
  bool PlaceWhole(int32_t d) {
    const int64_t len = batch_.doc_lens[d];
    projection_ = density_;
    int32_t best = -1;
    for (int32_t r = 0; r < n_; ++r) {
      if (room_[r] >= len && (best < 0 || Projected(workload_[r], room_[r]) <
                                              Projected(workload_[best], room_[best]))) {
        best = r;
      }
    }
    if (best < 0 ||
        Projected(workload_[best] + RangeWorkload(0, len), room_[best] - len) > bound_) {
      return false;
    }
    out_.push_back(Shard{d, 0, len, best});
    room_[best] -= len;
    workload_[best] += RangeWorkload(0, len);
    Change(best);
    return true;
  }

  // Unfilled: whether document d stays whole (and so every later one).
  bool StaysWhole(int32_t d) const {
    const int64_t len = batch_.doc_lens[d];
    const int64_t most_room = *std::max_element(room_.begin(), room_.end());
    return RangeWorkload(0, len) <= bound_ && len <= most_room;
  }

  // Document d zigzagged over a group (filled: found with the projection,
  // else without it); false where no group fits or its chunks would be
  // shorter than m.
  bool Zigzag(int32_t d) {
    const int64_t len = batch_.doc_lens[d];
    int32_t c = n_ + 1;
    const double projections[2] = {density_, 0.0};
    for (int32_t t = 0; t < (density_ > 0 ? 2 : 1) && c > n_; ++t) {
      projection_ = projections[t];
      SortRanks();
      c = FindGroup(len);
    }
    if (c > n_) return false;
    const int64_t base = len / (2 * c), extra = len % (2 * c);
    if (m_ > 1 && base < m_) return false;
    int64_t start = 0;
    for (int32_t chunk = 0; chunk < 2 * c; ++chunk) {
      const int64_t size = base + (chunk < extra ? 1 : 0);
      const int32_t r = group_[chunk < c ? chunk : 2 * c - 1 - chunk];
      out_.push_back(Shard{d, start, size, r});
      room_[r] -= size;
      workload_[r] += RangeWorkload(start, size);
      Change(r);
      start += size;
    }
    return true;
  }

 private:
  double Projected(double pairs, int64_t free_tokens) const {
    return pairs + projection_ * static_cast<double>(std::max<int64_t>(0, free_tokens));
  }

  // Beyond the band's size `ranks_` stays sorted from one document to the
  // next (below, sorting afresh costs as little): sorted_for_ is the
  // projection it was sorted at (NaN: not yet), changed_ the ranks whose
  // pairs or room changed since (flagged in is_changed_).
  void Change(int32_t r) {
    if (keep_order_ && !is_changed_[r]) {
      is_changed_[r] = 1;
      changed_.push_back(r);
    }
  }

  // The least-loaded ranks first (ties: more room, then lower index), each
  // rank's projected load computed once for the sort. A total order: the
  // sorted `ranks_` is the same however it is made. Sorted at this
  // projection before, only the changed ranks moved: the rest keep their
  // order, and the changed ones, sorted, merge in (where they are few
  // enough for that to be cheaper than a sort).
  void SortRanks() {
    for (int32_t r = 0; r < n_; ++r) load_[r] = Projected(workload_[r], room_[r]);
    const auto before = [&](int32_t a, int32_t b) {
      if (load_[a] != load_[b]) return load_[a] < load_[b];
      if (room_[a] != room_[b]) return room_[a] > room_[b];
      return a < b;
    };
    if (!keep_order_ || projection_ != sorted_for_ || 4 * changed_.size() >= ranks_.size()) {
      std::iota(ranks_.begin(), ranks_.end(), 0);
      std::sort(ranks_.begin(), ranks_.end(), before);
      sorted_for_ = projection_;
    } else if (!changed_.empty()) {
      ResortChangedRanks(ranks_, is_changed_, before, kept_, moved_);
    }
    for (int32_t r : changed_) is_changed_[r] = 0;
    changed_.clear();
  }

  // The group size c (n_ + 1: none) and its ranks in group_ for a document
  // of `len` tokens, over the sorted ranks.
  int32_t FindGroup(int64_t len) {
    const double whole = RangeWorkload(0, len);
    int32_t c = std::max<int32_t>(2, static_cast<int32_t>(std::ceil(whole / bound_)));
    // A rank r fits a group of c only if P_r + (W - rho L) / c - 2 rho <=
    // group_bound (P_r its projected load, rho the projection: a share has
    // at most L / c + 2 tokens), i.e. c >= (W - rho L) / (group_bound - P_r
    // + 2 rho), which grows along `ranks_`; so c ranks fit only if the c-th
    // does at c. Smaller c are skipped (the same group, found sooner).
    const double excess = whole - projection_ * static_cast<double>(len);
    if (excess > 0) {
      for (; c <= n_; ++c) {
        const int32_t r = ranks_[c - 1];
        const double slack = bound_ - Projected(workload_[r], room_[r]) + 2 * projection_;
        if (slack > 0 && excess <= slack * c) break;
      }
    }
    for (; c <= n_; ++c) {
      if (GroupOf(c, len, whole)) break;
    }
    return c;
  }

  // Whether c ranks can take the document (len tokens, `whole` pairs): rank
  // p of the group takes chunks p and 2c-1-p of 2c near-equal chunks, at
  // most 2 ceil(L / 2c) tokens and about W / c pairs, which must keep it
  // within the bound (groups of earlier documents included). Within one
  // node where one has c such ranks: the node of the least-loaded rank that
  // has them (its c least loaded), else any. The ranks into group_.
  bool GroupOf(int32_t c, int64_t len, double whole) {
    const int64_t share = 2 * ((len + 2 * c - 1) / (2 * c));
    const double add = whole / c;
    const auto fits = [&](int32_t r) {
      return room_[r] >= share && Projected(workload_[r] + add, room_[r] - share) <= bound_;
    };
    group_.clear();
    if (c <= per_node_ && per_node_ < n_) {
      for (std::vector<int32_t>& list : by_node_) list.clear();
      node_order_.clear();
      for (int32_t r : ranks_) {
        if (!fits(r)) continue;
        std::vector<int32_t>& list = by_node_[r / per_node_];
        if (list.empty()) node_order_.push_back(r / per_node_);
        list.push_back(r);
      }
      for (int32_t node : node_order_) {
        if (static_cast<int32_t>(by_node_[node].size()) >= c) {
          group_.assign(by_node_[node].begin(), by_node_[node].begin() + c);
          break;
        }
      }
      if (static_cast<int32_t>(group_.size()) == c) return true;
    }
    for (int32_t r : ranks_) {
      if (fits(r)) group_.push_back(r);
      if (static_cast<int32_t>(group_.size()) == c) break;
    }
    return static_cast<int32_t>(group_.size()) == c;
  }

  const Batch& batch_;
  const int32_t n_;
  const int32_t per_node_;
  const double bound_;
  const int64_t m_;
  std::vector<Shard>& out_;
  std::vector<int64_t>& room_;
  std::vector<double>& workload_;
  std::vector<int32_t> ranks_, group_, node_order_, kept_, moved_;
  std::vector<double> load_;
  const bool keep_order_;
  double sorted_for_ = std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> changed_;
  std::vector<char> is_changed_;
  std::vector<std::vector<int32_t>> by_node_;
  double density_ = 0;
  double projection_ = 0;
};

bool GroupDocuments(const Batch& batch, const std::vector<int32_t>& order, double group_bound,
                    int64_t m, int32_t ranks_per_node, double small_share, Groups& groups) {
  const bool filled = small_share > 0;
  GroupDealer dealer(batch, group_bound, m, ranks_per_node, groups);
  const size_t small = filled ? dealer.FindSmall(order, small_share) : order.size();
  size_t k = 0;
  for (; k < order.size(); ++k) {
    const int32_t d = order[k];
    if (filled) {
      if (k >= small) break;  // this and the rest: WholeDocPieces
      if (dealer.PlaceWhole(d)) continue;
    } else if (dealer.StaysWhole(d)) {
      break;  // this and the rest stay whole
    }
    if (!dealer.Zigzag(d)) return false;
  }
  groups.rest_docs.assign(order.begin() + static_cast<std::ptrdiff_t>(k), order.end());
  return true;
}

// The buffers one grouped candidate needs, reused by the next.
struct CandidateScratch {
  WholeDocScratch whole_doc;
  std::vector<int64_t> room;
  RepairScratch repair;
};

// `groups` completed with the rest Whole-Doc at `rho`: GroupedPieces' pieces
// in `pieces`, and in `workload` each rank's workload as placed (the groups',
// then WholeDocPieces' updates): the sum of its pieces' workloads.
void WithWholeRest(const Batch& batch, const Groups& groups, double rho, int64_t m,
                   CandidateScratch& scratch, std::vector<Shard>& pieces,
                   std::vector<double>& workload) {
  pieces = groups.pieces;
  scratch.room = groups.room;
  workload = groups.workload;
  WholeDocPieces(batch, groups.rest_docs, scratch.room, workload, pieces,
                 WholeDocOptions{rho, true, m, 4 * m}, scratch.whole_doc);
}

// Whether some piece of a cut document (0 < len < its document's) is
// shorter than m: where none is, no shard FinishPlan merges them into is
// (merging only joins pieces), so RepairSlivers has no sliver to fix.
bool HasShortCutPiece(const Batch& batch, const std::vector<Shard>& pieces, int64_t m) {
  return std::any_of(pieces.begin(), pieces.end(), [&](const Shard& s) {
    return s.len > 0 && s.len < m && s.len < batch.doc_lens[s.doc];
  });
}

}  // namespace

std::vector<std::pair<double, double>> GroupedVariants(int32_t n) {
  std::vector<std::pair<double, double>> variants;
  if (BandOf(n).filled_groups) {
    variants.assign(kFilledGroups.begin(), kFilledGroups.end());
  } else {
    for (double bound : kGroupBounds) variants.emplace_back(bound, 0.0);
  }
  return variants;
}

bool GroupedPieces(const Batch& batch, const std::vector<int32_t>& order, double group_bound,
                   double rho, int64_t m, int32_t ranks_per_node, double small_share,
                   std::vector<Shard>& out, std::vector<double>* workload) {
  Groups groups;
  if (!GroupDocuments(batch, order, group_bound, m, ranks_per_node, small_share, groups)) {
    return false;
  }
  CandidateScratch scratch;
  std::vector<Shard> pieces;
  std::vector<double> tracked;
  WithWholeRest(batch, groups, rho, m, scratch, pieces, tracked);
  out.insert(out.end(), pieces.begin(), pieces.end());
  if (workload != nullptr) *workload = std::move(tracked);
  return true;
}

absl::Status GroupedCandidates(const Batch& batch, const FlashCpOptions& options,
                               const RankBand& /*band*/, const StageAtN& at,
                               CandidateJudge& judge) {
  const int32_t n = batch.cp_size;
  const int64_t m = options.min_shard;
  std::vector<std::pair<double, double>> variants = GroupedVariants(n);
  if (variants.size() > at.variants) variants.resize(at.variants);
  Groups groups;
  CandidateScratch scratch;  // reused by every candidate
  std::vector<double> workload;
  // A buffer: WithWholeRest overwrites it; the judge hands back the last
  // candidate's (none where that won).
  std::vector<Shard> pieces;
  for (const auto& [bound, small_share] : variants) {
    FLASHCP_RETURN_IF_ERROR(options.CheckStop());
    // The groups do not depend on the scale: found once per variant.
    if (!GroupDocuments(batch, options.order, bound * options.target * options.mean_work, m,
                        options.ranks_per_node, small_share, groups)) {
      continue;
    }
    for (double scale : kScales) {
      FLASHCP_RETURN_IF_ERROR(options.CheckStop());
      WithWholeRest(batch, groups, scale * options.median_density, m, scratch, pieces,
                    workload);
      // Without a short cut piece RepairSlivers would return FinishPlan's
      // shards unchanged. The repair may lower the maximum: its pieces'
      // workload is summed again.
      if (m > 1 && HasShortCutPiece(batch, pieces, m)) {
        pieces = RepairSlivers(batch, std::move(pieces), m, options.max_work, kAnyNonlastGrowth,
                               scratch.repair);
        workload = PieceWorkloads(n, pieces);
      }
      judge.Offer(pieces, &workload);
    }
  }
  return absl::OkStatus();
}

}  // namespace flashcp::core::internal
