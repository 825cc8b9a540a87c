// One rank's part of a CP step, as plain host data: which local rows it packs
// and sends under a scheme, where every received row lands, which shards
// attend without remote KV (whole: the first shard of their document) and
// which need their prefix staged, and where the gradients of staged rows go
// back. The one exchange layout of the CPU engine (engine.h), the GPU step
// (worker/cuda/gpu_cp_step.h) and the PyTorch integration
// (client/python/flashcp/torch, through the native module). Pure;
// cp_layout_test.cc checks it, including that the bytes it moves equal
// core::AnalyzePlan's prediction.
//
// Schemes are entries of one table (cp_layout.cc): a scheme says which rows
// a rank packs, where each remote shard lands in the receive buffer, and the
// collective that moves them. Everything else (staging, the gradients'
// return) is derived from that once, here, for every KV scheme. The
// all-to-all (Ulysses) moves heads, not KV rows: its entry fills `a2a`
// (a2a_layout.h, the sibling that describes it) and the attention batches
// (whole_*, over the head-parallel rows), and no KV-row field.
//
// Rows: a "row" is one token's K and V of all KV heads. The exchange buffers
// hold rows of 2 * heads_kv * head_dim elements ([K | V]); local tensors hold
// C/N rows (padding rows included, at the end, never attended).
#ifndef FLASHCP_WORKER_CP_LAYOUT_H_
#define FLASHCP_WORKER_CP_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/types.h"
#include "worker/a2a_layout.h"

namespace flashcp::worker {

// Encoded source or destination of a row: >= 0 is a local row; < 0 is row
// (-1 - code) of the receive buffer (forward) or of its gradient (backward,
// same layout). kNoRow marks a padding row of a send block.
inline constexpr int64_t kNoRow = INT64_MIN;
inline int64_t RemoteRow(int64_t recv_row) { return -1 - recv_row; }

// How the forward exchange travels. Both carry exactly `sends` and `recvs`
// (the communicator counts them alike); kAllGather is one all-gather of equal
// blocks (every send is the whole pack buffer, the receive buffer is
// [size][block_rows] with this rank's own block copied in).
// kAllToAll: the head exchange of CpRankLayout::a2a (point to point within
// the rank's group, one message per peer and direction), no KV rows.
enum class Collective { kAllGather, kSendRecv, kAllToAll };

struct RowSegment {
  int32_t peer = 0;
  int64_t first = 0;  // first row in its buffer
  int64_t rows = 0;
};

struct CpRankLayout {
  int32_t rank = 0;
  int32_t size = 1;
  core::CommScheme scheme = core::CommScheme::kAllGather;
  Collective collective = Collective::kAllGather;
  int64_t local_rows = 0;  // C/N

  // Forward exchange. The pack buffer's row i is local row pack_rows[i]
  // (kNoRow: zeros, padding of an all-gather block).
  std::vector<int64_t> pack_rows;
  // kAllGather: every rank's block has block_rows rows (pack_rows.size());
  // 0 under kSendRecv.
  int64_t block_rows = 0;
  // Messages, peer ascending, never to or from self: sends[i] is pack rows
  // [first, first + rows) to peer; recvs[i] lands at receive rows
  // [first, first + rows) from peer. recv_rows: the receive buffer's rows.
  std::vector<RowSegment> sends;
  std::vector<RowSegment> recvs;
  int64_t recv_rows = 0;
  // Backward, every scheme point to point: the gradients of receive rows
  // recvs[i] go back to recvs[i].peer; from sends[i].peer come the gradients
  // of the pack rows sends[i] carried, into rows [back_first[i],
  // back_first[i] + sends[i].rows) of a back buffer of back_rows rows; the
  // owner adds them onto local rows pack_rows[sends[i].first + j].
  std::vector<int64_t> back_first;
  int64_t back_rows = 0;

  // Attention of shards with no prefix (KV = their own local rows). Under
  // all_to_all: the group's documents, whole, on the a2a.rows head-parallel
  // rows (a2a_layout.h), and no prefixed shards.
  std::vector<int64_t> whole_start;
  std::vector<int32_t> whole_len;
  // Attention of shards with a prefix: queries at local rows, KV staged
  // contiguously per shard ([prefix pieces in document order, own rows]).
  std::vector<int64_t> prefix_q_start;
  std::vector<int32_t> prefix_q_len;
  std::vector<int32_t> prefix_kv_len;
  std::vector<int64_t> stage_src;  // per staged row: local row or RemoteRow(recv row)
  // Backward: the gradients of staged row stage_rounds[k][j] go to
  // stage_src[that row] (local accumulator or return buffer), round by round;
  // within one round no two rows share a destination (the k-th prefix shard
  // of each document is in round k), so a round is one race-free launch.
  std::vector<std::vector<int64_t>> stage_rounds;

  // all_to_all only (empty otherwise).
  AllToAllLayout a2a;
  // Block diffusion (core/mask.h; 0 under the causal mask): block_size > 0.
  // Then no shard is whole: every shard is a "prefixed" shard whose staged
  // rows are exactly the K/V its queries attend to (core::AppendNeededKv, in
  // that order), each staged row and each shard's queries carrying what the
  // mask needs, and the kernel evaluates core::BlockDiffusionSees per
  // (query, key). prefix_kv_len[i] - prefix_q_len[i] is then not a position.
  // stage_rounds: shards are put in the first round none of whose rows
  // shares a destination with theirs (a rank's noisy and clean shards of one
  // document stage the same clean rows).
  int64_t block_size = 0;
  std::vector<uint8_t> prefix_q_noisy;  // per prefixed shard: 1 for a noisy copy
  std::vector<int64_t> prefix_q_pos;    // per prefixed shard: its first query's position
  std::vector<uint8_t> stage_noisy;     // per staged row: 1 for noisy K/V
  std::vector<int64_t> stage_pos;       // per staged row: position in its document
};

// Rows of the query-side arrays the attention batches index: C/N local rows,
// or under all_to_all the group's a2a.rows head-parallel rows.
inline int64_t AttentionRows(const CpRankLayout& p) {
  return p.collective == Collective::kAllToAll ? p.a2a.rows : p.local_rows;
}

// Whether the step calls the communicator for its exchange (forward and
// backward) at all. Every rank of the group gets the same answer, so the
// group's sequence of operations stays aligned: false only for an all-gather
// of empty blocks (nothing to send anywhere); a send/recv exchange is always
// called, with empty lists where this rank has nothing.
// Under the two-level scheme (a2a.two_level) the exchange across nodes is
// always called.
inline bool CallsExchange(const CpRankLayout& p) {
  return p.collective == Collective::kSendRecv || p.block_rows > 0 || p.a2a.two_level;
}

// InvalidArgument unless the plan is valid, rank is in [0, N) and `layout`
// has the plan's N ranks: what every rank layout builder checks first.
absl::Status CheckRankLayoutInputs(const core::Plan& plan, const core::CommLayout& layout,
                                   int32_t rank);

// Builds rank `rank`'s layout; the plan must be valid and `layout` its
// core::BuildCommLayout (InvalidArgument otherwise).
absl::StatusOr<CpRankLayout> BuildCpRankLayout(const core::Plan& plan,
                                               const core::CommLayout& layout, int32_t rank,
                                               core::CommScheme scheme);

// The same for `scheme` run within `group` only: the ranks of one of the
// plan's rank groups (core::PlanRankGroups: no document is shared across
// groups) or a union of them, holding `rank`, each once, in any order; a
// mixed plan's group (core/rank_groups.h). full_kv and allgather become
// point to point among the group's ranks (Collective::kSendRecv: no
// communicator of the group's own is needed): each member sends its whole
// block, C/N rows or its compacted non-last rows padded to the group's
// largest, to every other member, which lands it at the sender's position
// in the group, ascending (core::GroupedSchemeBytes' count). targeted and
// all_to_all never leave a group: as above. InvalidArgument for a group
// without `rank`, a rank outside [0, N) or one given twice; Unimplemented
// for full_kv or allgather within a group under block diffusion.
absl::StatusOr<CpRankLayout> BuildCpRankLayout(const core::Plan& plan,
                                               const core::CommLayout& layout, int32_t rank,
                                               core::CommScheme scheme,
                                               const std::vector<int32_t>& group);

// Rows this rank sends and receives, forward plus backward (the backward
// return mirrors the forward exchange), under the communicator's counting
// (worker/communicator.h): multiply by 2 * heads_kv * head_dim * dtype bytes.
struct RowCounts {
  int64_t sent = 0;
  int64_t received = 0;
};
RowCounts ExchangedRows(const CpRankLayout& p);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_CP_LAYOUT_H_
