// flashcp's objective (docs/planner.md, "Least KV moved"): of the plans that
// meet the imbalance target, one that moves less in one phase under its
// cheaper exchange (the compacted all-gather or the targeted one). Two kinds
// of candidate compete:
//  - the compacted planner's plan (PlanFlashCpCompacted, flashcp.cc), which
//    spreads the longest documents over all N ranks in 2N zigzag pieces: the
//    fewest non-last tokens per rank, so the least all-gather;
//  - grouped plans: each document too heavy to keep whole is zigzagged over
//    the smallest group of the least-loaded ranks that carry its workload
//    within a bound, so that groups of different documents seldom share a
//    rank (BASP's batch-aware grouping, ../shared/paper); the rest are placed
//    whole by workload and equalized by heads (WholeDocPieces). A rank then
//    receives about one document's prefix, not a share of every long
//    document's, and sends its pieces to c - 1 ranks, not N - 1. A group's
//    rank p takes chunks p and 2c-1-p, so the head and the tail share a rank
//    (the one that needs the longest prefix needs no head from elsewhere).
// A grouped plan replaces the compacted one only where it meets the target,
// adds no sliver, moves less under its cheaper exchange and, at N <= 8, no
// more under the all-gather: where the all-gather is the exchange to use,
// it does not get worse. Beyond 8 ranks the all-gather is not held to the
// compacted plan's (the plan's cheaper_scheme says which exchange to run).
// Beyond 8 ranks a grouped candidate within 1.05 R that would move less is
// first balanced by exchanges of whole documents (flashcp_roles.h). Where
// no grouped plan balances, the compacted plan stands.
// Last, the winner's roles are swapped (flashcp_roles.h): which of a cut
// document's ranks holds which of its pieces, so that the heads and tails
// of different documents land on different ranks; then beyond 8 ranks
// chunk-heap candidates compete with it (flashcp_kv.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/analysis.h"
#include "core/internal/flashcp_kv.h"
#include "core/internal/flashcp_roles.h"
#include "core/internal/flashcp_util.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

// One phase's bytes in tokens under the cheaper of the two sharding-aware
// exchanges (full KV never moves less than the compacted all-gather).
struct Exchange {
  int64_t allgather = 0;  // max non-last tokens x (N - 1)
  int64_t targeted = 0;   // max over ranks of max(send, receive)
  int64_t cheaper() const { return std::min(allgather, targeted); }
};

Exchange Measure(const Plan& plan, const PlanScore& score) {
  return Exchange{score.max_nonlast * (plan.cp_size - 1), TargetedPhaseBottleneck(plan)};
}

// The grouped pieces of one variant: documents whose whole workload exceeds
// `group_bound` (longest first; so a prefix of `order`) zigzagged over
// groups (the fewest least-loaded ranks that each take their share within
// `group_bound` pairs and their room), the rest Whole-Doc with `rho`. False
// where some group cannot be found or its zigzag chunks would be shorter
// than `m`.
bool GroupedPieces(const Batch& batch, const std::vector<int32_t>& order, double group_bound,
                   double rho, int64_t m, int32_t ranks_per_node, std::vector<Shard>& out) {
  const int32_t n = batch.cp_size;
  const int32_t per_node = ranks_per_node <= 0 ? n : ranks_per_node;
  std::vector<int64_t> room = RankTargets(batch);
  std::vector<double> workload(n, 0.0);
  std::vector<int32_t> ranks(n), group, node_order;
  std::vector<std::vector<int32_t>> by_node((n + per_node - 1) / per_node);
  size_t k = 0;
  for (; k < order.size(); ++k) {
    const int32_t d = order[k];
    const int64_t len = batch.doc_lens[d];
    const double whole = RangeWorkload(0, len);
    const int64_t most_room = *std::max_element(room.begin(), room.end());
    if (whole <= group_bound && len <= most_room) break;  // this and the rest stay whole
    // The least-loaded ranks first (ties: more room, then lower index).
    std::iota(ranks.begin(), ranks.end(), 0);
    std::sort(ranks.begin(), ranks.end(), [&](int32_t a, int32_t b) {
      if (workload[a] != workload[b]) return workload[a] < workload[b];
      if (room[a] != room[b]) return room[a] > room[b];
      return a < b;
    });
    int32_t c = std::max<int32_t>(2, static_cast<int32_t>(std::ceil(whole / group_bound)));
    group.clear();
    for (; c <= n; ++c) {
      // Rank p of the group takes chunks p and 2c-1-p of 2c near-equal chunks:
      // at most 2 * ceil(L / 2c) tokens and about W / c pairs, which must
      // keep it within group_bound (groups of earlier documents included).
      const int64_t share = 2 * ((len + 2 * c - 1) / (2 * c));
      const double add = whole / c;
      const auto fits = [&](int32_t r) {
        return room[r] >= share && workload[r] + add <= group_bound;
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
      start += size;
    }
  }
  const std::vector<int32_t> rest(order.begin() + static_cast<std::ptrdiff_t>(k), order.end());
  WholeDocPieces(batch, rest, room, workload, out, WholeDocOptions{rho, true, m, 4 * m});
  return true;
}

}  // namespace

absl::StatusOr<Plan> PlanFlashCp(const Batch& batch, const PlanOptions& options) {
  FLASHCP_ASSIGN_OR_RETURN(Plan best, PlanFlashCpCompacted(batch, options));
  const int32_t n = batch.cp_size;
  if (n <= 2) return best;  // at N = 2 a cut document moves the same either way
  const double target = options.target_imbalance;
  const int64_t m = options.min_shard_tokens;
  const std::vector<int32_t> order = DocsLongestFirst(batch);
  double total_work = 0;
  for (int64_t len : batch.doc_lens) total_work += RangeWorkload(0, len);
  const double mean_work = total_work / n;
  const double median_density =
      (static_cast<double>(batch.doc_lens[order[order.size() / 2]]) + 1.0) / 2.0;

  PlanScore best_score = ScorePlan(best);
  if (best_score.cut_docs == 0) return best;  // nothing is exchanged to begin with
  // Role swaps: at most kSwapsPerRank x N per plan (each O(roles of the
  // bottleneck rank x ranks of their documents)).
  constexpr int32_t kSwapsPerRank = 1;
  const int32_t max_swaps = kSwapsPerRank * n;
  Exchange best_exchange = Measure(best, best_score);
  const Exchange compacted = best_exchange;
  const Plan compacted_plan = best;
  // Group bounds as fractions of R * mean (a smaller bound: larger groups,
  // better balance, more to move) and the Whole-Doc rho scales of the
  // compacted planner.
  static constexpr double kBounds[] = {1.0, 0.85, 0.7, 0.55};
  static constexpr double kScales[] = {0.0, 0.5, 1.0, 2.0};
  constexpr int32_t kPartners = 4;  // lightest ranks a balancing exchange tries
  constexpr double kBalanceReach = 1.05;  // imbalance / R a candidate is balanced from
  // Balancing moves per plan (each call up to 2N): 16 calls at N = 16, 4 at 64.
  constexpr int32_t kBalanceMoves = 512;
  const int32_t max_balanced = std::max<int32_t>(1, kBalanceMoves / (2 * n));
  int32_t balanced = 0;
  std::vector<Shard> pieces;
  bool grouped = false;  // a grouped plan replaced the compacted one
  for (double bound : kBounds) {
    for (double scale : kScales) {
      FLASHCP_RETURN_IF_ERROR(options.stop.Check());
      pieces.clear();
      if (!GroupedPieces(batch, order, bound * target * mean_work, scale * median_density, m,
                         options.ranks_per_node, pieces)) {
        break;  // the same groups fail at every scale
      }
      if (m > 1) pieces = RepairShortShards(batch, std::move(pieces), m, target * mean_work);
      Plan plan = FinishPlan(batch, std::move(pieces));
      pieces = {};
      PlanScore score = ScorePlan(plan);
      // Over the target: balanced below beyond 8 ranks if within reach.
      if (score.imbalance > (n > 8 ? kBalanceReach : 1.0) * target) continue;
      Exchange exchange = Measure(plan, score);
      // Less moved under the cheaper exchange, and (N <= 8) never more
      // under the all-gather than the compacted plan.
      const auto moves_less = [&](const Exchange& e) {
        return e.cheaper() < best_exchange.cheaper() &&
               (n > 8 || e.allgather <= compacted.allgather);
      };
      if (!moves_less(exchange)) continue;
      if (score.imbalance > target) {
        // A little over the target: balancing exchanges (flashcp_roles.h),
        // which add only the heads they cut. Beyond 8 ranks only, within
        // kBalanceMoves moves (each O(partners x whole documents per
        // rank^2)): the planning-time budget.
        if (balanced == max_balanced) continue;
        ++balanced;
        plan = BalanceByWholeExchanges(batch, plan, target * mean_work, kPartners, 2 * n, m);
        score = ScorePlan(plan);
        if (score.imbalance > target) continue;
        exchange = Measure(plan, score);
        if (!moves_less(exchange)) continue;
      }
      if (m > 1 && score.min_cut_len != 0 && score.min_cut_len < m) continue;
      best = std::move(plan);
      best_score = score;
      best_exchange = exchange;
      grouped = true;
    }
  }
  // The winner's roles swapped; where a grouped plan won, the compacted
  // one's too, and the one moving less under its cheaper exchange (then
  // under the all-gather) is kept.
  Plan swapped = SwapRolesForTargeted(batch, best, target * mean_work, max_swaps);
  if (grouped) {
    Plan other = SwapRolesForTargeted(batch, compacted_plan, target * mean_work, max_swaps);
    const Exchange a = Measure(swapped, ScorePlan(swapped));
    const Exchange b = Measure(other, ScorePlan(other));
    if (b.cheaper() < a.cheaper() || (b.cheaper() == a.cheaper() && b.allgather < a.allgather)) {
      swapped = std::move(other);
    }
  }
  return PreferLeastKv(batch, options, std::move(swapped));
}

}  // namespace flashcp::core::internal
