#include "core/mask_layout.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "core/mask.h"

namespace flashcp::core {

absl::StatusOr<CommLayout> BuildMaskCommLayout(const Plan& plan) {
  const int32_t n = plan.cp_size;
  CommLayout layout;
  layout.ranks.resize(n);
  layout.docs.resize(plan.doc_lens.size());
  // Pieces of every document in document order (shard starts ascending).
  std::vector<std::vector<int32_t>> by_doc(plan.doc_lens.size());
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    by_doc[plan.shards[i].doc].push_back(static_cast<int32_t>(i));
  }
  std::vector<int32_t> pos_of_shard(plan.shards.size());
  for (size_t d = 0; d < by_doc.size(); ++d) {
    std::sort(by_doc[d].begin(), by_doc[d].end(),
              [&](int32_t a, int32_t b) { return plan.shards[a].start < plan.shards[b].start; });
    for (size_t k = 0; k < by_doc[d].size(); ++k) {
      const int32_t i = by_doc[d][k];
      pos_of_shard[i] = static_cast<int32_t>(k);
      layout.docs[d].push_back(DocPiece{i, plan.shards[i].rank, -1});
    }
  }
  // Per shard: (begin, end, dest) of every part some other rank needs.
  std::vector<std::vector<std::tuple<int64_t, int64_t, int32_t>>> needs(plan.shards.size());
  ForEachNeededRemote(plan, [&](int32_t dest, int32_t shard, int64_t begin, int64_t end) {
    needs[shard].emplace_back(begin, end, dest);
  });
  // Per (sender, dest): the send indices dest needs, ascending.
  std::vector<std::map<int32_t, TargetedSend>> targeted(n);
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const Shard& s = plan.shards[i];
    RankLayout& rank = layout.ranks[s.rank];
    const int64_t offset = rank.shard_offset.empty()
                               ? 0
                               : rank.shard_offset.back() + plan.shards[rank.shards.back()].len;
    rank.shards.push_back(static_cast<int32_t>(i));
    rank.shard_offset.push_back(offset);
    rank.doc_pos.push_back(pos_of_shard[i]);
    if (needs[i].empty()) continue;
    // Elementary pieces between consecutive boundaries; a piece goes to the
    // dests whose part covers it. Adjacent pieces with one set of dests are
    // one range.
    std::vector<int64_t> cuts;
    for (const auto& [b, e, dest] : needs[i]) {
      cuts.push_back(b);
      cuts.push_back(e);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<int32_t> prev_dests;
    int64_t prev_end = -1;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int64_t b = cuts[c], e = cuts[c + 1];
      std::vector<int32_t> dests;
      for (const auto& [nb, ne, dest] : needs[i]) {
        if (nb <= b && e <= ne) dests.push_back(dest);
      }
      if (dests.empty()) continue;
      std::sort(dests.begin(), dests.end());
      dests.erase(std::unique(dests.begin(), dests.end()), dests.end());
      if (b == prev_end && dests == prev_dests) {
        rank.send.back().len += e - b;
        for (int32_t dest : dests) targeted[s.rank][dest].tokens += e - b;
      } else {
        const int32_t index = static_cast<int32_t>(rank.send.size());
        rank.send.push_back(SendRange{static_cast<int32_t>(i), rank.send_tokens, e - b, b - s.start});
        for (int32_t dest : dests) {
          TargetedSend& t = targeted[s.rank][dest];
          t.dest = dest;
          t.send_indices.push_back(index);
          t.tokens += e - b;
        }
      }
      rank.send_tokens += e - b;
      prev_end = e;
      prev_dests = std::move(dests);
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    for (auto& [dest, t] : targeted[r]) layout.ranks[r].targeted.push_back(std::move(t));
  }
  return layout;
}

}  // namespace flashcp::core
