// flashcp's grouped stage (flashcp_grouped.h).
#include "core/internal/flashcp_grouped.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "core/internal/flashcp_repair.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
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

bool GroupDocuments(const Batch& batch, const std::vector<int32_t>& order, double group_bound,
                    int64_t m, int32_t ranks_per_node, double small_share, Groups& groups) {
  const bool filled = small_share > 0;
  const int32_t n = batch.cp_size;
  const int32_t per_node = ranks_per_node <= 0 ? n : ranks_per_node;
  std::vector<Shard>& out = groups.pieces;
  std::vector<int64_t>& room = groups.room;
  std::vector<double>& workload = groups.workload;
  out.clear();
  room = RankTargets(batch);
  workload.assign(n, 0.0);
  std::vector<int32_t> ranks(n), group, node_order, kept, moved;
  group.reserve(n);  // a group has at most N ranks: allocated once
  std::vector<double> load(n);
  // Beyond 16 ranks `ranks` stays sorted from one document to the next
  // (below, sorting afresh costs as little): `sorted_for` is the projection
  // it was sorted at (NaN: not yet), `changed` the ranks whose pairs or room
  // changed since (flagged in is_changed).
  const bool keep_order = BandOf(n).keep_rank_order;
  double sorted_for = std::numeric_limits<double>::quiet_NaN();
  std::vector<int32_t> changed;
  std::vector<char> is_changed(keep_order ? n : 0, 0);
  const auto change = [&](int32_t r) {
    if (keep_order && !is_changed[r]) {
      is_changed[r] = 1;
      changed.push_back(r);
    }
  };
  std::vector<std::vector<int32_t>> by_node((n + per_node - 1) / per_node);
  // filled: the documents of more than small_share x group_bound pairs
  // (a prefix of `order`) are placed one by one, the rest (`small` on) by
  // WholeDocPieces; a rank's load is projected as its pairs plus its free
  // tokens at the small documents' density (pairs per token), what
  // filling it with them adds.
  size_t small = order.size();
  double density = 0;
  if (filled) {
    small = 0;
    double small_work = 0, small_tokens = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t l = batch.doc_lens[order[i]];
      if (RangeWorkload(0, l) > small_share * group_bound) {
        small = i + 1;
        small_work = small_tokens = 0;
      } else {
        small_work += RangeWorkload(0, l);
        small_tokens += static_cast<double>(l);
      }
    }
    density = small_tokens > 0 ? small_work / small_tokens : 0.0;
  }
  double projection = density;
  const auto projected = [&](double pairs, int64_t free_tokens) {
    return pairs + projection * static_cast<double>(std::max<int64_t>(0, free_tokens));
  };
  size_t k = 0;
  for (; k < order.size(); ++k) {
    const int32_t d = order[k];
    const int64_t len = batch.doc_lens[d];
    const double whole = RangeWorkload(0, len);
    if (filled) {
      if (k >= small) break;  // this and the rest: WholeDocPieces
      // Whole on the rank of least projected load with room for it, if it
      // keeps that rank within the bound.
      projection = density;
      int32_t best = -1;
      for (int32_t r = 0; r < n; ++r) {
        if (room[r] >= len && (best < 0 || projected(workload[r], room[r]) <
                                               projected(workload[best], room[best]))) {
          best = r;
        }
      }
      if (best >= 0 && projected(workload[best] + whole, room[best] - len) <= group_bound) {
        out.push_back(Shard{d, 0, len, best});
        room[best] -= len;
        workload[best] += whole;
        change(best);
        continue;
      }
    } else {
      const int64_t most_room = *std::max_element(room.begin(), room.end());
      if (whole <= group_bound && len <= most_room) break;  // this and the rest stay whole
    }
    int32_t c = n + 1;
    // filled: with the projection, else (no such group) without it.
    const double projections[2] = {density, 0.0};
    for (int32_t t = 0; t < (density > 0 ? 2 : 1) && c > n; ++t) {
      projection = projections[t];
      // The least-loaded ranks first (ties: more room, then lower index).
      // Each rank's projected load, computed once for the sort.
      for (int32_t r = 0; r < n; ++r) load[r] = projected(workload[r], room[r]);
      const auto before = [&](int32_t a, int32_t b) {
        if (load[a] != load[b]) return load[a] < load[b];
        if (room[a] != room[b]) return room[a] > room[b];
        return a < b;
      };
      // A total order: the sorted `ranks` is the same however it is made.
      // Sorted at this projection before, only the changed ranks moved: the
      // rest keep their order, and the changed ones, sorted, merge in (where
      // they are few enough for that to be cheaper than a sort).
      if (!keep_order || projection != sorted_for || 4 * changed.size() >= ranks.size()) {
        std::iota(ranks.begin(), ranks.end(), 0);
        std::sort(ranks.begin(), ranks.end(), before);
        sorted_for = projection;
      } else if (!changed.empty()) {
        ResortChangedRanks(ranks, is_changed, before, kept, moved);
      }
      for (int32_t r : changed) is_changed[r] = 0;
      changed.clear();
      c = std::max<int32_t>(2, static_cast<int32_t>(std::ceil(whole / group_bound)));
      // A rank r fits a group of c only if P_r + (W - rho L) / c - 2 rho <=
      // group_bound (P_r its projected load, rho the projection: a share has
      // at most L / c + 2 tokens), i.e. c >= (W - rho L) / (group_bound -
      // P_r + 2 rho), which grows along `ranks`; so c ranks fit only if the
      // c-th does at c. Smaller c are skipped (the same group, found
      // sooner).
      const double excess = whole - projection * static_cast<double>(len);
      if (excess > 0) {
        for (; c <= n; ++c) {
          const int32_t r = ranks[c - 1];
          const double slack = group_bound - projected(workload[r], room[r]) + 2 * projection;
          if (slack > 0 && excess <= slack * c) break;
        }
      }
      for (; c <= n; ++c) {
        // Rank p of the group takes chunks p and 2c-1-p of 2c near-equal
        // chunks: at most 2 * ceil(L / 2c) tokens and about W / c pairs,
        // which must keep it within group_bound (groups of earlier documents
        // included).
        const int64_t share = 2 * ((len + 2 * c - 1) / (2 * c));
        const double add = whole / c;
        const auto fits = [&](int32_t r) {
          return room[r] >= share && projected(workload[r] + add, room[r] - share) <= group_bound;
        };
        // Within one node where one has c such ranks: the node of the
        // least-loaded rank that has them (its c least loaded), else any.
        group.clear();
        if (c <= per_node && per_node < n) {
          for (std::vector<int32_t>& list : by_node) list.clear();
          node_order.clear();
          for (int32_t r : ranks) {
            if (!fits(r)) continue;
            std::vector<int32_t>& list = by_node[r / per_node];
            if (list.empty()) node_order.push_back(r / per_node);
            list.push_back(r);
          }
          for (int32_t node : node_order) {
            if (static_cast<int32_t>(by_node[node].size()) >= c) {
              group.assign(by_node[node].begin(), by_node[node].begin() + c);
              break;
            }
          }
          if (static_cast<int32_t>(group.size()) == c) break;
        }
        for (int32_t r : ranks) {
          if (fits(r)) group.push_back(r);
          if (static_cast<int32_t>(group.size()) == c) break;
        }
        if (static_cast<int32_t>(group.size()) == c) break;
      }
    }
    if (c > n) return false;
    const int64_t base = len / (2 * c), extra = len % (2 * c);
    if (m > 1 && base < m) return false;
    int64_t start = 0;
    for (int32_t chunk = 0; chunk < 2 * c; ++chunk) {
      const int64_t size = base + (chunk < extra ? 1 : 0);
      const int32_t r = group[chunk < c ? chunk : 2 * c - 1 - chunk];
      out.push_back(Shard{d, start, size, r});
      room[r] -= size;
      workload[r] += RangeWorkload(start, size);
      change(r);
      start += size;
    }
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
