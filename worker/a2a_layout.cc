#include "worker/a2a_layout.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/rank_groups.h"

namespace flashcp::worker {

absl::StatusOr<AllToAllLayout> BuildAllToAllLayout(const core::Plan& plan,
                                                   const core::CommLayout& layout, int32_t rank) {
  AllToAllLayout a;
  for (std::vector<int32_t>& g : core::PlanRankGroups(plan)) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) a.group = std::move(g);
  }
  const int32_t k = static_cast<int32_t>(a.group.size());
  const int64_t total = core::TotalTokens(plan.doc_lens);
  // The group's documents, by id, and where each starts in document order.
  std::map<int32_t, int64_t> doc_base;
  for (int32_t j = 0; j < k; ++j) {
    const int32_t r = a.group[j];
    if (r == rank) a.position = j;
    a.first.push_back(a.rows);
    a.tokens.push_back(core::RankRealTokens(total, plan.cp_size, r));
    a.rows += a.tokens.back();
    for (int32_t s : layout.ranks[r].shards) doc_base[plan.shards[s].doc] = 0;
  }
  int64_t at = 0;
  for (auto& [doc, base] : doc_base) {
    base = at;
    a.doc_start.push_back(at);
    a.doc_len.push_back(static_cast<int32_t>(plan.doc_lens[doc]));
    at += plan.doc_lens[doc];
  }
  if (at != a.rows) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": the group's documents hold ", at,
                                            " tokens but its ranks ", a.rows));
  }
  a.doc_row.assign(a.rows, -1);
  for (int32_t j = 0; j < k; ++j) {
    const core::RankLayout& rl = layout.ranks[a.group[j]];
    for (size_t i = 0; i < rl.shards.size(); ++i) {
      const core::Shard& s = plan.shards[rl.shards[i]];
      for (int64_t t = 0; t < s.len; ++t) {
        a.doc_row[a.first[j] + rl.shard_offset[i] + t] = doc_base[s.doc] + s.start + t;
      }
    }
  }
  return a;
}

absl::StatusOr<AllToAllLayout> BuildAllToAllPartLayout(const core::Plan& plan,
                                                       const core::CommLayout& layout,
                                                       int32_t rank,
                                                       const std::vector<int32_t>& part) {
  AllToAllLayout a;
  a.group = part;
  const int64_t total = core::TotalTokens(plan.doc_lens);
  struct Piece {
    int32_t doc;
    int64_t start, gathered, len;
  };
  std::vector<Piece> pieces;
  bool found = false;
  for (size_t j = 0; j < part.size(); ++j) {
    const int32_t r = part[j];
    if (r == rank) {
      a.position = static_cast<int32_t>(j);
      found = true;
    }
    a.first.push_back(a.rows);
    a.tokens.push_back(core::RankRealTokens(total, plan.cp_size, r));
    const core::RankLayout& rl = layout.ranks[r];
    for (size_t i = 0; i < rl.shards.size(); ++i) {
      const core::Shard& s = plan.shards[rl.shards[i]];
      pieces.push_back(Piece{s.doc, s.start, a.rows + rl.shard_offset[i], s.len});
    }
    a.rows += a.tokens.back();
  }
  if (!found) return absl::InvalidArgumentError(absl::StrCat("group: does not hold rank ", rank));
  std::sort(pieces.begin(), pieces.end(), [](const Piece& x, const Piece& y) {
    return x.doc != y.doc ? x.doc < y.doc : x.start < y.start;
  });
  a.doc_row.assign(a.rows, -1);
  int64_t at = 0;
  for (const Piece& p : pieces) {
    for (int64_t t = 0; t < p.len; ++t) a.doc_row[p.gathered + t] = at + t;
    at += p.len;
  }
  if (at != a.rows) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": the part's shards hold ", at,
                                            " tokens but its ranks ", a.rows));
  }
  return a;
}

absl::StatusOr<core::AllToAllHeads> AllToAllLayoutHeads(const AllToAllLayout& a,
                                                        int32_t query_heads, int32_t kv_heads,
                                                        int32_t head_dim) {
  core::ModelShape shape;
  shape.heads = kv_heads;
  shape.head_dim = head_dim;
  shape.dtype_bytes = 4;
  shape.query_heads = query_heads;
  return core::AllToAllGroupHeads(static_cast<int32_t>(a.group.size()), shape);
}

}  // namespace flashcp::worker
