// One rank's context-parallel attention step, forward and backward: exchange
// exactly the KV the plan says under one communication scheme, attend every
// local shard to [its document's prefix, itself], and return the gradients of
// remote prefix tokens to their owners, who sum them in fp32.
//
// Memory: a rank holds core::TokensPerRank(C, N) rows ([rows][H][D] fp32):
// its shards in plan order at RankLayout::shard_offset, then (on the last
// `padding` ranks) one masked padding row, whose outputs and gradients are 0.
//
// What travels, where it lands, how prefixes are staged and where gradients
// return is the rank's CpRankLayout (cp_layout.h), the same the GPU step and
// the PyTorch integration use; byte counts are core::AnalyzePlan's. The
// forward exchange is one all-gather (full_kv, allgather) or grouped
// send/recv (targeted), as the layout says; the backward return is grouped
// send/recv under every scheme. Shards attend as the layout groups them:
// whole shards on their own rows (zero-copy), prefixed shards on their
// staged [prefix pieces, own rows]. Under all_to_all the step is an
// AllToAllStep (a2a_step.h) with Hq = Hkv = heads, as is a mixed plan's
// two-level group (CreateMixed); the log-sum-exps stay with the heads there,
// so Forward leaves lse 0.
#ifndef FLASHCP_WORKER_ENGINE_H_
#define FLASHCP_WORKER_ENGINE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/analysis.h"
#include "core/rank_groups.h"
#include "core/types.h"
#include "worker/a2a_step.h"
#include "worker/attention_cpu.h"
#include "worker/communicator.h"
#include "worker/cp_layout.h"
#include "worker/thread_pool.h"

namespace flashcp::worker {

class CpAttentionStep {
 public:
  // InvalidArgument for an invalid plan (core::ValidatePlan), a rank outside
  // the plan, or a bad shape.
  static absl::StatusOr<CpAttentionStep> Create(const core::Plan& plan, int32_t rank,
                                                const AttentionShape& shape,
                                                core::CommScheme scheme);

  // A mixed plan (core/rank_groups.h, e.g. core::ChooseGroupSchemes'): each
  // of the plan's rank groups (core::PlanRankGroups, each given once, in any
  // order) runs its own scheme within itself; a rank runs its group's. An
  // all-gather group (full_kv, allgather) sends its blocks point to point
  // among its ranks (BuildCpRankLayout with the group), so no communicator
  // of its own is needed. A two_level group (RankGroup::two_level, scheme
  // all_to_all) runs AllToAllStep::CreateTwoLevel with ranks_per_node (the
  // plan's topology: rank r on node r / ranks_per_node). Every rank makes
  // the same number of communicator calls a phase as the busiest group
  // (targeted and all-gather 1, all_to_all 2, two-level 3; the others pad
  // with empty send/recvs), so the group's calls stay aligned; the bytes are
  // core::GroupedSchemeBytes' with the same ranks_per_node. InvalidArgument
  // where `groups` are not the plan's rank groups or two_level names another
  // scheme than all_to_all; FailedPrecondition naming ranks_per_node (no
  // nodes, a group on one node, unequal node parts) or query_heads (a node
  // part's size not dividing the heads) for this rank's two-level group.
  static absl::StatusOr<CpAttentionStep> CreateMixed(const core::Plan& plan, int32_t rank,
                                                     const AttentionShape& shape,
                                                     const std::vector<core::RankGroup>& groups,
                                                     int32_t ranks_per_node = 0);

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
  CpAttentionStep() = default;
  int64_t RowFloats() const { return int64_t{shape_.heads} * shape_.head_dim; }
  absl::Status CheckComm(const Communicator& comm) const;
  // The kernels' documents: whole shards on k, v (gradients into dk, dv),
  // prefixed shards on stage_k_, stage_v_ (gradients into stage_dk,
  // stage_dv); every gradient span empty for the forward.
  std::vector<DocAttention> Docs(absl::Span<const float> k, absl::Span<const float> v,
                                 absl::Span<float> dk, absl::Span<float> dv,
                                 absl::Span<float> stage_dk, absl::Span<float> stage_dv) const;

  core::Plan plan_;
  core::CommLayout layout_;
  CpRankLayout lay_;
  int32_t rank_ = 0;
  AttentionShape shape_;
  int64_t rows_ = 0, real_rows_ = 0;

  // Forward state kept for Backward.
  bool forward_done_ = false;
  const float* q_ = nullptr;
  const float* o_ = nullptr;
  const float* lse_ = nullptr;
  const float* k_ = nullptr;
  const float* v_ = nullptr;
  std::vector<float> recv_;            // [recv_rows][K | V], then its gradient
  std::vector<float> stage_k_, stage_v_;  // [stage rows][H][D]: staged prefixes
  std::shared_ptr<AllToAllStep> a2a_;  // all_to_all only: the whole step
  int32_t pad_calls_ = 0;  // mixed plans: empty send/recvs after each KV exchange
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_ENGINE_H_
