// One rank's part of a CP step, as plain host data: which local rows it packs
// and sends under a scheme, where every received row lands, which shards
// attend without remote KV (whole: the first shard of their document) and
// which need their prefix staged, and where the gradients of staged rows go
// back. The one exchange layout of the GPU step (worker/cuda) and of the
// PyTorch integration (client/python/flashcp/torch, through the native
// module). Pure; cp_layout_test.cc checks it, including that the bytes it
// moves equal core::AnalyzePlan's prediction.
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

namespace flashcp::worker {

// Encoded source or destination of a row: >= 0 is a local row; < 0 is row
// (-1 - code) of the receive buffer (forward) or of the return buffer
// (backward, same layout). kNoRow marks a padding row of a send block.
inline constexpr int64_t kNoRow = INT64_MIN;
inline int64_t RemoteRow(int64_t recv_row) { return -1 - recv_row; }

struct RowSegment {
  int32_t peer = 0;
  int64_t first = 0;  // first row in its buffer
  int64_t rows = 0;
};

struct GpuRankPlan {
  int32_t rank = 0;
  int32_t size = 1;
  core::CommScheme scheme = core::CommScheme::kAllGather;
  int64_t local_rows = 0;  // C/N

  // Forward exchange. The pack buffer's row i is local row pack_rows[i]
  // (kNoRow: zeros, padding of an all-gather block).
  std::vector<int64_t> pack_rows;
  // full_kv and allgather: one all-gather of equal blocks of block_rows rows;
  // the receive buffer is [size][block_rows] (this rank's block included).
  bool gather = true;
  int64_t block_rows = 0;
  // targeted: the pack buffer is the concatenation of `sends` (dest
  // ascending); the receive buffer the concatenation of `recvs` (source
  // ascending). Gather schemes leave both empty.
  std::vector<RowSegment> sends;
  std::vector<RowSegment> recvs;
  int64_t recv_rows = 0;

  // Attention of shards with no prefix (KV = their own local rows).
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
};

// Builds rank `rank`'s plan; the plan must be valid (InvalidArgument otherwise).
absl::StatusOr<GpuRankPlan> BuildGpuRankPlan(const core::Plan& plan,
                                             const core::CommLayout& layout, int32_t rank,
                                             core::CommScheme scheme);

// Rows this rank sends and receives, forward plus backward (the backward
// return mirrors the forward exchange), under the communicator's counting
// (worker/communicator.h): multiply by 2 * heads_kv * head_dim * 2 bytes.
struct RowCounts {
  int64_t sent = 0;
  int64_t received = 0;
};
RowCounts ExchangedRows(const GpuRankPlan& p);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_CP_LAYOUT_H_
