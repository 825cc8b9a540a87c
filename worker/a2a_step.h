// One rank's attention step under the all-to-all (Ulysses) scheme, forward
// and backward, on the CPU kernels, GQA included (Hq query heads, Hkv KV
// heads, Hkv | Hq). The layout is cp_layout.h's (scheme all_to_all, its a2a
// part, a2a_layout.h); the heads position j computes are
// core::AllToAllGroupHeads'. Per phase, within the rank's group of K:
//   forward:  Q, K, V rows of its real tokens for every other position's
//             heads out, the group's other tokens of its own heads in (one
//             grouped send/recv); attention of the group's documents whole;
//             the output rows back to their owners (a second send/recv);
//   backward: dO the same way as Q; the kernels' backward; dQ, dK, dV back
//             to their owners, who sum a replicated KV head's gradients in
//             fp32, position by position.
// The communicator counts exactly core::AnalyzePlan's bytes[kAllToAll] with
// dtype_bytes 4 (rank_groups.h's rows x D x 4). The log-sum-exps stay with
// the heads (the output exchange carries O only): Forward returns none.
// Groups of one move nothing but still make the (empty) calls, so every
// rank's sequence of operations stays aligned.
//
// The two-level scheme (CreateTwoLevel; core/two_level.h,
// two_level_layout.h) is this step over the rank's node part, with one more
// grouped send/recv a phase between the head exchanges: forward, the KV of
// this position's heads that the same position on other nodes needs;
// backward, those rows' gradients back to their owners (summed in fp32 onto
// the head-parallel gradients before they return to the tokens' owners).
// Bytes: core::TwoLevelGroupPhase's, forward plus backward.
#ifndef FLASHCP_WORKER_A2A_STEP_H_
#define FLASHCP_WORKER_A2A_STEP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/rank_groups.h"
#include "core/types.h"
#include "worker/attention_cpu.h"
#include "worker/communicator.h"
#include "worker/cp_layout.h"
#include "worker/thread_pool.h"
#include "worker/two_level_layout.h"

namespace flashcp::worker {

struct HeadShape {
  int32_t query_heads = 1;  // Hq
  int32_t kv_heads = 1;     // Hkv; query head h reads KV head h / (Hq / Hkv)
  int32_t head_dim = 1;     // D
  float scale = 1.0f;       // softmax scale
};

class AllToAllStep {
 public:
  // InvalidArgument for an invalid plan, a rank outside it or a bad shape;
  // FailedPrecondition naming query_heads where the rank's group size does
  // not divide Hq.
  static absl::StatusOr<AllToAllStep> Create(const core::Plan& plan, int32_t rank,
                                             const HeadShape& shape);
  // The two-level scheme over `group` (a mixed plan's rank group holding
  // `rank`): BuildTwoLevelRankLayout's errors (FailedPrecondition naming
  // ranks_per_node), FailedPrecondition naming query_heads where the node
  // part's size does not divide Hq; otherwise as Create.
  static absl::StatusOr<AllToAllStep> CreateTwoLevel(const core::Plan& plan, int32_t rank,
                                                     const HeadShape& shape,
                                                     const std::vector<int32_t>& group,
                                                     int32_t ranks_per_node);

  // Mixed plans: empty send/recvs at the end of each phase, so that this
  // rank makes as many communicator calls as the plan's busiest group.
  void set_pad_calls(int32_t calls) { pad_calls_ = calls; }
  // Grouped send/recvs a phase makes (pads excluded): 2, or 3 two-level.
  int32_t calls_per_phase() const { return lay_.a2a.two_level ? 3 : 2; }

  int64_t local_rows() const { return lay_.local_rows; }
  const CpRankLayout& layout() const { return lay_; }
  const core::AllToAllHeads& heads() const { return heads_; }

  // q, o: [local_rows][Hq][D]; k, v: [local_rows][Hkv][D]. The padding row's
  // output is 0. `comm` must be the plan's group with this rank.
  absl::Status Forward(Communicator& comm, ThreadPool& pool, absl::Span<const float> q,
                       absl::Span<const float> k, absl::Span<const float> v,
                       absl::Span<float> o);
  // After Forward: dq [local_rows][Hq][D], dk, dv [local_rows][Hkv][D]
  // (overwritten; every position's contribution summed in).
  absl::Status Backward(Communicator& comm, ThreadPool& pool, absl::Span<const float> dout,
                        absl::Span<float> dq, absl::Span<float> dk, absl::Span<float> dv);

 private:
  AllToAllStep() = default;
  static absl::StatusOr<AllToAllStep> Make(const core::Plan& plan, int32_t rank,
                                           const HeadShape& shape, CpRankLayout lay);
  bool TwoLevel() const { return lay_.a2a.two_level; }
  // Two-level: [K | V] rows (this position's heads) of pack_rows of kh, vh
  // to the same position on other nodes; the received rows into cross_.
  absl::Status CrossForward(Communicator& comm, const std::vector<float>& kh,
                            const std::vector<float>& vh);
  // Expands staged row sources (kh, vh or cross_) to hq_ heads into skx_, svx_.
  void Stage(const std::vector<float>& kh, const std::vector<float>& vh);
  // Two-level backward: the staged rows' gradients (expanded heads) summed
  // onto `grad` rows ([dQ | dK | dV]) or returned to their owners, and what
  // comes back added onto the rows it carried.
  absl::Status CrossBackward(Communicator& comm, const std::vector<float>& gsk,
                             const std::vector<float>& gsv, std::vector<float>& grad);
  absl::Status Pad(Communicator& comm) const;
  const AllToAllLayout& A() const { return lay_.a2a; }
  int32_t Pos() const { return lay_.a2a.position; }
  int32_t K() const { return static_cast<int32_t>(lay_.a2a.group.size()); }
  absl::Status CheckComm(const Communicator& comm) const;
  // Whole runs on kx_, vx_; two-level prefixed runs on skx_, svx_ (their
  // gradients into dsk, dsv). Null gradients for the forward.
  std::vector<DocAttention> Docs(float* dk, float* dv, float* dsk, float* dsv) const;
  // Local KV head of expanded query head a of this position.
  int32_t KvOf(int32_t a) const;

  CpRankLayout lay_;
  HeadShape shape_;
  core::AllToAllHeads heads_;
  int32_t rank_ = 0, size_ = 1;
  int32_t hq_ = 0, hkv_ = 0;  // this position's query and KV heads

  // Forward state for Backward, head-parallel rows in document order.
  bool forward_done_ = false;
  std::vector<float> qh_, kx_, vx_, oh_, lseh_;  // kx_, vx_: KV expanded to hq_ heads
  // Two-level: received [K | V] rows of this position's heads, and the
  // prefixed runs' staged KV expanded to hq_ heads.
  std::vector<float> cross_, skx_, svx_;
  int32_t pad_calls_ = 0;
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_A2A_STEP_H_
