#include "worker/cp_layout_mask.h"

#include <algorithm>
#include <vector>

#include <unordered_set>
#include "absl/strings/str_cat.h"
#include "core/mask.h"
#include "core/status_macros.h"

namespace flashcp::worker {
namespace {

// Where a part of a remote shard landed: tokens [skip, skip + len) of the
// shard at receive rows [row, row + len).
struct Landing {
  int64_t skip = 0, len = 0, row = 0;
};

// Per plan shard: where its parts landed on this rank.
using Landed = std::vector<std::vector<Landing>>;

// Every rank's shards: the local row of each shard's first token.
std::vector<int64_t> ShardRows(const core::Plan& plan, const core::CommLayout& layout) {
  std::vector<int64_t> shard_row(plan.shards.size(), -1);
  for (const core::RankLayout& r : layout.ranks)
    for (size_t i = 0; i < r.shards.size(); ++i) shard_row[r.shards[i]] = r.shard_offset[i];
  return shard_row;
}

// full_kv: every rank's whole buffer to every peer.
void LayoutFullKv(const core::Plan& plan, const std::vector<int64_t>& shard_row, int32_t rank,
                  CpRankLayout& p, Landed& landed) {
  p.collective = Collective::kAllGather;
  p.block_rows = p.local_rows;
  for (int64_t t = 0; t < p.local_rows; ++t) p.pack_rows.push_back(t);
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    const int32_t owner = plan.shards[s].rank;
    if (owner != rank)
      landed[s].push_back(Landing{0, plan.shards[s].len, owner * p.block_rows + shard_row[s]});
  }
}

// allgather: every rank's send ranges, padded to the largest, to every peer.
void LayoutAllGather(const core::CommLayout& layout, const std::vector<int64_t>& shard_row,
                     int32_t rank, CpRankLayout& p, Landed& landed) {
  const core::RankLayout& me = layout.ranks[rank];
  p.collective = Collective::kAllGather;
  for (const core::RankLayout& r : layout.ranks) p.block_rows = std::max(p.block_rows, r.send_tokens);
  for (const core::SendRange& s : me.send)
    for (int64_t t = 0; t < s.len; ++t) p.pack_rows.push_back(shard_row[s.shard] + s.skip + t);
  p.pack_rows.resize(p.block_rows, kNoRow);
  for (int32_t r = 0; r < p.size; ++r) {
    if (r == rank) continue;
    for (const core::SendRange& s : layout.ranks[r].send)
      landed[s.shard].push_back(Landing{s.skip, s.len, r * p.block_rows + s.offset});
  }
}

// targeted: point-to-point sends of the ranges each peer needs.
absl::Status LayoutTargeted(const core::CommLayout& layout, const std::vector<int64_t>& shard_row,
                            int32_t rank, CpRankLayout& p, Landed& landed) {
  const core::RankLayout& me = layout.ranks[rank];
  p.collective = Collective::kSendRecv;
  for (const core::TargetedSend& t : me.targeted) {
    RowSegment seg{t.dest, static_cast<int64_t>(p.pack_rows.size()), 0};
    for (int32_t si : t.send_indices) {
      const core::SendRange& s = me.send[si];
      for (int64_t x = 0; x < s.len; ++x) p.pack_rows.push_back(shard_row[s.shard] + s.skip + x);
    }
    seg.rows = static_cast<int64_t>(p.pack_rows.size()) - seg.first;
    if (seg.rows != t.tokens)
      return absl::InternalError(absl::StrCat("targeted send to ", t.dest, ": ", seg.rows,
                                              " rows but the layout says ", t.tokens));
    p.sends.push_back(seg);
  }
  for (int32_t r = 0; r < p.size; ++r) {
    if (r == rank) continue;
    for (const core::TargetedSend& t : layout.ranks[r].targeted) {
      if (t.dest != rank) continue;
      p.recvs.push_back(RowSegment{r, p.recv_rows, t.tokens});
      for (int32_t si : t.send_indices) {
        const core::SendRange& s = layout.ranks[r].send[si];
        landed[s.shard].push_back(Landing{s.skip, s.len, p.recv_rows});
        p.recv_rows += s.len;
      }
    }
  }
  return absl::OkStatus();
}

// The exchange of `scheme`: pack rows, sends, receives, backward rows, and
// where each remote shard's parts land.
absl::Status LayoutExchange(const core::Plan& plan, const core::CommLayout& layout,
                            const std::vector<int64_t>& shard_row, int32_t rank,
                            core::CommScheme scheme, CpRankLayout& p, Landed& landed) {
  switch (scheme) {
    case core::CommScheme::kFullKv: LayoutFullKv(plan, shard_row, rank, p, landed); break;
    case core::CommScheme::kAllGather: LayoutAllGather(layout, shard_row, rank, p, landed); break;
    case core::CommScheme::kTargeted:
      FLASHCP_RETURN_IF_ERROR(LayoutTargeted(layout, shard_row, rank, p, landed));
      break;
    case core::CommScheme::kAllToAll:
      return absl::UnimplementedError(
          "scheme: all_to_all under attention_mask block_diffusion (a rank group would split a "
          "document's noisy and clean copies); use targeted, allgather or full_kv");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("scheme: unknown communication scheme ", static_cast<int>(scheme)));
  }
  const int32_t n = p.size;
  if (p.collective == Collective::kAllGather) {
    p.recv_rows = int64_t{n} * p.block_rows;
    for (int32_t peer = 0; peer < n && p.block_rows > 0; ++peer) {
      if (peer == rank) continue;
      p.sends.push_back(RowSegment{peer, 0, p.block_rows});
      p.recvs.push_back(RowSegment{peer, peer * p.block_rows, p.block_rows});
    }
  }
  for (const RowSegment& s : p.sends) {
    p.back_first.push_back(p.back_rows);
    p.back_rows += s.rows;
  }
  return absl::OkStatus();
}

// Appends the staging rows (source, noisy, position) of one local shard's
// needed K/V, range by range.
absl::Status StageShard(const core::Plan& plan, const core::CommLayout& layout,
                        const std::vector<int64_t>& shard_row, const Landed& landed, int32_t rank,
                        const core::Shard& sh, std::vector<core::DocRange>& need,
                        CpRankLayout& p) {
  need.clear();
  core::AppendNeededKv(plan, sh, need);
  for (const core::DocRange& range : need) {
    const bool noisy = core::IsNoisyDoc(plan, range.doc);
    for (const core::DocPiece& piece : layout.docs[range.doc]) {
      const core::Shard& ps = plan.shards[piece.shard];
      const int64_t a = std::max(range.begin, ps.start);
      const int64_t e = std::min(range.end, ps.start + ps.len);
      for (int64_t t = a; t < e; ++t) {
        int64_t src = kNoRow;
        if (piece.rank == rank) {
          src = shard_row[piece.shard] + (t - ps.start);
        } else {
          for (const Landing& l : landed[piece.shard]) {
            const int64_t x = t - ps.start - l.skip;
            if (x >= 0 && x < l.len) {
              src = RemoteRow(l.row + x);
              break;
            }
          }
          if (src == kNoRow)
            return absl::InternalError(absl::StrCat(
                "rank ", rank, ": token ", t, " of document ", range.doc, " (shard ",
                piece.shard, " of rank ", piece.rank, ") is needed but never received"));
        }
        p.stage_src.push_back(src);
        p.stage_noisy.push_back(noisy ? 1 : 0);
        p.stage_pos.push_back(t);
      }
    }
  }
  return absl::OkStatus();
}

// Puts staging rows [first, first + staged) in the first round where none of
// their destinations is taken.
void AssignRound(int64_t first, int64_t staged,
                 std::vector<std::unordered_set<int64_t>>& round_dests, CpRankLayout& p) {
  size_t round = 0;
  for (; round < round_dests.size(); ++round) {
    bool clash = false;
    for (int64_t r = first; r < first + staged && !clash; ++r)
      clash = round_dests[round].count(p.stage_src[r]) > 0;
    if (!clash) break;
  }
  if (round == round_dests.size()) {
    round_dests.emplace_back();
    p.stage_rounds.emplace_back();
  }
  for (int64_t r = first; r < first + staged; ++r) {
    round_dests[round].insert(p.stage_src[r]);
    p.stage_rounds[round].push_back(r);
  }
}

}  // namespace

absl::StatusOr<CpRankLayout> BuildMaskedCpRankLayout(const core::Plan& plan,
                                                     const core::CommLayout& layout,
                                                     int32_t rank, core::CommScheme scheme) {
  const int32_t n = plan.cp_size;
  CpRankLayout p;
  p.rank = rank;
  p.size = n;
  p.scheme = scheme;
  p.local_rows = core::TokensPerRank(core::TotalTokens(plan.doc_lens), n);
  p.block_size = plan.mask.block_size;

  const std::vector<int64_t> shard_row = ShardRows(plan, layout);
  Landed landed(plan.shards.size());
  FLASHCP_RETURN_IF_ERROR(LayoutExchange(plan, layout, shard_row, rank, scheme, p, landed));

  // Staging: every local shard's needed K/V, range by range.
  const core::RankLayout& me = layout.ranks[rank];
  std::vector<core::DocRange> need;
  std::vector<std::unordered_set<int64_t>> round_dests;  // per round: stage_src values used
  for (size_t i = 0; i < me.shards.size(); ++i) {
    const core::Shard& sh = plan.shards[me.shards[i]];
    const int64_t stage_first = static_cast<int64_t>(p.stage_src.size());
    FLASHCP_RETURN_IF_ERROR(StageShard(plan, layout, shard_row, landed, rank, sh, need, p));
    const int64_t staged = static_cast<int64_t>(p.stage_src.size()) - stage_first;
    AssignRound(stage_first, staged, round_dests, p);
    p.prefix_q_start.push_back(me.shard_offset[i]);
    p.prefix_q_len.push_back(static_cast<int32_t>(sh.len));
    p.prefix_kv_len.push_back(static_cast<int32_t>(staged));
    p.prefix_q_noisy.push_back(core::IsNoisyDoc(plan, sh.doc) ? 1 : 0);
    p.prefix_q_pos.push_back(sh.start);
  }
  return p;
}

}  // namespace flashcp::worker
