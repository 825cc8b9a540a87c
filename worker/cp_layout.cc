#include "worker/cp_layout.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flashcp::worker {

absl::StatusOr<GpuRankPlan> BuildGpuRankPlan(const core::Plan& plan,
                                             const core::CommLayout& layout, int32_t rank,
                                             core::CommScheme scheme) {
  FLASHCP_RETURN_IF_ERROR(core::ValidatePlan(plan));
  const int32_t n = plan.cp_size;
  if (rank < 0 || rank >= n)
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside [0, ", n, ")"));
  if (static_cast<int32_t>(layout.ranks.size()) != n)
    return absl::InvalidArgumentError(
        absl::StrCat("layout has ", layout.ranks.size(), " ranks, plan ", n));
  GpuRankPlan p;
  p.rank = rank;
  p.size = n;
  p.scheme = scheme;
  p.local_rows = core::TokensPerRank(core::TotalTokens(plan.doc_lens), n);

  // Local row of every shard on its owner.
  std::vector<int64_t> shard_row(plan.shards.size(), -1);
  for (const core::RankLayout& r : layout.ranks)
    for (size_t i = 0; i < r.shards.size(); ++i) shard_row[r.shards[i]] = r.shard_offset[i];

  // Where each (owner, send_index) range starts in this rank's receive buffer.
  std::map<std::pair<int32_t, int32_t>, int64_t> recv_at;
  const core::RankLayout& me = layout.ranks[rank];
  auto local_rows_of = [&](const core::SendRange& s) {
    std::vector<int64_t> rows(s.len);
    for (int64_t t = 0; t < s.len; ++t) rows[t] = shard_row[s.shard] + t;
    return rows;
  };
  switch (scheme) {
    case core::CommScheme::kFullKv:
      p.gather = true;
      p.block_rows = p.local_rows;
      for (int64_t t = 0; t < p.local_rows; ++t) p.pack_rows.push_back(t);
      break;
    case core::CommScheme::kAllGather: {
      p.gather = true;
      for (const core::RankLayout& r : layout.ranks) p.block_rows = std::max(p.block_rows, r.send_tokens);
      for (const core::SendRange& s : me.send) {
        std::vector<int64_t> rows = local_rows_of(s);
        p.pack_rows.insert(p.pack_rows.end(), rows.begin(), rows.end());
      }
      p.pack_rows.resize(p.block_rows, kNoRow);
      for (int32_t r = 0; r < n; ++r)
        for (size_t i = 0; i < layout.ranks[r].send.size(); ++i)
          recv_at[{r, static_cast<int32_t>(i)}] = r * p.block_rows + layout.ranks[r].send[i].offset;
      break;
    }
    case core::CommScheme::kTargeted: {
      p.gather = false;
      for (const core::TargetedSend& t : me.targeted) {
        RowSegment seg{t.dest, static_cast<int64_t>(p.pack_rows.size()), 0};
        for (int32_t si : t.send_indices) {
          std::vector<int64_t> rows = local_rows_of(me.send[si]);
          p.pack_rows.insert(p.pack_rows.end(), rows.begin(), rows.end());
        }
        seg.rows = static_cast<int64_t>(p.pack_rows.size()) - seg.first;
        if (seg.rows != t.tokens)
          return absl::InternalError(absl::StrCat("targeted send to ", t.dest, ": ", seg.rows,
                                                  " rows but the layout says ", t.tokens));
        p.sends.push_back(seg);
      }
      for (int32_t r = 0; r < n; ++r) {
        if (r == rank) continue;
        for (const core::TargetedSend& t : layout.ranks[r].targeted) {
          if (t.dest != rank) continue;
          RowSegment seg{r, p.recv_rows, t.tokens};
          int64_t at = p.recv_rows;
          for (int32_t si : t.send_indices) {
            recv_at[{r, si}] = at;
            at += layout.ranks[r].send[si].len;
          }
          p.recvs.push_back(seg);
          p.recv_rows += t.tokens;
        }
      }
      break;
    }
  }
  if (p.gather) p.recv_rows = int64_t{n} * p.block_rows;

  // Attention batches and the staging of prefixes.
  std::map<int32_t, int32_t> prefix_shards_of_doc;  // doc -> local prefix shards so far
  for (size_t i = 0; i < me.shards.size(); ++i) {
    const core::Shard& sh = plan.shards[me.shards[i]];
    const int32_t pos = me.doc_pos[i];
    const int64_t row = me.shard_offset[i];
    if (pos == 0) {
      p.whole_start.push_back(row);
      p.whole_len.push_back(static_cast<int32_t>(sh.len));
      continue;
    }
    const int32_t round = prefix_shards_of_doc[sh.doc]++;
    if (static_cast<int32_t>(p.stage_rounds.size()) <= round) p.stage_rounds.resize(round + 1);
    const int64_t stage_first = static_cast<int64_t>(p.stage_src.size());
    int64_t prefix = 0;
    for (int32_t k = 0; k < pos; ++k) {
      const core::DocPiece& piece = layout.docs[sh.doc][k];
      const core::Shard& ps = plan.shards[piece.shard];
      if (piece.rank == rank) {
        for (int64_t t = 0; t < ps.len; ++t) p.stage_src.push_back(shard_row[piece.shard] + t);
      } else if (scheme == core::CommScheme::kFullKv) {
        const int64_t at = int64_t{piece.rank} * p.block_rows + shard_row[piece.shard];
        for (int64_t t = 0; t < ps.len; ++t) p.stage_src.push_back(RemoteRow(at + t));
      } else {
        auto it = recv_at.find({piece.rank, piece.send_index});
        if (it == recv_at.end())
          return absl::InternalError(absl::StrCat("rank ", rank, ": prefix piece shard ", piece.shard,
                                                  " of rank ", piece.rank, " is never received"));
        for (int64_t t = 0; t < ps.len; ++t) p.stage_src.push_back(RemoteRow(it->second + t));
      }
      prefix += ps.len;
    }
    if (prefix != sh.start)
      return absl::InternalError(absl::StrCat("shard ", me.shards[i], ": prefix pieces hold ", prefix,
                                              " tokens but the shard starts at ", sh.start));
    for (int64_t t = 0; t < sh.len; ++t) p.stage_src.push_back(row + t);
    const int64_t staged = static_cast<int64_t>(p.stage_src.size()) - stage_first;
    for (int64_t r = 0; r < staged; ++r) p.stage_rounds[round].push_back(stage_first + r);
    p.prefix_q_start.push_back(row);
    p.prefix_q_len.push_back(static_cast<int32_t>(sh.len));
    p.prefix_kv_len.push_back(static_cast<int32_t>(staged));
  }
  return p;
}

RowCounts ExchangedRows(const GpuRankPlan& p) {
  RowCounts c;
  if (p.gather) {
    // Forward all-gather plus the backward return of the same blocks.
    c.sent = 2 * p.block_rows * (p.size - 1);
    c.received = c.sent;
  } else {
    int64_t out = 0, in = 0;
    for (const RowSegment& s : p.sends) out += s.rows;
    for (const RowSegment& s : p.recvs) in += s.rows;
    c.sent = out + in;      // KV forward, gradients of received rows backward
    c.received = in + out;  // and the mirror
  }
  return c;
}

}  // namespace flashcp::worker
