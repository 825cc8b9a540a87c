// One rank's context-parallel attention step, forward and backward: exchange
// exactly the KV the plan says under one communication scheme, attend every
// local shard to [its document's prefix, itself], and return the gradients of
// remote prefix tokens to their owners, who sum them in fp32.
//
// Memory: a rank holds core::TokensPerRank(C, N) rows ([rows][H][D] fp32):
// its shards in plan order at RankLayout::shard_offset, then (on the last
// `padding` ranks) one masked padding row, whose outputs and gradients are 0.
//
// Schemes (core::CommScheme; byte counts are core::AnalyzePlan's):
//  - kFullKv: all-gather every rank's [K rows; V rows] (C/N rows each);
//    backward reduce-scatters the dK, dV of all C/N rows the same way.
//  - kAllGather: all-gather each rank's compacted buffer (RankLayout::send:
//    its non-last shards), padded to the largest; reduce-scatter backward.
//  - kTargeted: grouped send/recv of exactly RankLayout::targeted; backward
//    sends the gradients of what each rank received back to its owner.
#ifndef FLASHCP_WORKER_ENGINE_H_
#define FLASHCP_WORKER_ENGINE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/analysis.h"
#include "core/types.h"
#include "worker/attention_cpu.h"
#include "worker/communicator.h"
#include "worker/thread_pool.h"

namespace flashcp::worker {

class CpAttentionStep {
 public:
  // InvalidArgument for an invalid plan (core::ValidatePlan), a rank outside
  // the plan, or a bad shape.
  static absl::StatusOr<CpAttentionStep> Create(const core::Plan& plan, int32_t rank,
                                                const AttentionShape& shape,
                                                core::CommScheme scheme);

  int64_t local_rows() const { return rows_; }
  int64_t real_rows() const { return real_rows_; }
  const core::CommLayout& layout() const { return layout_; }

  // q, k, v, o: [local_rows][H][D]; lse: [local_rows][H]. q, k, v, o and lse
  // must stay alive and unchanged until Backward (activations kept for the
  // backward pass). `comm` must be this plan's group with this rank.
  absl::Status Forward(Communicator& comm, ThreadPool& pool, absl::Span<const float> q,
                       absl::Span<const float> k, absl::Span<const float> v,
                       absl::Span<float> o, absl::Span<float> lse);

  // After Forward: given dout, writes dq, dk, dv ([local_rows][H][D]); dk, dv
  // include every other rank's contribution to this rank's tokens.
  absl::Status Backward(Communicator& comm, ThreadPool& pool, absl::Span<const float> dout,
                        absl::Span<float> dq, absl::Span<float> dk, absl::Span<float> dv);

 private:
  // Where a remote piece's rows sit in the receive buffer (and, mirrored, in
  // the gradient buffer): K at k_offset, V at v_offset (floats), `len` rows.
  struct RemoteRows {
    int64_t k_offset = 0, v_offset = 0;
  };
  // A document this rank holds a shard of.
  struct LocalDoc {
    int32_t doc = 0;
    int32_t last_pos = 0;     // position of this rank's last piece of the document
    int64_t kv_len = 0;       // keys [0, kv_len): pieces 0..last_pos
    int64_t ctx_offset = -1;  // row offset in ctx_ buffers; -1: zero-copy (piece 0 only)
    std::vector<QueryRange> queries;
  };

  CpAttentionStep() = default;
  int64_t RowFloats() const { return int64_t{shape_.heads} * shape_.head_dim; }
  // Offsets, in floats, of a remote piece in recv_ (shard index `s`, owner `src`).
  RemoteRows Locate(int32_t shard) const;
  absl::Status CheckComm(const Communicator& comm) const;
  absl::Status ExchangeForward(Communicator& comm, absl::Span<const float> k,
                               absl::Span<const float> v);
  absl::Status ExchangeBackward(Communicator& comm, absl::Span<float> dk, absl::Span<float> dv);
  std::vector<DocAttention> Docs(absl::Span<const float> k, absl::Span<const float> v,
                                 absl::Span<float> dk, absl::Span<float> dv);

  core::Plan plan_;
  core::CommLayout layout_;
  int32_t rank_ = 0;
  AttentionShape shape_;
  core::CommScheme scheme_ = core::CommScheme::kFullKv;
  int64_t rows_ = 0, real_rows_ = 0;
  int64_t max_send_ = 0;                 // max_j send_tokens (allgather block rows)
  std::vector<int64_t> shard_row_;       // per plan shard: first row in its owner's memory
  // kTargeted: per source rank, float offset of its message in recv_, and per
  // (source, send index) the row of that range within the message.
  std::vector<int64_t> msg_offset_, msg_rows_;
  std::vector<std::vector<int64_t>> msg_row_of_send_;
  std::vector<LocalDoc> docs_;
  int64_t ctx_rows_ = 0;

  // Forward state kept for Backward.
  bool forward_done_ = false;
  const float* q_ = nullptr;
  const float* o_ = nullptr;
  const float* lse_ = nullptr;
  const float* k_ = nullptr;
  const float* v_ = nullptr;
  std::vector<float> recv_;          // received KV, layout per scheme (Locate)
  std::vector<float> ctx_k_, ctx_v_; // copied document contexts
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_ENGINE_H_
