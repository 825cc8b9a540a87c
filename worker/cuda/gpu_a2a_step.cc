#include "worker/cuda/gpu_a2a_step.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "worker/cuda/a2a_kernels.h"
#include "worker/cuda/comm_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/gpu_cp_step.h"

namespace flashcp::worker::cuda {
namespace {

absl::StatusOr<DeviceBuffer<int64_t>> UploadRows(const std::vector<int64_t>& host,
                                                 cudaStream_t stream, const char* what) {
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<int64_t> d, DeviceBuffer<int64_t>::Allocate(host.size()));
  if (!host.empty()) {
    FLASHCP_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(int64_t),
                        cudaMemcpyHostToDevice, stream),
        "all_to_all: upload ", what, " (", host.size() * sizeof(int64_t), " bytes)");
    // Pageable source: wait before the host vector may go away.
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "all_to_all: upload ", what);
  }
  return d;
}

absl::Span<std::byte> Bytes(bf16* p, int64_t elems) {
  return {reinterpret_cast<std::byte*>(p), static_cast<size_t>(elems) * sizeof(bf16)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuAllToAllStep>> GpuAllToAllStep::Create(
    const CpRankLayout& plan, const AttentionShape& shape, const AttentionFactory& make_attention,
    DeviceCommunicator& comm, cudaStream_t compute) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  if (plan.collective != Collective::kAllToAll)
    return absl::InvalidArgumentError(
        "scheme: GpuAllToAllStep runs all_to_all layouts only (cp_layout.h's a2a part)");
  if (comm.rank() != plan.rank || comm.size() != plan.size)
    return absl::InvalidArgumentError(absl::StrCat("communicator is rank ", comm.rank(), " of ",
                                                   comm.size(), ", plan is rank ", plan.rank,
                                                   " of ", plan.size));
  if (!make_attention)
    return absl::InvalidArgumentError("make_attention: no factory for the position's attention");
  std::unique_ptr<GpuAllToAllStep> s(new GpuAllToAllStep(plan, shape, comm, compute));
  FLASHCP_RETURN_IF_ERROR(s->Init(make_attention));
  return s;
}

GpuAllToAllStep::~GpuAllToAllStep() = default;

absl::Status GpuAllToAllStep::Init(const AttentionFactory& make_attention) {
  const int32_t d = shape_.head_dim;
  FLASHCP_ASSIGN_OR_RETURN(heads_,
                           AllToAllLayoutHeads(A(), shape_.heads_q, shape_.heads_kv, d));
  const int32_t j = Pos(), kk = K();
  const core::HeadRange qj = heads_.query[j], kj = heads_.kv[j];
  hq_ = qj.count;
  hkv_ = kj.count;
  const int32_t per_kv = shape_.heads_q / shape_.heads_kv;
  bool attention_order = hq_ % hkv_ == 0;
  for (int32_t a = 0; a < hq_; ++a) {
    kv_of_.push_back((qj.first + a) / per_kv - kj.first);
    attention_order = attention_order && kv_of_.back() == a / (hq_ / hkv_);
  }
  attn_kv_ = attention_order ? hkv_ : hq_;
  const AttentionShape local{hq_, attn_kv_, d, shape_.scale};
  FLASHCP_ASSIGN_OR_RETURN(attention_, make_attention(local));
  if (A().two_level) {
    if (attn_kv_ != hkv_)
      return absl::UnimplementedError(absl::StrCat(
          "query_heads: two_level on the GPU step needs position ", j, "'s ", hq_,
          " query heads to read its ", hkv_, " KV heads in the attention's order (Hq ",
          shape_.heads_q, ", Hkv ", shape_.heads_kv, ", ", kk, " ranks a node part)"));
    // The KV-row fields and the attention batches over the S head-parallel
    // rows, as a targeted layout of S rows.
    CpRankLayout cross = plan_;
    cross.collective = Collective::kSendRecv;
    cross.scheme = core::CommScheme::kTargeted;
    cross.local_rows = A().rows;
    cross.a2a = AllToAllLayout{};
    FLASHCP_ASSIGN_OR_RETURN(cross_, GpuCpRank::Create(std::move(cross), local, *attention_,
                                                       comm_, compute_));
  } else if (!plan_.whole_len.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(VarlenBatch b,
                             VarlenBatch::Create(plan_.whole_start, plan_.whole_len,
                                                 plan_.whole_start, plan_.whole_len, local,
                                                 compute_));
    docs_.emplace(std::move(b));
  }
  const int64_t s = A().rows, mine = A().tokens[j];
  std::vector<int64_t> inverse(s, 0);
  for (int64_t g = 0; g < s; ++g) inverse[A().doc_row[g]] = g;
  FLASHCP_ASSIGN_OR_RETURN(d_doc_row_, UploadRows(A().doc_row, compute_, "document rows"));
  FLASHCP_ASSIGN_OR_RETURN(d_inverse_, UploadRows(inverse, compute_, "gathered rows"));
  // Per peer i: this rank's tokens of i's heads out (Q | K | V, the widest
  // message either way), and as much back.
  int64_t at = 0;
  for (int32_t i = 0; i < kk; ++i) {
    send_first_.push_back(at);
    if (i != j) at += mine * (heads_.query[i].count + 2 * int64_t{heads_.kv[i].count}) * d;
  }
  ret_first_ = send_first_;
  const int64_t wj = (hq_ + 2 * int64_t{hkv_}) * d;
  const int64_t q_elems = s * hq_ * d, kv_elems = s * attn_kv_ * d;
  const int64_t local_kv = plan_.local_rows * shape_.heads_kv * d;
  FLASHCP_ASSIGN_OR_RETURN(send_, DeviceBuffer<bf16>::Allocate(at));
  FLASHCP_ASSIGN_OR_RETURN(ret_, DeviceBuffer<bf16>::Allocate(at));
  FLASHCP_ASSIGN_OR_RETURN(gathered_, DeviceBuffer<bf16>::Allocate(s * wj));
  FLASHCP_ASSIGN_OR_RETURN(heads_buf_, DeviceBuffer<bf16>::Allocate(s * wj));
  for (DeviceBuffer<bf16>* b : {&qh_, &oh_, &doh_, &dqh_}) {
    FLASHCP_ASSIGN_OR_RETURN(*b, DeviceBuffer<bf16>::Allocate(q_elems));
  }
  for (DeviceBuffer<bf16>* b : {&kh_, &vh_, &dkh_, &dvh_}) {
    FLASHCP_ASSIGN_OR_RETURN(*b, DeviceBuffer<bf16>::Allocate(kv_elems));
  }
  FLASHCP_ASSIGN_OR_RETURN(lseh_, DeviceBuffer<float>::Allocate(s * hq_));
  for (DeviceBuffer<float>* b : {&acc_kh_, &acc_vh_}) {
    FLASHCP_ASSIGN_OR_RETURN(*b, DeviceBuffer<float>::Allocate(s * hkv_ * d));
  }
  for (DeviceBuffer<float>* b : {&acc_k_, &acc_v_}) {
    FLASHCP_ASSIGN_OR_RETURN(*b, DeviceBuffer<float>::Allocate(local_kv));
  }
  FLASHCP_ASSIGN_OR_RETURN(packed_, CudaEvent::Create(false));
  for (CudaEvent& e : t_) {
    FLASHCP_ASSIGN_OR_RETURN(e, CudaEvent::Create(true));
  }
  return absl::OkStatus();
}

absl::Status GpuAllToAllStep::CommWaitsForCompute(const char* what) {
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(packed_.get(), compute_), "all_to_all rank ",
                               plan_.rank, ": record ", what);
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_.stream(), packed_.get(), 0),
                               "all_to_all rank ", plan_.rank, ": comm waits for ", what);
  return absl::OkStatus();
}

absl::Status GpuAllToAllStep::Copy2D(bf16* dst, int64_t dst_pitch, const bf16* src,
                                     int64_t src_pitch, int64_t rows, int64_t width,
                                     const char* what) {
  if (rows <= 0 || width <= 0) return absl::OkStatus();
  constexpr int64_t e = sizeof(bf16);
  FLASHCP_CUDA_RETURN_IF_ERROR(
      cudaMemcpy2DAsync(dst, dst_pitch * e, src, src_pitch * e, width * e, rows,
                        cudaMemcpyDeviceToDevice, compute_),
      "all_to_all rank ", plan_.rank, ": copy ", what, " (", rows, " rows of ", width * e,
      " bytes)");
  return absl::OkStatus();
}

absl::Status GpuAllToAllStep::Forward(const bf16* q, const bf16* k, const bf16* v, bf16* o,
                                      float* lse) {
  forward_done_ = false;
  const int64_t d = shape_.head_dim, hq_all = shape_.heads_q, hkv_all = shape_.heads_kv;
  const int32_t kk = K(), j = Pos();
  const int64_t mine = A().tokens[j], s = A().rows;
  const int64_t eq = hq_ * d, ekv = hkv_ * d, wj = eq + 2 * ekv;
  const std::string ctx = absl::StrCat("all_to_all forward rank ", plan_.rank);
  // 1. Q | K | V of this rank's tokens: each other position's heads into its
  // send block, this position's straight into the gathered rows.
  for (int32_t i = 0; i < kk; ++i) {
    const core::HeadRange qi = heads_.query[i], ki = heads_.kv[i];
    const int64_t wi = (qi.count + 2 * int64_t{ki.count}) * d;
    bf16* dst = i == j ? gathered_.data() + A().first[j] * wj : send_.data() + send_first_[i];
    FLASHCP_RETURN_IF_ERROR(Copy2D(dst, wi, q + qi.first * d, hq_all * d, mine, qi.count * d, "Q"));
    FLASHCP_RETURN_IF_ERROR(Copy2D(dst + qi.count * d, wi, k + ki.first * d, hkv_all * d, mine,
                                   ki.count * d, "K"));
    FLASHCP_RETURN_IF_ERROR(Copy2D(dst + (qi.count + ki.count) * d, wi, v + ki.first * d,
                                   hkv_all * d, mine, ki.count * d, "V"));
  }
  FLASHCP_RETURN_IF_ERROR(CommWaitsForCompute("Q|K|V packing"));
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    const int64_t wi = (heads_.query[i].count + 2 * int64_t{heads_.kv[i].count}) * d;
    sends.push_back({A().group[i], Bytes(send_.data() + send_first_[i], mine * wi)});
    recvs.push_back({A().group[i], Bytes(gathered_.data() + A().first[i] * wj, A().tokens[i] * wj)});
  }
  FLASHCP_RETURN_IF_ERROR(comm_.SendRecv(sends, recvs));
  // 2. Head-parallel rows (document order); Q, K, V apart, KV per query head
  // where the attention's GQA order does not hold.
  FLASHCP_RETURN_IF_ERROR(
      LaunchGatherRowsBf16(gathered_.data(), d_inverse_.data(), s, wj, heads_buf_.data(), compute_));
  FLASHCP_RETURN_IF_ERROR(Copy2D(qh_.data(), eq, heads_buf_.data(), wj, s, eq, "head Q"));
  if (attn_kv_ == hkv_) {
    FLASHCP_RETURN_IF_ERROR(Copy2D(kh_.data(), ekv, heads_buf_.data() + eq, wj, s, ekv, "head K"));
    FLASHCP_RETURN_IF_ERROR(
        Copy2D(vh_.data(), ekv, heads_buf_.data() + eq + ekv, wj, s, ekv, "head V"));
  } else {
    for (int32_t a = 0; a < hq_; ++a) {
      FLASHCP_RETURN_IF_ERROR(Copy2D(kh_.data() + a * d, eq, heads_buf_.data() + eq + kv_of_[a] * d,
                                     wj, s, d, "head K copy"));
      FLASHCP_RETURN_IF_ERROR(Copy2D(vh_.data() + a * d, eq,
                                     heads_buf_.data() + eq + ekv + kv_of_[a] * d, wj, s, d,
                                     "head V copy"));
    }
  }
  // 3. The group's documents, whole (two-level: the node part's runs, prefixes from other
  // nodes staged; GpuCpRank).
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[0].get(), compute_), ctx, ": event");
  if (cross_)
    FLASHCP_RETURN_IF_ERROR(cross_->Forward(qh_.data(), kh_.data(), vh_.data(), oh_.data(),
                                            lseh_.data()));
  else if (docs_)
    FLASHCP_RETURN_IF_ERROR(
        attention_->Forward(*docs_, {qh_.data(), kh_.data(), vh_.data(), oh_.data(), lseh_.data()},
                            compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[1].get(), compute_), ctx, ": event");
  // 4. Output rows back to their owners (gathered order, this position's heads).
  FLASHCP_RETURN_IF_ERROR(
      LaunchGatherRowsBf16(oh_.data(), d_doc_row_.data(), s, eq, heads_buf_.data(), compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(o, 0, plan_.local_rows * hq_all * d * sizeof(bf16), compute_), ctx,
      ": zero O");
  FLASHCP_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(lse, 0, plan_.local_rows * hq_all * sizeof(float), compute_), ctx,
      ": zero LSE (the log-sum-exps stay with the heads)");
  FLASHCP_RETURN_IF_ERROR(CommWaitsForCompute("O rows"));
  sends.clear();
  recvs.clear();
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    sends.push_back({A().group[i], Bytes(heads_buf_.data() + A().first[i] * eq, A().tokens[i] * eq)});
    recvs.push_back({A().group[i],
                     Bytes(ret_.data() + ret_first_[i], mine * heads_.query[i].count * d)});
  }
  FLASHCP_RETURN_IF_ERROR(comm_.SendRecv(sends, recvs));
  for (int32_t i = 0; i < kk; ++i) {
    const core::HeadRange qi = heads_.query[i];
    const bf16* src = i == j ? heads_buf_.data() + A().first[j] * eq : ret_.data() + ret_first_[i];
    FLASHCP_RETURN_IF_ERROR(
        Copy2D(o + qi.first * d, hq_all * d, src, qi.count * d, mine, qi.count * d, "O"));
  }
  forward_done_ = true;
  return absl::OkStatus();
}

// Rows [dQ | dK | dV] of this position's heads into heads_buf_, head-parallel
// order; where each query head had its own copy of its KV head, the copies'
// gradients are summed onto the KV head in fp32 (then rounded to bf16).
absl::Status GpuAllToAllStep::PackHeadGradientRows() {
  const int64_t d = shape_.head_dim, s = A().rows;
  const int64_t eq = hq_ * d, ekv = hkv_ * d, wj = eq + 2 * ekv;
  const std::string ctx = absl::StrCat("all_to_all backward rank ", plan_.rank);
  FLASHCP_RETURN_IF_ERROR(Copy2D(heads_buf_.data(), wj, dqh_.data(), eq, s, eq, "dQ rows"));
  if (attn_kv_ == hkv_) {
    FLASHCP_RETURN_IF_ERROR(Copy2D(heads_buf_.data() + eq, wj, dkh_.data(), ekv, s, ekv, "dK rows"));
    FLASHCP_RETURN_IF_ERROR(
        Copy2D(heads_buf_.data() + eq + ekv, wj, dvh_.data(), ekv, s, ekv, "dV rows"));
  } else {
    for (DeviceBuffer<float>* b : {&acc_kh_, &acc_vh_})
      FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->data(), 0, b->bytes(), compute_), ctx,
                                   ": zero");
    for (int32_t a = 0; a < hq_; ++a) {
      FLASHCP_RETURN_IF_ERROR(LaunchAccumulateBf16Strided(dkh_.data() + a * d, eq, s, d,
                                                          acc_kh_.data() + kv_of_[a] * d, ekv,
                                                          compute_));
      FLASHCP_RETURN_IF_ERROR(LaunchAccumulateBf16Strided(dvh_.data() + a * d, eq, s, d,
                                                          acc_vh_.data() + kv_of_[a] * d, ekv,
                                                          compute_));
    }
    // doh_ ([S][hq_][D] >= [S][hkv_][D]) is free once the backward is queued.
    FLASHCP_RETURN_IF_ERROR(LaunchFloatToBf16(acc_kh_.data(), s * ekv, doh_.data(), compute_));
    FLASHCP_RETURN_IF_ERROR(Copy2D(heads_buf_.data() + eq, wj, doh_.data(), ekv, s, ekv, "dK rows"));
    FLASHCP_RETURN_IF_ERROR(LaunchFloatToBf16(acc_vh_.data(), s * ekv, doh_.data(), compute_));
    FLASHCP_RETURN_IF_ERROR(
        Copy2D(heads_buf_.data() + eq + ekv, wj, doh_.data(), ekv, s, ekv, "dV rows"));
  }
  return absl::OkStatus();
}

absl::Status GpuAllToAllStep::Backward(const bf16* dout, bf16* dq, bf16* dk, bf16* dv) {
  if (!forward_done_)
    return absl::FailedPreconditionError("all_to_all backward: no successful forward");
  forward_done_ = false;  // one backward per forward
  const int64_t d = shape_.head_dim, hq_all = shape_.heads_q, hkv_all = shape_.heads_kv;
  const int32_t kk = K(), j = Pos();
  const int64_t mine = A().tokens[j], s = A().rows;
  const int64_t eq = hq_ * d, ekv = hkv_ * d, wj = eq + 2 * ekv;
  const std::string ctx = absl::StrCat("all_to_all backward rank ", plan_.rank);
  // 1. dO as Q went (gathered rows of width eq).
  for (int32_t i = 0; i < kk; ++i) {
    const core::HeadRange qi = heads_.query[i];
    bf16* dst = i == j ? gathered_.data() + A().first[j] * eq : send_.data() + send_first_[i];
    FLASHCP_RETURN_IF_ERROR(
        Copy2D(dst, qi.count * d, dout + qi.first * d, hq_all * d, mine, qi.count * d, "dO"));
  }
  FLASHCP_RETURN_IF_ERROR(CommWaitsForCompute("dO packing"));
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    sends.push_back({A().group[i], Bytes(send_.data() + send_first_[i],
                                         mine * heads_.query[i].count * d)});
    recvs.push_back({A().group[i], Bytes(gathered_.data() + A().first[i] * eq, A().tokens[i] * eq)});
  }
  FLASHCP_RETURN_IF_ERROR(comm_.SendRecv(sends, recvs));
  FLASHCP_RETURN_IF_ERROR(
      LaunchGatherRowsBf16(gathered_.data(), d_inverse_.data(), s, eq, doh_.data(), compute_));
  // 2. The attention's backward.
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[2].get(), compute_), ctx, ": event");
  if (cross_)
    FLASHCP_RETURN_IF_ERROR(cross_->Backward(doh_.data(), dqh_.data(), dkh_.data(), dvh_.data()));
  else if (docs_)
    FLASHCP_RETURN_IF_ERROR(attention_->Backward(
        *docs_, {qh_.data(), kh_.data(), vh_.data(), oh_.data(), doh_.data(), lseh_.data(),
                 dqh_.data(), dkh_.data(), dvh_.data()},
        compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[3].get(), compute_), ctx, ": event");
  // 3. Rows [dQ | dK | dV] of this position's heads, head-parallel order.
  FLASHCP_RETURN_IF_ERROR(PackHeadGradientRows());
  // 4. Back to the owners (gathered order).
  FLASHCP_RETURN_IF_ERROR(
      LaunchGatherRowsBf16(heads_buf_.data(), d_doc_row_.data(), s, wj, gathered_.data(), compute_));
  FLASHCP_RETURN_IF_ERROR(CommWaitsForCompute("gradient rows"));
  sends.clear();
  recvs.clear();
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    const int64_t wi = (heads_.query[i].count + 2 * int64_t{heads_.kv[i].count}) * d;
    sends.push_back({A().group[i], Bytes(gathered_.data() + A().first[i] * wj, A().tokens[i] * wj)});
    recvs.push_back({A().group[i], Bytes(ret_.data() + ret_first_[i], mine * wi)});
  }
  FLASHCP_RETURN_IF_ERROR(comm_.SendRecv(sends, recvs));
  // 5. Each owner: dQ per position's heads; dK, dV summed over the positions
  // in order, in fp32, rounded once.
  FLASHCP_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dq, 0, plan_.local_rows * hq_all * d * sizeof(bf16), compute_), ctx,
      ": zero dQ");
  for (DeviceBuffer<float>* b : {&acc_k_, &acc_v_})
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->data(), 0, b->bytes(), compute_), ctx,
                                 ": zero");
  for (int32_t i = 0; i < kk; ++i) {
    const core::HeadRange qi = heads_.query[i], ki = heads_.kv[i];
    const int64_t wi = (qi.count + 2 * int64_t{ki.count}) * d;
    const bf16* src = i == j ? gathered_.data() + A().first[j] * wj : ret_.data() + ret_first_[i];
    FLASHCP_RETURN_IF_ERROR(
        Copy2D(dq + qi.first * d, hq_all * d, src, wi, mine, qi.count * d, "dQ"));
    FLASHCP_RETURN_IF_ERROR(LaunchAccumulateBf16Strided(src + qi.count * d, wi, mine,
                                                        ki.count * d, acc_k_.data() + ki.first * d,
                                                        hkv_all * d, compute_));
    FLASHCP_RETURN_IF_ERROR(LaunchAccumulateBf16Strided(
        src + (qi.count + ki.count) * d, wi, mine, ki.count * d, acc_v_.data() + ki.first * d,
        hkv_all * d, compute_));
  }
  const int64_t kv_elems = plan_.local_rows * hkv_all * d;
  FLASHCP_RETURN_IF_ERROR(LaunchFloatToBf16(acc_k_.data(), kv_elems, dk, compute_));
  return LaunchFloatToBf16(acc_v_.data(), kv_elems, dv, compute_);
}

absl::StatusOr<float> GpuAllToAllStep::ForwardMs() const { return ElapsedMs(t_[0], t_[1]); }
absl::StatusOr<float> GpuAllToAllStep::BackwardMs() const { return ElapsedMs(t_[2], t_[3]); }

}  // namespace flashcp::worker::cuda
