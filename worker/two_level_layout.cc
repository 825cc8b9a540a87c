#include "worker/two_level_layout.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/two_level.h"
#include "worker/a2a_layout.h"

namespace flashcp::worker {
namespace {

// Where one document's positions live for this part: per run of positions
// [start, start + len), its first row (head-parallel, or received).
struct Run {
  int64_t start, len, row;
};
using RunsByDoc = std::map<int32_t, std::vector<Run>>;

// The row holding `pos` of `doc` in `runs`, or -1. O(runs of the document).
int64_t RowOf(const RunsByDoc& runs, int32_t doc, int64_t pos) {
  auto it = runs.find(doc);
  if (it == runs.end()) return -1;
  for (const Run& r : it->second)
    if (pos >= r.start && pos < r.start + r.len) return r.row + (pos - r.start);
  return -1;
}

// `group` sorted; InvalidArgument for a rank outside [0, n) or given twice,
// or a group without `rank`.
absl::Status SortGroup(std::vector<int32_t>& group, int32_t n, int32_t rank) {
  std::sort(group.begin(), group.end());
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] < 0 || group[i] >= n)
      return absl::InvalidArgumentError(
          absl::StrCat("group: rank ", group[i], " outside [0, ", n, ")"));
    if (i > 0 && group[i] == group[i - 1])
      return absl::InvalidArgumentError(absl::StrCat("group: rank ", group[i], " given twice"));
  }
  if (!std::binary_search(group.begin(), group.end(), rank))
    return absl::InvalidArgumentError(absl::StrCat("group: does not hold rank ", rank));
  return absl::OkStatus();
}

// The part's own tokens: per document, runs of consecutive positions and
// their first head-parallel row (consecutive positions are consecutive rows:
// the part's rows are by document and position), by start.
RunsByDoc OwnRuns(const core::Plan& plan, const core::CommLayout& layout,
                  const std::vector<int32_t>& part, const AllToAllLayout& a) {
  RunsByDoc own;
  for (size_t q = 0; q < part.size(); ++q) {
    const core::RankLayout& rl = layout.ranks[part[q]];
    for (size_t i = 0; i < rl.shards.size(); ++i) {
      const core::Shard& s = plan.shards[rl.shards[i]];
      own[s.doc].push_back(Run{s.start, s.len, a.doc_row[a.first[q] + rl.shard_offset[i]]});
    }
  }
  for (auto& [doc, runs] : own) {
    std::sort(runs.begin(), runs.end(),
              [](const Run& x, const Run& y) { return x.start < y.start; });
    std::vector<Run> merged;
    for (const Run& r : runs) {
      if (!merged.empty() && merged.back().start + merged.back().len == r.start) {
        merged.back().len += r.len;
      } else {
        merged.push_back(r);
      }
    }
    runs = std::move(merged);
  }
  return own;
}

// Across nodes, from part b's position j: to the same position of every
// other part the runs it needs (sends, pack_rows, back_*); from each, the
// runs this part needs (recvs, recv_rows), returned by document.
absl::StatusOr<RunsByDoc> AddCrossMessages(const core::TwoLevelParts& parts, int32_t b,
                                           int32_t j, const RunsByDoc& own, CpRankLayout& p) {
  const int32_t np = static_cast<int32_t>(parts.parts.size());
  for (int32_t c = 0; c < np; ++c) {
    if (c == b || parts.need[b][c] == 0) continue;
    RowSegment seg{parts.parts[c][j], static_cast<int64_t>(p.pack_rows.size()), parts.need[b][c]};
    for (const core::DocRun& run : parts.runs[b][c]) {
      // A run lies within one shard of the part: consecutive rows here.
      const int64_t row = RowOf(own, run.doc, run.start);
      if (row < 0 || RowOf(own, run.doc, run.start + run.len - 1) != row + run.len - 1)
        return absl::InternalError(absl::StrCat("rank ", p.rank, ": positions ", run.start, "..",
                                                run.start + run.len, " of document ", run.doc,
                                                " are not one run on its node"));
      for (int64_t t = 0; t < run.len; ++t) p.pack_rows.push_back(row + t);
    }
    p.sends.push_back(seg);
    p.back_first.push_back(p.back_rows);
    p.back_rows += seg.rows;
  }
  RunsByDoc remote;
  for (int32_t a = 0; a < np; ++a) {
    if (a == b || parts.need[a][b] == 0) continue;
    p.recvs.push_back(RowSegment{parts.parts[a][j], p.recv_rows, parts.need[a][b]});
    for (const core::DocRun& run : parts.runs[a][b]) {
      remote[run.doc].push_back(Run{run.start, run.len, p.recv_rows});
      p.recv_rows += run.len;
    }
  }
  return remote;
}

// Stages positions [0, end) of a document from `tiles` (its runs here, own
// or received, by start; they tile [0, the part's last position there)).
absl::Status StagePrefix(const std::vector<std::pair<Run, bool>>& tiles, int32_t doc,
                         int64_t end, CpRankLayout& p) {
  int64_t pos = 0;
  for (const auto& [tile, received] : tiles) {
    if (pos == end) break;
    if (tile.start != pos)
      return absl::InternalError(absl::StrCat("rank ", p.rank, ": position ", pos,
                                              " of document ", doc,
                                              " is neither on its node nor received"));
    const int64_t len = std::min(tile.len, end - pos);
    for (int64_t t = 0; t < len; ++t)
      p.stage_src.push_back(received ? RemoteRow(tile.row + t) : tile.row + t);
    pos += len;
  }
  if (pos != end)
    return absl::InternalError(absl::StrCat("rank ", p.rank, ": document ", doc, " has ", pos,
                                            " positions here before ", end));
  return absl::OkStatus();
}

// The attention batches: a run from position 0 attends its own rows; any
// other its staged [positions 0..start, from the part or received, then its
// own]; the k-th prefixed run of a document in round k.
absl::Status AddBatches(const RunsByDoc& own, const RunsByDoc& remote, CpRankLayout& p) {
  std::map<int32_t, std::vector<std::pair<Run, bool>>> tiles;  // (run, received)
  for (const auto& [doc, runs] : own)
    for (const Run& r : runs) tiles[doc].push_back({r, false});
  for (const auto& [doc, runs] : remote)
    for (const Run& r : runs) tiles[doc].push_back({r, true});
  for (auto& [doc, t] : tiles)
    std::sort(t.begin(), t.end(),
              [](const auto& x, const auto& y) { return x.first.start < y.first.start; });
  for (const auto& [doc, runs] : own) {
    int32_t round = 0;
    for (const Run& r : runs) {
      if (r.start == 0) {
        p.whole_start.push_back(r.row);
        p.whole_len.push_back(static_cast<int32_t>(r.len));
        continue;
      }
      if (static_cast<int32_t>(p.stage_rounds.size()) <= round) p.stage_rounds.resize(round + 1);
      const int64_t first = static_cast<int64_t>(p.stage_src.size());
      FLASHCP_RETURN_IF_ERROR(StagePrefix(tiles[doc], doc, r.start, p));
      for (int64_t t = 0; t < r.len; ++t) p.stage_src.push_back(r.row + t);
      const int64_t staged = static_cast<int64_t>(p.stage_src.size()) - first;
      for (int64_t x = 0; x < staged; ++x) p.stage_rounds[round].push_back(first + x);
      ++round;
      p.prefix_q_start.push_back(r.row);
      p.prefix_q_len.push_back(static_cast<int32_t>(r.len));
      p.prefix_kv_len.push_back(static_cast<int32_t>(staged));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CpRankLayout> BuildTwoLevelRankLayout(const core::Plan& plan,
                                                     const core::CommLayout& layout,
                                                     int32_t rank, std::vector<int32_t> group,
                                                     int32_t ranks_per_node) {
  FLASHCP_RETURN_IF_ERROR(CheckRankLayoutInputs(plan, layout, rank));
  const int32_t n = plan.cp_size;
  FLASHCP_RETURN_IF_ERROR(SortGroup(group, n, rank));
  FLASHCP_ASSIGN_OR_RETURN(const core::TwoLevelParts parts,
                           core::TwoLevelNeeds(plan, group, ranks_per_node));
  int32_t b = 0, j = 0;  // this rank's part and position in it
  for (size_t a = 0; a < parts.parts.size(); ++a) {
    auto it = std::find(parts.parts[a].begin(), parts.parts[a].end(), rank);
    if (it != parts.parts[a].end()) {
      b = static_cast<int32_t>(a);
      j = static_cast<int32_t>(it - parts.parts[a].begin());
    }
  }
  CpRankLayout p;
  p.rank = rank;
  p.size = n;
  p.scheme = core::CommScheme::kAllToAll;
  p.collective = Collective::kAllToAll;
  p.local_rows = core::TokensPerRank(core::TotalTokens(plan.doc_lens), n);
  FLASHCP_ASSIGN_OR_RETURN(p.a2a, BuildAllToAllPartLayout(plan, layout, rank, parts.parts[b]));
  p.a2a.two_level = true;
  const RunsByDoc own = OwnRuns(plan, layout, parts.parts[b], p.a2a);
  FLASHCP_ASSIGN_OR_RETURN(const RunsByDoc remote, AddCrossMessages(parts, b, j, own, p));
  FLASHCP_RETURN_IF_ERROR(AddBatches(own, remote, p));
  return p;
}

}  // namespace flashcp::worker
