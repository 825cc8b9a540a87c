#include "worker/cuda/gpu_cp_step.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "worker/cuda/comm_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/cudnn_attention.h"
#include "worker/cuda/masked_attention_kernels.h"

namespace flashcp::worker::cuda {
namespace {

template <typename T>
absl::StatusOr<DeviceBuffer<T>> Upload(const std::vector<T>& host, cudaStream_t stream,
                                       absl::string_view what) {
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<T> d, DeviceBuffer<T>::Allocate(host.size()));
  if (!host.empty()) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T),
                                                 cudaMemcpyHostToDevice, stream),
                                 "upload ", what, " (", host.size() * sizeof(T), " bytes)");
    // Pageable source: wait before the host vector may go away.
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "upload ", what);
  }
  return d;
}

absl::Span<std::byte> Bytes(bf16* p, int64_t elems) {
  return {reinterpret_cast<std::byte*>(p), static_cast<size_t>(elems) * sizeof(bf16)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuCpRank>> GpuCpRank::Create(
    CpRankLayout plan, const AttentionShape& shape, Attention& attention,
    DeviceCommunicator& comm, cudaStream_t compute, const AttentionFactory& head_attention) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  if (plan.collective == Collective::kAllToAll) {
    const AttentionFactory cudnn = [](const AttentionShape& s)
        -> absl::StatusOr<std::unique_ptr<Attention>> {
      FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<CudnnAttention> a, CudnnAttention::Create(s));
      return std::unique_ptr<Attention>(std::move(a));
    };
    FLASHCP_ASSIGN_OR_RETURN(
        std::unique_ptr<GpuAllToAllStep> a2a,
        GpuAllToAllStep::Create(plan, shape, head_attention ? head_attention : cudnn, comm,
                                compute));
    std::unique_ptr<GpuCpRank> r(new GpuCpRank(std::move(plan), shape, attention, comm, compute));
    r->a2a_ = std::move(a2a);
    return r;
  }
  if (plan.block_size > 0 && !plan.whole_len.empty())  // cp_layout.h: none is whole
    return absl::InvalidArgumentError(absl::StrCat(
        "whole_len: a block-diffusion layout has no whole shards, got ", plan.whole_len.size()));
  if (comm.rank() != plan.rank || comm.size() != plan.size)
    return absl::InvalidArgumentError(absl::StrCat("communicator is rank ", comm.rank(), " of ",
                                                   comm.size(), ", plan is rank ", plan.rank,
                                                   " of ", plan.size));
  std::unique_ptr<GpuCpRank> r(new GpuCpRank(std::move(plan), shape, attention, comm, compute));
  FLASHCP_RETURN_IF_ERROR(r->Init());
  return r;
}

absl::Status GpuCpRank::Init() {
  width_ = int64_t{shape_.heads_kv} * shape_.head_dim;
  // The shards tile local rows [0, real_rows_); padding follows (cp_layout_test).
  for (int32_t len : plan_.whole_len) real_rows_ += len;
  for (int32_t len : plan_.prefix_q_len) real_rows_ += len;
  if (real_rows_ > plan_.local_rows)
    return absl::InternalError(absl::StrCat("rank ", plan_.rank, ": shards hold ", real_rows_,
                                            " rows of ", plan_.local_rows));
  const int64_t row2 = 2 * width_;
  if (!plan_.whole_len.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(
        VarlenBatch b, VarlenBatch::Create(plan_.whole_start, plan_.whole_len, plan_.whole_start,
                                           plan_.whole_len, shape_, compute_));
    whole_.emplace(std::move(b));
  }
  if (plan_.block_size > 0) {
    FLASHCP_ASSIGN_OR_RETURN(MaskedBatch m, MaskedBatch::Create(plan_, compute_));
    masked_.emplace(std::move(m));
    FLASHCP_ASSIGN_OR_RETURN(masked_delta_,
                             DeviceBuffer<float>::Allocate(plan_.local_rows * shape_.heads_q));
  } else if (!plan_.prefix_q_len.empty()) {
    std::vector<int64_t> kv_start;
    int64_t at = 0;
    for (int32_t len : plan_.prefix_kv_len) {
      kv_start.push_back(at);
      at += len;
    }
    FLASHCP_ASSIGN_OR_RETURN(
        VarlenBatch b, VarlenBatch::Create(plan_.prefix_q_start, plan_.prefix_q_len, kv_start,
                                           plan_.prefix_kv_len, shape_, compute_));
    prefix_.emplace(std::move(b));
  }
  FLASHCP_ASSIGN_OR_RETURN(d_pack_rows_, Upload(plan_.pack_rows, compute_, "pack rows"));
  FLASHCP_ASSIGN_OR_RETURN(d_stage_src_, Upload(plan_.stage_src, compute_, "stage sources"));
  std::vector<int64_t> round_rows;
  for (const auto& round : plan_.stage_rounds) {
    rounds_.push_back({static_cast<int64_t>(round_rows.size()), static_cast<int64_t>(round.size())});
    round_rows.insert(round_rows.end(), round.begin(), round.end());
  }
  FLASHCP_ASSIGN_OR_RETURN(d_round_rows_, Upload(round_rows, compute_, "scatter rounds"));

  const int64_t pack_rows = static_cast<int64_t>(plan_.pack_rows.size());
  const int64_t stage_rows = static_cast<int64_t>(plan_.stage_src.size());
  FLASHCP_ASSIGN_OR_RETURN(pack_, DeviceBuffer<bf16>::Allocate(pack_rows * row2));
  FLASHCP_ASSIGN_OR_RETURN(back_, DeviceBuffer<bf16>::Allocate(plan_.back_rows * row2));
  FLASHCP_ASSIGN_OR_RETURN(recv_, DeviceBuffer<bf16>::Allocate(plan_.recv_rows * row2));
  FLASHCP_ASSIGN_OR_RETURN(ret_, DeviceBuffer<float>::Allocate(plan_.recv_rows * row2));
  FLASHCP_ASSIGN_OR_RETURN(ret_bf16_, DeviceBuffer<bf16>::Allocate(plan_.recv_rows * row2));
  for (DeviceBuffer<bf16>* b : {&stage_k_, &stage_v_, &gstage_k_, &gstage_v_}) {
    FLASHCP_ASSIGN_OR_RETURN(*b, DeviceBuffer<bf16>::Allocate(stage_rows * width_));
  }
  for (DeviceBuffer<bf16>* b : {&tmp_dk_, &tmp_dv_}) {
    FLASHCP_ASSIGN_OR_RETURN(*b, DeviceBuffer<bf16>::Allocate(plan_.local_rows * width_));
  }
  for (DeviceBuffer<float>* b : {&acc_k_, &acc_v_}) {
    FLASHCP_ASSIGN_OR_RETURN(*b, DeviceBuffer<float>::Allocate(plan_.local_rows * width_));
  }
  FLASHCP_ASSIGN_OR_RETURN(packed_, CudaEvent::Create(false));
  FLASHCP_ASSIGN_OR_RETURN(returned_, CudaEvent::Create(false));
  for (CudaEvent& e : t_) {
    FLASHCP_ASSIGN_OR_RETURN(e, CudaEvent::Create(true));
  }
  return absl::OkStatus();
}

absl::Status GpuCpRank::Forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse) {
  if (a2a_) return a2a_->Forward(q, k, v, o, lse);
  q_ = q, k_ = k, v_ = v, o_ = o, lse_ = lse;
  const int64_t row2 = 2 * width_;
  const int64_t pack_rows = static_cast<int64_t>(plan_.pack_rows.size());
  const std::string ctx = absl::StrCat("CP forward rank ", plan_.rank);
  // 1. Pack what travels; the communicator's stream waits for this only.
  FLASHCP_RETURN_IF_ERROR(LaunchPackKv(k, v, d_pack_rows_.data(), pack_rows, width_, pack_.data(), compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(packed_.get(), compute_), ctx, ": record packed");
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_.stream(), packed_.get(), 0), ctx,
                               ": comm waits for packing");
  // Padding rows (after the shards) get zeros; every other row is written by
  // the attention itself, so a NaN sentinel there catches a row it missed.
  const int64_t pad_rows = plan_.local_rows - real_rows_;
  const int64_t q_row = int64_t{shape_.heads_q} * shape_.head_dim;
  if (pad_rows > 0) {
    FLASHCP_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(o + real_rows_ * q_row, 0, pad_rows * q_row * sizeof(bf16), compute_), ctx,
        ": zero O padding");
    FLASHCP_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(lse + real_rows_ * shape_.heads_q, 0,
                        pad_rows * shape_.heads_q * sizeof(float), compute_),
        ctx, ": zero LSE padding");
  }
  // 2. Whole documents: queued before the exchange, so they run during it.
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[0].get(), compute_), ctx, ": event");
  if (whole_) FLASHCP_RETURN_IF_ERROR(attention_.Forward(*whole_, {q, k, v, o, lse}, compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[1].get(), compute_), ctx, ": event");
  // 3. The exchange (blocks this thread until the data is on the device).
  if (!CallsExchange(plan_)) {
    // Empty all-gather blocks on every rank: nothing travels.
  } else if (plan_.collective == Collective::kAllGather) {
    std::vector<int64_t> counts(plan_.size, plan_.block_rows * row2 * int64_t{sizeof(bf16)});
    FLASHCP_RETURN_IF_ERROR(comm_.AllGatherV(Bytes(pack_.data(), pack_rows * row2),
                                             Bytes(recv_.data(), plan_.recv_rows * row2), counts));
  } else {
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (const RowSegment& s : plan_.sends)
      sends.push_back({s.peer, Bytes(pack_.data() + s.first * row2, s.rows * row2)});
    for (const RowSegment& s : plan_.recvs)
      recvs.push_back({s.peer, Bytes(recv_.data() + s.first * row2, s.rows * row2)});
    FLASHCP_RETURN_IF_ERROR(comm_.SendRecv(sends, recvs));
  }
  // 4. Shards with a prefix: stage [prefix, own] KV, then attend.
  const int64_t stage_rows = static_cast<int64_t>(plan_.stage_src.size());
  FLASHCP_RETURN_IF_ERROR(LaunchStageKv(k, v, recv_.data(), d_stage_src_.data(), stage_rows, width_,
                                        stage_k_.data(), stage_v_.data(), compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[2].get(), compute_), ctx, ": event");
  if (masked_)
    FLASHCP_RETURN_IF_ERROR(LaunchMaskedAttentionForward(shape_, masked_->tables(), q, stage_k_.data(),
                                                         stage_v_.data(), o, lse, compute_));
  else if (prefix_)
    FLASHCP_RETURN_IF_ERROR(
        attention_.Forward(*prefix_, {q, stage_k_.data(), stage_v_.data(), o, lse}, compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[3].get(), compute_), ctx, ": event");
  return absl::OkStatus();
}

absl::Status GpuCpRank::Backward(const bf16* dout, bf16* dq, bf16* dk, bf16* dv) {
  if (a2a_) return a2a_->Backward(dout, dq, dk, dv);
  if (q_ == nullptr) return absl::FailedPreconditionError("CP backward before forward");
  const int64_t row2 = 2 * width_;
  const int64_t kv_elems = plan_.local_rows * width_;
  const std::string ctx = absl::StrCat("CP backward rank ", plan_.rank);
  const int64_t q_row = int64_t{shape_.heads_q} * shape_.head_dim;
  if (plan_.local_rows > real_rows_)  // padding rows only, as in Forward
    FLASHCP_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(dq + real_rows_ * q_row, 0,
                        (plan_.local_rows - real_rows_) * q_row * sizeof(bf16), compute_),
        ctx, ": zero dQ padding");
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc_k_.data(), 0, acc_k_.bytes(), compute_), ctx, ": zero");
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc_v_.data(), 0, acc_v_.bytes(), compute_), ctx, ": zero");
  if (ret_.bytes() > 0)  // no return buffer where nothing was received
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ret_.data(), 0, ret_.bytes(), compute_), ctx, ": zero");
  // 1. Prefixed shards: their gradients of remote rows are what travels.
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[4].get(), compute_), ctx, ": event");
  if (masked_)
    FLASHCP_RETURN_IF_ERROR(LaunchMaskedAttentionBackward(
        shape_, masked_->tables(), q_, stage_k_.data(), stage_v_.data(), o_, lse_, dout, masked_delta_.data(),
        dq, gstage_k_.data(), gstage_v_.data(), compute_));
  else if (prefix_)
    FLASHCP_RETURN_IF_ERROR(attention_.Backward(
        *prefix_,
        {q_, stage_k_.data(), stage_v_.data(), o_, dout, lse_, dq, gstage_k_.data(), gstage_v_.data()},
        compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[5].get(), compute_), ctx, ": event");
  for (const auto& [first, count] : rounds_)
    FLASHCP_RETURN_IF_ERROR(LaunchScatterAddKv(gstage_k_.data(), gstage_v_.data(),
                                               d_round_rows_.data() + first, count,
                                               d_stage_src_.data(), width_, acc_k_.data(),
                                               acc_v_.data(), ret_.data(), compute_));
  FLASHCP_RETURN_IF_ERROR(
      LaunchFloatToBf16(ret_.data(), plan_.recv_rows * row2, ret_bf16_.data(), compute_));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(returned_.get(), compute_), ctx, ": record");
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_.stream(), returned_.get(), 0), ctx,
                               ": comm waits for gradients");
  // 2. Whole documents, queued before the return so they overlap it.
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[6].get(), compute_), ctx, ": event");
  if (whole_) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(tmp_dk_.data(), 0, tmp_dk_.bytes(), compute_), ctx, ": zero");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(tmp_dv_.data(), 0, tmp_dv_.bytes(), compute_), ctx, ": zero");
    FLASHCP_RETURN_IF_ERROR(attention_.Backward(
        *whole_, {q_, k_, v_, o_, dout, lse_, dq, tmp_dk_.data(), tmp_dv_.data()}, compute_));
  }
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(t_[7].get(), compute_), ctx, ": event");
  if (whole_) {
    FLASHCP_RETURN_IF_ERROR(LaunchAccumulateBf16(tmp_dk_.data(), kv_elems, acc_k_.data(), compute_));
    FLASHCP_RETURN_IF_ERROR(LaunchAccumulateBf16(tmp_dv_.data(), kv_elems, acc_v_.data(), compute_));
  }
  // 3. Gradients travel back to their owners, mirroring the forward messages
  // (cp_layout.h: every scheme point to point).
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (const RowSegment& s : plan_.recvs)
    sends.push_back({s.peer, Bytes(ret_bf16_.data() + s.first * row2, s.rows * row2)});
  for (size_t i = 0; i < plan_.sends.size(); ++i)
    recvs.push_back({plan_.sends[i].peer,
                     Bytes(back_.data() + plan_.back_first[i] * row2, plan_.sends[i].rows * row2)});
  if (CallsExchange(plan_)) FLASHCP_RETURN_IF_ERROR(comm_.SendRecv(sends, recvs));
  // 4. Owners add what came back (fp32), one launch per peer: a row may come
  // back from several peers but only once per peer.
  for (size_t i = 0; i < plan_.sends.size(); ++i) {
    const RowSegment& s = plan_.sends[i];
    FLASHCP_RETURN_IF_ERROR(LaunchAccumulateBackKv(back_.data() + plan_.back_first[i] * row2,
                                                   d_pack_rows_.data() + s.first, s.rows, width_,
                                                   acc_k_.data(), acc_v_.data(), compute_));
  }
  FLASHCP_RETURN_IF_ERROR(LaunchFloatToBf16(acc_k_.data(), kv_elems, dk, compute_));
  return LaunchFloatToBf16(acc_v_.data(), kv_elems, dv, compute_);
}

absl::StatusOr<CpAttentionTimes> GpuCpRank::Times() const {
  CpAttentionTimes t;
  if (a2a_) {  // whole documents only
    FLASHCP_ASSIGN_OR_RETURN(t.whole_fwd_ms, a2a_->ForwardMs());
    FLASHCP_ASSIGN_OR_RETURN(t.whole_bwd_ms, a2a_->BackwardMs());
    return t;
  }
  float* out[4] = {&t.whole_fwd_ms, &t.prefix_fwd_ms, &t.prefix_bwd_ms, &t.whole_bwd_ms};
  const int order[4] = {0, 2, 4, 6};
  for (int i = 0; i < 4; ++i) {
    FLASHCP_ASSIGN_OR_RETURN(*out[i], ElapsedMs(t_[order[i]], t_[order[i] + 1]));
  }
  return t;
}

}  // namespace flashcp::worker::cuda
