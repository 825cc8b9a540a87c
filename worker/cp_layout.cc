#include "worker/cp_layout.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/mask.h"
#include "core/status_macros.h"
#include "worker/cp_layout_mask.h"

namespace flashcp::worker {
namespace {

struct Inputs {
  const core::Plan& plan;
  const core::CommLayout& layout;
  int32_t rank;
  const std::vector<int64_t>& shard_row;  // per plan shard: first local row on its owner
  // The all-gather's members: slot[r] is rank r's block in the receive
  // buffer, -1 for a rank outside the group (every rank its own without one).
  const std::vector<int32_t>& slot;
};

// A scheme's part of the layout: p.pack_rows (plus block_rows under
// kAllGather, sends, recvs and recv_rows under kSendRecv), and recv_row[s],
// the first receive row of every remote shard s this rank can stage (-1: not
// received).
using PackFn = absl::Status (*)(const Inputs& in, CpRankLayout& p, std::vector<int64_t>& recv_row);

struct SchemeEntry {
  core::CommScheme scheme;
  Collective collective;
  PackFn pack;
};

void AppendRows(const Inputs& in, int32_t shard, int64_t len, std::vector<int64_t>& rows) {
  for (int64_t t = 0; t < len; ++t) rows.push_back(in.shard_row[shard] + t);
}

// Every rank's whole local memory, all-gathered (Eq. 4).
absl::Status PackFullKv(const Inputs& in, CpRankLayout& p, std::vector<int64_t>& recv_row) {
  p.block_rows = p.local_rows;
  for (int64_t t = 0; t < p.local_rows; ++t) p.pack_rows.push_back(t);
  for (size_t s = 0; s < in.plan.shards.size(); ++s) {
    const int32_t owner = in.plan.shards[s].rank;
    if (owner != in.rank && in.slot[owner] >= 0)
      recv_row[s] = in.slot[owner] * p.block_rows + in.shard_row[s];
  }
  return absl::OkStatus();
}

// Every rank's compacted non-last shards (RankLayout::send), all-gathered in
// blocks padded to the largest (Eq. 5).
absl::Status PackCompacted(const Inputs& in, CpRankLayout& p, std::vector<int64_t>& recv_row) {
  for (int32_t r = 0; r < p.size; ++r)
    if (in.slot[r] >= 0) p.block_rows = std::max(p.block_rows, in.layout.ranks[r].send_tokens);
  for (const core::SendRange& s : in.layout.ranks[in.rank].send) AppendRows(in, s.shard, s.len, p.pack_rows);
  p.pack_rows.resize(p.block_rows, kNoRow);
  for (int32_t r = 0; r < p.size; ++r) {
    if (r == in.rank || in.slot[r] < 0) continue;
    for (const core::SendRange& s : in.layout.ranks[r].send)
      recv_row[s.shard] = in.slot[r] * p.block_rows + s.offset;
  }
  return absl::OkStatus();
}

// Each compacted range only to the ranks that stage it (RankLayout::targeted).
absl::Status PackTargeted(const Inputs& in, CpRankLayout& p, std::vector<int64_t>& recv_row) {
  const core::RankLayout& me = in.layout.ranks[in.rank];
  for (const core::TargetedSend& t : me.targeted) {
    RowSegment seg{t.dest, static_cast<int64_t>(p.pack_rows.size()), 0};
    for (int32_t si : t.send_indices) AppendRows(in, me.send[si].shard, me.send[si].len, p.pack_rows);
    seg.rows = static_cast<int64_t>(p.pack_rows.size()) - seg.first;
    if (seg.rows != t.tokens)
      return absl::InternalError(absl::StrCat("targeted send to ", t.dest, ": ", seg.rows,
                                              " rows but the layout says ", t.tokens));
    p.sends.push_back(seg);
  }
  for (int32_t r = 0; r < p.size; ++r) {
    if (r == in.rank) continue;
    for (const core::TargetedSend& t : in.layout.ranks[r].targeted) {
      if (t.dest != in.rank) continue;
      p.recvs.push_back(RowSegment{r, p.recv_rows, t.tokens});
      for (int32_t si : t.send_indices) {
        const core::SendRange& s = in.layout.ranks[r].send[si];
        recv_row[s.shard] = p.recv_rows;
        p.recv_rows += s.len;
      }
    }
  }
  return absl::OkStatus();
}

// The all-to-all: heads within the rank's group (a2a_layout.h); no KV rows,
// so no recv_row, and the attention batches are the group's documents whole.
absl::Status PackAllToAll(const Inputs& in, CpRankLayout& p, std::vector<int64_t>&) {
  FLASHCP_ASSIGN_OR_RETURN(p.a2a, BuildAllToAllLayout(in.plan, in.layout, in.rank));
  p.whole_start = p.a2a.doc_start;
  p.whole_len = p.a2a.doc_len;
  return absl::OkStatus();
}

// Every scheme; core::kAllCommSchemes has one entry each (static_assert below).
constexpr SchemeEntry kSchemes[] = {
    {core::CommScheme::kFullKv, Collective::kAllGather, PackFullKv},
    {core::CommScheme::kAllGather, Collective::kAllGather, PackCompacted},
    {core::CommScheme::kTargeted, Collective::kSendRecv, PackTargeted},
    {core::CommScheme::kAllToAll, Collective::kAllToAll, PackAllToAll},
};
static_assert(std::size(kSchemes) == core::kNumCommSchemes, "one table entry per scheme");

// slot[r]: rank r's block of an all-gather, its index in the sorted `group`
// (every rank where `group` is empty); -1 outside the group.
absl::StatusOr<std::vector<int32_t>> GroupSlots(const std::vector<int32_t>& group, int32_t n,
                                                int32_t rank) {
  std::vector<int32_t> slot(n, -1);
  if (group.empty()) {
    for (int32_t r = 0; r < n; ++r) slot[r] = r;
    return slot;
  }
  std::vector<int32_t> members = group;
  std::sort(members.begin(), members.end());
  for (size_t j = 0; j < members.size(); ++j) {
    const int32_t r = members[j];
    if (r < 0 || r >= n || slot[r] >= 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "group: rank ", r, r < 0 || r >= n ? " outside [0, " : " given twice in a plan of ",
          r < 0 || r >= n ? absl::StrCat(n, ")") : absl::StrCat(n, " ranks")));
    slot[r] = static_cast<int32_t>(j);
  }
  if (slot[rank] < 0)
    return absl::InvalidArgumentError(absl::StrCat("group: does not hold rank ", rank));
  return slot;
}

// An all-gather as messages: every peer of the group gets the whole pack
// buffer; its block lands at slot[peer] * block_rows.
void AddAllGatherMessages(const std::vector<int32_t>& slot, CpRankLayout& p) {
  int32_t members = 0;
  for (int32_t peer = 0; peer < p.size; ++peer) {
    if (slot[peer] < 0) continue;
    ++members;
    if (peer == p.rank || p.block_rows == 0) continue;
    p.sends.push_back(RowSegment{peer, 0, p.block_rows});
    p.recvs.push_back(RowSegment{peer, slot[peer] * p.block_rows, p.block_rows});
  }
  p.recv_rows = int64_t{members} * p.block_rows;
}

// The attention batches of p.rank's shards (whole documents, and prefixed
// shards with their staged K/V rows: local rows, then received ones).
absl::Status AddAttentionBatches(const core::Plan& plan, const core::CommLayout& layout,
                                 const std::vector<int64_t>& shard_row,
                                 const std::vector<int64_t>& recv_row, CpRankLayout& p) {
  const int32_t rank = p.rank;
  const core::RankLayout& me = layout.ranks[rank];
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
      const int64_t len = plan.shards[piece.shard].len;
      if (piece.rank == rank) {
        for (int64_t t = 0; t < len; ++t) p.stage_src.push_back(shard_row[piece.shard] + t);
      } else {
        const int64_t at = recv_row[piece.shard];
        if (at < 0)
          return absl::InternalError(absl::StrCat("rank ", rank, ": prefix piece shard ", piece.shard,
                                                  " of rank ", piece.rank, " is never received"));
        for (int64_t t = 0; t < len; ++t) p.stage_src.push_back(RemoteRow(at + t));
      }
      prefix += len;
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CpRankLayout> BuildCpRankLayout(const core::Plan& plan,
                                               const core::CommLayout& layout, int32_t rank,
                                               core::CommScheme scheme) {
  return BuildCpRankLayout(plan, layout, rank, scheme, {});
}

absl::Status CheckRankLayoutInputs(const core::Plan& plan, const core::CommLayout& layout,
                                   int32_t rank) {
  FLASHCP_RETURN_IF_ERROR(core::ValidatePlan(plan));
  const int32_t n = plan.cp_size;
  if (rank < 0 || rank >= n)
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside [0, ", n, ")"));
  if (static_cast<int32_t>(layout.ranks.size()) != n)
    return absl::InvalidArgumentError(
        absl::StrCat("layout has ", layout.ranks.size(), " ranks, plan ", n));
  return absl::OkStatus();
}

absl::StatusOr<CpRankLayout> BuildCpRankLayout(const core::Plan& plan,
                                               const core::CommLayout& layout, int32_t rank,
                                               core::CommScheme scheme,
                                               const std::vector<int32_t>& group) {
  FLASHCP_RETURN_IF_ERROR(CheckRankLayoutInputs(plan, layout, rank));
  const int32_t n = plan.cp_size;
  FLASHCP_ASSIGN_OR_RETURN(const std::vector<int32_t> slot, GroupSlots(group, n, rank));
  const bool in_group = !group.empty() && (scheme == core::CommScheme::kFullKv ||
                                           scheme == core::CommScheme::kAllGather);
  if (core::IsBlockDiffusion(plan.mask)) {
    if (in_group)
      return absl::UnimplementedError(absl::StrCat(
          "scheme: ", core::CommSchemeName(scheme),
          " within one rank group under block diffusion; run it over the whole plan"));
    return BuildMaskedCpRankLayout(plan, layout, rank, scheme);
  }
  const SchemeEntry* entry = nullptr;
  for (const SchemeEntry& e : kSchemes)
    if (e.scheme == scheme) entry = &e;
  if (entry == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat("scheme: unknown communication scheme ", static_cast<int>(scheme)));
  CpRankLayout p;
  p.rank = rank;
  p.size = n;
  p.scheme = scheme;
  p.collective = entry->collective;
  p.local_rows = core::TokensPerRank(core::TotalTokens(plan.doc_lens), n);

  std::vector<int64_t> shard_row(plan.shards.size(), -1);
  for (const core::RankLayout& r : layout.ranks)
    for (size_t i = 0; i < r.shards.size(); ++i) shard_row[r.shards[i]] = r.shard_offset[i];
  std::vector<int64_t> recv_row(plan.shards.size(), -1);
  FLASHCP_RETURN_IF_ERROR(entry->pack(Inputs{plan, layout, rank, shard_row, slot}, p, recv_row));
  if (p.collective == Collective::kAllToAll) return p;  // no KV rows to stage or return
  if (p.collective == Collective::kAllGather) {
    AddAllGatherMessages(slot, p);
    if (in_group) p.collective = Collective::kSendRecv;  // the group's messages, point to point
  }
  for (const RowSegment& s : p.sends) {
    p.back_first.push_back(p.back_rows);
    p.back_rows += s.rows;
  }

  FLASHCP_RETURN_IF_ERROR(AddAttentionBatches(plan, layout, shard_row, recv_row, p));
  return p;
}

RowCounts ExchangedRows(const CpRankLayout& p) {
  int64_t out = 0, in = 0;
  for (const RowSegment& s : p.sends) out += s.rows;
  for (const RowSegment& s : p.recvs) in += s.rows;
  // KV forward, and the gradients of what was received back to its owners.
  return RowCounts{out + in, in + out};
}

}  // namespace flashcp::worker
