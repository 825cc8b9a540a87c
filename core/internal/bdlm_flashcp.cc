// flashcp under the block-diffusion mask (docs/bdlm.md, "flashcp"). Why the
// causal plan is the skeleton: a clean token at position i costs about
// i + b/2 pairs and its noisy twin about the same, so a rank holding both
// copies of the tokens a causal plan gives it costs about twice their
// causal pairs plus b/2 per token, and equal tokens per rank make that
// balance follow the causal one. The clean K/V a rank needs is then the
// causal prefix of its furthest shard (rounded up to a block), so short
// documents stay whole and move nothing, as under the causal mask. The
// stages reuse flashcp's causal planner through its header only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/internal/bdlm.h"
#include "core/internal/strategies_internal.h"
#include "core/mask.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

struct Score {
  double imbalance = 0;
  int64_t traffic = 0;  // the cheaper sharding-aware scheme's phase bottleneck, tokens
};

// Imbalance on the mask's workload and the lesser of the compacted
// all-gather's and the targeted exchange's phase bottleneck (AnalyzePlan's
// counts, without the bytes).
Score ScorePlan(const Plan& plan) {
  const int32_t n = plan.cp_size;
  std::vector<double> w(n, 0.0);
  for (const Shard& s : plan.shards) w[s.rank] += MaskedShardWorkload(plan, s);
  double total = 0, max_w = 0;
  for (double x : w) {
    total += x;
    max_w = std::max(max_w, x);
  }
  const MaskTraffic t = ComputeMaskTraffic(plan);
  int64_t targeted = 0, gather = 0;
  for (int32_t r = 0; r < n; ++r) {
    targeted = std::max({targeted, t.sent_tokens[r], t.received_tokens[r]});
    gather = std::max(gather, t.needed_elsewhere_tokens[r]);
  }
  Score s;
  s.imbalance = total > 0 ? max_w / (total / n) : 1.0;
  s.traffic = std::min(targeted, gather * (n - 1));
  return s;
}

// Both copies of every causal shard on its rank, then single tokens moved
// from ranks above their 2C/N to ranks below (the doubled causal counts
// differ from 2C/N by at most one token per rank where N does not divide C):
// preferably a one-token document's clean copy (it needs no other K/V), else
// the first token of the clean copy of the shortest document a rank holds
// from its start (its block's other tokens, fewer than b, then travel).
std::vector<Shard> CoLocate(const Batch& batch, const Plan& causal) {
  const int32_t n = batch.cp_size;
  const int32_t docs = static_cast<int32_t>(batch.doc_lens.size());
  std::vector<Shard> pieces;
  pieces.reserve(2 * causal.shards.size() + 2 * n);
  for (const Shard& s : causal.shards) pieces.push_back(s);
  for (const Shard& s : causal.shards) pieces.push_back(Shard{s.doc + docs, s.start, s.len, s.rank});
  const int64_t total = 2 * TotalTokens(batch.doc_lens);
  std::vector<int64_t> delta(n, 0);  // held minus target
  for (const Shard& s : pieces) delta[s.rank] += s.len;
  for (int32_t r = 0; r < n; ++r) delta[r] -= RankRealTokens(total, n, r);
  int32_t to = 0;
  for (int32_t from = 0; from < n; ++from) {
    while (delta[from] > 0) {
      while (delta[to] >= 0) ++to;  // the surpluses and deficits sum to 0
      // Lower is cheaper: a one-token document first, then shorter ones.
      const auto key = [&](const Shard& s) {
        const int64_t len = batch.doc_lens[s.doc - docs];
        return std::make_pair(len != 1, len);
      };
      int64_t best = -1;
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Shard& s = pieces[i];
        if (s.rank != from || s.doc < docs || s.start != 0 || s.len < 1) continue;
        if (batch.doc_lens[s.doc - docs] != 1 && s.len < 2) continue;
        if (best < 0 || key(s) < key(pieces[best])) best = static_cast<int64_t>(i);
      }
      if (best < 0) {
        // No clean copy held from its start: any piece's first token.
        for (size_t i = 0; i < pieces.size() && best < 0; ++i) {
          if (pieces[i].rank == from && pieces[i].len >= 1) best = static_cast<int64_t>(i);
        }
      }
      Shard& s = pieces[best];
      pieces.push_back(Shard{s.doc, s.start, 1, to});
      ++s.start;
      --s.len;
      --delta[from];
      ++delta[to];
    }
  }
  return pieces;
}

// Moves each noisy cut inside a block to the nearer block boundary the two
// shards allow, moving the clean cut of the same document and ranks the
// other way by as many tokens, so that both ranks keep their token counts:
// the noisy block then sits on one rank, and a clean block is cut instead
// (its earlier part needs the rest of the block, fewer than b tokens).
std::vector<Shard> SnapNoisyCuts(const Plan& plan) {
  const int64_t b = plan.mask.block_size;
  const int32_t docs = static_cast<int32_t>(plan.doc_lens.size() / 2);
  std::vector<Shard> pieces = plan.shards;
  std::vector<std::vector<int32_t>> by_doc(plan.doc_lens.size());
  for (size_t i = 0; i < pieces.size(); ++i) by_doc[pieces[i].doc].push_back(static_cast<int32_t>(i));
  for (auto& v : by_doc) {
    std::sort(v.begin(), v.end(), [&](int32_t a, int32_t c) { return pieces[a].start < pieces[c].start; });
  }
  for (int32_t d = 0; d < docs; ++d) {
    const std::vector<int32_t>& noisy = by_doc[d];
    const std::vector<int32_t>& clean = by_doc[d + docs];
    for (size_t k = 1; k < noisy.size(); ++k) {
      Shard& p = pieces[noisy[k - 1]];
      Shard& q = pieces[noisy[k]];
      const int64_t x = q.start;
      if (x % b == 0 || p.len == 0 || q.len == 0) continue;
      // The clean cut at x between the same two ranks, if the plan has it.
      int32_t cp = -1, cq = -1;
      for (size_t c = 1; c < clean.size(); ++c) {
        const Shard& a = pieces[clean[c - 1]];
        const Shard& e = pieces[clean[c]];
        if (e.start == x && a.rank == p.rank && e.rank == q.rank && a.len > 0 && e.len > 0) {
          cp = clean[c - 1];
          cq = clean[c];
        }
      }
      if (cp < 0) continue;
      Shard& ca = pieces[cp];
      Shard& cb = pieces[cq];
      const int64_t up = (x / b + 1) * b - x;  // p gains noisy, loses clean
      const int64_t down = x - x / b * b;      // p loses noisy, gains clean
      const bool up_ok = up < q.len && up < ca.len;
      const bool down_ok = down < p.len && down < cb.len;
      int64_t move = 0;  // signed: noisy tokens p gains
      if (up_ok && (!down_ok || up <= down)) {
        move = up;
      } else if (down_ok) {
        move = -down;
      } else {
        continue;
      }
      p.len += move;
      q.start += move;
      q.len -= move;
      ca.len -= move;
      cb.start -= move;
      cb.len += move;
    }
  }
  return pieces;
}

bool Better(const Score& a, const Score& b, double target) {
  const bool a_ok = a.imbalance <= target, b_ok = b.imbalance <= target;
  if (a_ok != b_ok) return a_ok;
  if (!a_ok) return a.imbalance < b.imbalance;
  return a.traffic < b.traffic;
}

}  // namespace

absl::StatusOr<Plan> PlanBlockDiffusionFlashCp(const Batch& batch, const PlanOptions& options) {
  const AttentionMask mask = options.attention_mask;
  const Batch doubled = PlanBatch(batch, mask);
  const double target = options.target_imbalance;
  PlanOptions causal_options = options;
  causal_options.attention_mask = AttentionMask{};
  Plan best;
  Score best_score;
  bool have = false;
  const auto consider = [&](Plan plan) {
    const Score s = ScorePlan(plan);
    if (!have || Better(s, best_score, target)) {
      best = std::move(plan);
      best_score = s;
      have = true;
    }
  };
  // The causal plan's target tightened until the mask's imbalance meets R
  // (the mask's workload adds about b/2 pairs per token, so the causal
  // target usually suffices as it is).
  double causal_target = target;
  for (int attempt = 0; attempt < 3; ++attempt) {
    causal_options.target_imbalance = causal_target;
    FLASHCP_ASSIGN_OR_RETURN(Plan causal, PlanFlashCp(batch, causal_options));
    Plan colocated = FinishPlan(doubled, CoLocate(batch, causal));
    colocated.mask = mask;
    Plan snapped = FinishPlan(doubled, SnapNoisyCuts(colocated));
    snapped.mask = mask;
    // Noisy blocks stay whole unless that breaks the target.
    if (ScorePlan(snapped).imbalance <= target || ScorePlan(colocated).imbalance > target) {
      consider(std::move(snapped));
    } else {
      consider(std::move(colocated));
    }
    if (best_score.imbalance <= target) break;
    causal_target = 1.0 + (causal_target - 1.0) / 2.0;
  }
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  // csbp's plan where it moves less (a one-document batch can be such).
  absl::StatusOr<Plan> csbp = PlanCsbp(batch, mask.block_size);
  if (csbp.ok()) consider(*std::move(csbp));
  return best;
}

}  // namespace flashcp::core::internal
