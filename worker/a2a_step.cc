#include "worker/a2a_step.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/status_macros.h"

namespace flashcp::worker {
namespace {

absl::Span<std::byte> Bytes(std::vector<float>& f) {
  return absl::MakeSpan(reinterpret_cast<std::byte*>(f.data()), f.size() * sizeof(float));
}

absl::Status CheckSize(absl::string_view name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", got, " floats, expected ", want));
}

void Copy(float* dst, const float* src, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void AddTo(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

absl::Status CheckShape(const HeadShape& shape) {
  if (shape.query_heads < 1 || shape.kv_heads < 1 || shape.head_dim < 1 ||
      !(shape.scale > 0.0f) || shape.query_heads % shape.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape: query_heads ", shape.query_heads, ", kv_heads ", shape.kv_heads, ", head_dim ",
        shape.head_dim, ", scale ", shape.scale,
        " (each must be positive, kv_heads dividing query_heads)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AllToAllStep> AllToAllStep::Create(const core::Plan& plan, int32_t rank,
                                                  const HeadShape& shape) {
  FLASHCP_RETURN_IF_ERROR(CheckShape(shape));
  FLASHCP_ASSIGN_OR_RETURN(const core::CommLayout layout, core::BuildCommLayout(plan));
  if (rank < 0 || rank >= plan.cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " outside a group of ", plan.cp_size));
  }
  FLASHCP_ASSIGN_OR_RETURN(CpRankLayout lay,
                           BuildCpRankLayout(plan, layout, rank, core::CommScheme::kAllToAll));
  return Make(plan, rank, shape, std::move(lay));
}

absl::StatusOr<AllToAllStep> AllToAllStep::CreateTwoLevel(const core::Plan& plan, int32_t rank,
                                                          const HeadShape& shape,
                                                          const std::vector<int32_t>& group,
                                                          int32_t ranks_per_node) {
  FLASHCP_RETURN_IF_ERROR(CheckShape(shape));
  FLASHCP_ASSIGN_OR_RETURN(const core::CommLayout layout, core::BuildCommLayout(plan));
  FLASHCP_ASSIGN_OR_RETURN(CpRankLayout lay,
                           BuildTwoLevelRankLayout(plan, layout, rank, group, ranks_per_node));
  return Make(plan, rank, shape, std::move(lay));
}

absl::StatusOr<AllToAllStep> AllToAllStep::Make(const core::Plan& plan, int32_t rank,
                                                const HeadShape& shape, CpRankLayout lay) {
  AllToAllStep step;
  step.lay_ = std::move(lay);
  FLASHCP_ASSIGN_OR_RETURN(step.heads_, AllToAllLayoutHeads(step.lay_.a2a, shape.query_heads,
                                                            shape.kv_heads, shape.head_dim));
  step.shape_ = shape;
  step.rank_ = rank;
  step.size_ = plan.cp_size;
  step.hq_ = step.heads_.query[step.Pos()].count;
  step.hkv_ = step.heads_.kv[step.Pos()].count;
  return step;
}

absl::Status AllToAllStep::CheckComm(const Communicator& comm) const {
  if (comm.size() != size_ || comm.rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("communicator is rank ", comm.rank(), " of ",
                                                   comm.size(), "; the step is rank ", rank_,
                                                   " of ", size_));
  }
  return absl::OkStatus();
}

int32_t AllToAllStep::KvOf(int32_t a) const {
  const int32_t per_kv = shape_.query_heads / shape_.kv_heads;
  return (heads_.query[Pos()].first + a) / per_kv - heads_.kv[Pos()].first;
}

std::vector<DocAttention> AllToAllStep::Docs(float* dk, float* dv, float* dsk,
                                             float* dsv) const {
  const int64_t e = int64_t{hq_} * shape_.head_dim;
  std::vector<DocAttention> docs;
  for (size_t i = 0; i < lay_.whole_start.size(); ++i) {
    const int64_t row = lay_.whole_start[i], len = lay_.whole_len[i];
    docs.push_back(DocAttention{kx_.data() + row * e, vx_.data() + row * e, len, {{row, 0, len}},
                                dk ? dk + row * e : nullptr, dv ? dv + row * e : nullptr});
  }
  int64_t at = 0;  // first staged row of the run
  for (size_t i = 0; i < lay_.prefix_q_start.size(); ++i) {
    const int64_t kv = lay_.prefix_kv_len[i], len = lay_.prefix_q_len[i];
    docs.push_back(DocAttention{skx_.data() + at * e, svx_.data() + at * e, kv,
                                {{lay_.prefix_q_start[i], kv - len, len}},
                                dsk ? dsk + at * e : nullptr, dsv ? dsv + at * e : nullptr});
    at += kv;
  }
  return docs;
}

absl::Status AllToAllStep::Pad(Communicator& comm) const {
  for (int32_t i = 0; i < pad_calls_; ++i) FLASHCP_RETURN_IF_ERROR(comm.SendRecv({}, {}));
  return absl::OkStatus();
}

absl::Status AllToAllStep::CrossForward(Communicator& comm, const std::vector<float>& kh,
                                        const std::vector<float>& vh) {
  const int64_t ekv = int64_t{hkv_} * shape_.head_dim, row2 = 2 * ekv;
  std::vector<float> pack(lay_.pack_rows.size() * row2);
  for (size_t i = 0; i < lay_.pack_rows.size(); ++i) {
    Copy(pack.data() + i * row2, kh.data() + lay_.pack_rows[i] * ekv, ekv);
    Copy(pack.data() + i * row2 + ekv, vh.data() + lay_.pack_rows[i] * ekv, ekv);
  }
  cross_.assign(lay_.recv_rows * row2, 0.0f);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  const size_t row_bytes = row2 * sizeof(float);
  for (const RowSegment& g : lay_.sends)
    sends.push_back(SendOp{g.peer, absl::MakeConstSpan(Bytes(pack)).subspan(g.first * row_bytes,
                                                                            g.rows * row_bytes)});
  for (const RowSegment& g : lay_.recvs)
    recvs.push_back(
        RecvOp{g.peer, Bytes(cross_).subspan(g.first * row_bytes, g.rows * row_bytes)});
  return comm.SendRecv(sends, recvs);
}

void AllToAllStep::Stage(const std::vector<float>& kh, const std::vector<float>& vh) {
  const int64_t d = shape_.head_dim, ekv = hkv_ * d, eq = hq_ * d, row2 = 2 * ekv;
  const int64_t staged = static_cast<int64_t>(lay_.stage_src.size());
  skx_.assign(staged * eq, 0.0f);
  svx_.assign(staged * eq, 0.0f);
  for (int64_t x = 0; x < staged; ++x) {
    const int64_t src = lay_.stage_src[x];
    const float* kf = src >= 0 ? kh.data() + src * ekv : cross_.data() + (-1 - src) * row2;
    const float* vf = src >= 0 ? vh.data() + src * ekv : cross_.data() + (-1 - src) * row2 + ekv;
    for (int32_t h = 0; h < hq_; ++h) {
      Copy(skx_.data() + (x * hq_ + h) * d, kf + KvOf(h) * d, d);
      Copy(svx_.data() + (x * hq_ + h) * d, vf + KvOf(h) * d, d);
    }
  }
}

absl::Status AllToAllStep::CrossBackward(Communicator& comm, const std::vector<float>& gsk,
                                         const std::vector<float>& gsv,
                                         std::vector<float>& grad) {
  const int64_t d = shape_.head_dim, ekv = hkv_ * d, eq = hq_ * d, row2 = 2 * ekv;
  const int64_t w = eq + 2 * ekv;  // a grad row: [dQ | dK | dV]
  std::fill(cross_.begin(), cross_.end(), 0.0f);  // now the received rows' gradients
  const int64_t staged = static_cast<int64_t>(lay_.stage_src.size());
  for (int64_t x = 0; x < staged; ++x) {
    const int64_t dst = lay_.stage_src[x];
    float* tk = dst >= 0 ? grad.data() + dst * w + eq : cross_.data() + (-1 - dst) * row2;
    float* tv = tk + ekv;
    for (int32_t h = 0; h < hq_; ++h) {
      AddTo(tk + KvOf(h) * d, gsk.data() + (x * hq_ + h) * d, d);
      AddTo(tv + KvOf(h) * d, gsv.data() + (x * hq_ + h) * d, d);
    }
  }
  std::vector<float> back(lay_.back_rows * row2);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  const size_t row_bytes = row2 * sizeof(float);
  for (const RowSegment& g : lay_.recvs)
    sends.push_back(SendOp{g.peer, absl::MakeConstSpan(Bytes(cross_)).subspan(
                                       g.first * row_bytes, g.rows * row_bytes)});
  for (size_t i = 0; i < lay_.sends.size(); ++i)
    recvs.push_back(RecvOp{lay_.sends[i].peer,
                           Bytes(back).subspan(lay_.back_first[i] * row_bytes,
                                               lay_.sends[i].rows * row_bytes)});
  FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
  for (size_t i = 0; i < lay_.sends.size(); ++i) {
    const RowSegment& g = lay_.sends[i];
    for (int64_t t = 0; t < g.rows; ++t) {
      const float* from = back.data() + (lay_.back_first[i] + t) * row2;
      float* to = grad.data() + lay_.pack_rows[g.first + t] * w + eq;
      AddTo(to, from, row2);  // [dK | dV] adjacent in both
    }
  }
  return absl::OkStatus();
}

absl::Status AllToAllStep::Forward(Communicator& comm, ThreadPool& pool,
                                   absl::Span<const float> q, absl::Span<const float> k,
                                   absl::Span<const float> v, absl::Span<float> o) {
  const int64_t d = shape_.head_dim, rows = lay_.local_rows;
  const int64_t hq_all = shape_.query_heads, hkv_all = shape_.kv_heads;
  FLASHCP_RETURN_IF_ERROR(CheckComm(comm));
  FLASHCP_RETURN_IF_ERROR(CheckSize("q", q.size(), rows * hq_all * d));
  FLASHCP_RETURN_IF_ERROR(CheckSize("k", k.size(), rows * hkv_all * d));
  FLASHCP_RETURN_IF_ERROR(CheckSize("v", v.size(), rows * hkv_all * d));
  FLASHCP_RETURN_IF_ERROR(CheckSize("o", o.size(), rows * hq_all * d));
  forward_done_ = false;
  const AllToAllLayout& a = A();
  const int32_t kk = K(), j = Pos();
  const int64_t mine = a.tokens[j], s = a.rows;
  // 1. Q | K | V of this rank's tokens for each other position's heads; the
  // group's other tokens of this position's heads in.
  std::vector<std::vector<float>> out(kk), in(kk);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    const core::HeadRange qi = heads_.query[i], ki = heads_.kv[i];
    const int64_t w = (qi.count + 2 * int64_t{ki.count}) * d;
    out[i].resize(mine * w);
    for (int64_t r = 0; r < mine; ++r) {
      float* dst = out[i].data() + r * w;
      Copy(dst, q.data() + (r * hq_all + qi.first) * d, qi.count * d);
      Copy(dst + qi.count * d, k.data() + (r * hkv_all + ki.first) * d, ki.count * d);
      Copy(dst + (qi.count + ki.count) * d, v.data() + (r * hkv_all + ki.first) * d, ki.count * d);
    }
    in[i].resize(a.tokens[i] * (hq_ + 2 * int64_t{hkv_}) * d);
    sends.push_back(SendOp{a.group[i], Bytes(out[i])});
    recvs.push_back(RecvOp{a.group[i], Bytes(in[i])});
  }
  FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
  // 2. Head-parallel Q, K, V in document order; K, V expanded to hq_ heads.
  const core::HeadRange qj = heads_.query[j], kj = heads_.kv[j];
  const int64_t eq = hq_ * d, ekv = hkv_ * d;
  qh_.assign(s * eq, 0.0f);
  std::vector<float> kh(s * ekv), vh(s * ekv);
  for (int32_t p = 0; p < kk; ++p) {
    for (int64_t r = 0; r < a.tokens[p]; ++r) {
      const int64_t row = a.doc_row[a.first[p] + r];
      if (p == j) {
        Copy(qh_.data() + row * eq, q.data() + (r * hq_all + qj.first) * d, eq);
        Copy(kh.data() + row * ekv, k.data() + (r * hkv_all + kj.first) * d, ekv);
        Copy(vh.data() + row * ekv, v.data() + (r * hkv_all + kj.first) * d, ekv);
      } else {
        const float* src = in[p].data() + r * (eq + 2 * ekv);
        Copy(qh_.data() + row * eq, src, eq);
        Copy(kh.data() + row * ekv, src + eq, ekv);
        Copy(vh.data() + row * ekv, src + eq + ekv, ekv);
      }
    }
  }
  if (TwoLevel()) {
    FLASHCP_RETURN_IF_ERROR(CrossForward(comm, kh, vh));
    Stage(kh, vh);
  }
  kx_.assign(s * eq, 0.0f);
  vx_.assign(s * eq, 0.0f);
  for (int64_t row = 0; row < s; ++row) {
    for (int32_t h = 0; h < hq_; ++h) {
      Copy(kx_.data() + (row * hq_ + h) * d, kh.data() + (row * hkv_ + KvOf(h)) * d, d);
      Copy(vx_.data() + (row * hq_ + h) * d, vh.data() + (row * hkv_ + KvOf(h)) * d, d);
    }
  }
  // 3. Attention of the group's documents, whole.
  oh_.assign(s * eq, 0.0f);
  lseh_.assign(s * hq_, 0.0f);
  const AttentionShape shape{hq_, shape_.head_dim, shape_.scale};
  FLASHCP_RETURN_IF_ERROR(AttentionForwardCpu(shape, Docs(nullptr, nullptr, nullptr, nullptr), s,
                                              qh_.data(), oh_.data(), lseh_.data(), pool));
  // 4. The output rows back to their owners.
  std::fill(o.begin(), o.end(), 0.0f);  // the padding row stays 0
  sends.clear();
  recvs.clear();
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    out[i].resize(a.tokens[i] * eq);
    for (int64_t r = 0; r < a.tokens[i]; ++r)
      Copy(out[i].data() + r * eq, oh_.data() + a.doc_row[a.first[i] + r] * eq, eq);
    in[i].resize(mine * heads_.query[i].count * d);
    sends.push_back(SendOp{a.group[i], Bytes(out[i])});
    recvs.push_back(RecvOp{a.group[i], Bytes(in[i])});
  }
  FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
  for (int32_t i = 0; i < kk; ++i) {
    const core::HeadRange qi = heads_.query[i];
    for (int64_t r = 0; r < mine; ++r) {
      const float* src = i == j ? oh_.data() + a.doc_row[a.first[j] + r] * eq
                                : in[i].data() + r * qi.count * d;
      Copy(o.data() + (r * hq_all + qi.first) * d, src, qi.count * d);
    }
  }
  FLASHCP_RETURN_IF_ERROR(Pad(comm));
  forward_done_ = true;
  return absl::OkStatus();
}

absl::Status AllToAllStep::Backward(Communicator& comm, ThreadPool& pool,
                                    absl::Span<const float> dout, absl::Span<float> dq,
                                    absl::Span<float> dk, absl::Span<float> dv) {
  const int64_t d = shape_.head_dim, rows = lay_.local_rows;
  const int64_t hq_all = shape_.query_heads, hkv_all = shape_.kv_heads;
  if (!forward_done_) {
    return absl::FailedPreconditionError("backward: no successful forward on this step");
  }
  FLASHCP_RETURN_IF_ERROR(CheckComm(comm));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dout", dout.size(), rows * hq_all * d));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dq", dq.size(), rows * hq_all * d));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dk", dk.size(), rows * hkv_all * d));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dv", dv.size(), rows * hkv_all * d));
  forward_done_ = false;  // one backward per forward
  const AllToAllLayout& a = A();
  const int32_t kk = K(), j = Pos();
  const int64_t mine = a.tokens[j], s = a.rows;
  const int64_t eq = hq_ * d, ekv = hkv_ * d;
  // 1. dO as Q went: this rank's tokens of each position's query heads out.
  std::vector<std::vector<float>> out(kk), in(kk);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    const core::HeadRange qi = heads_.query[i];
    out[i].resize(mine * qi.count * d);
    for (int64_t r = 0; r < mine; ++r)
      Copy(out[i].data() + r * qi.count * d, dout.data() + (r * hq_all + qi.first) * d,
           qi.count * d);
    in[i].resize(a.tokens[i] * eq);
    sends.push_back(SendOp{a.group[i], Bytes(out[i])});
    recvs.push_back(RecvOp{a.group[i], Bytes(in[i])});
  }
  FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
  std::vector<float> doh(s * eq);
  for (int32_t p = 0; p < kk; ++p) {
    for (int64_t r = 0; r < a.tokens[p]; ++r) {
      const float* src = p == j ? dout.data() + (r * hq_all + heads_.query[j].first) * d
                                : in[p].data() + r * eq;
      Copy(doh.data() + a.doc_row[a.first[p] + r] * eq, src, eq);
    }
  }
  // 2. The kernels; the expanded heads' dK, dV summed onto this position's
  // KV heads.
  std::vector<float> dqh(s * eq, 0.0f), dkx(s * eq, 0.0f), dvx(s * eq, 0.0f);
  std::vector<float> gsk(skx_.size(), 0.0f), gsv(svx_.size(), 0.0f);  // staged rows (two-level)
  const AttentionShape shape{hq_, shape_.head_dim, shape_.scale};
  FLASHCP_RETURN_IF_ERROR(AttentionBackwardCpu(
      shape, Docs(dkx.data(), dvx.data(), gsk.data(), gsv.data()), s, qh_.data(), oh_.data(),
      lseh_.data(), doh.data(), dqh.data(), pool));
  // Rows [dQ | dK | dV] of this position's heads, document order.
  const int64_t w = eq + 2 * ekv;
  std::vector<float> grad(s * w, 0.0f);
  for (int64_t row = 0; row < s; ++row) {
    float* g = grad.data() + row * w;
    Copy(g, dqh.data() + row * eq, eq);
    for (int32_t h = 0; h < hq_; ++h) {
      AddTo(g + eq + KvOf(h) * d, dkx.data() + (row * hq_ + h) * d, d);
      AddTo(g + eq + ekv + KvOf(h) * d, dvx.data() + (row * hq_ + h) * d, d);
    }
  }
  if (TwoLevel()) FLASHCP_RETURN_IF_ERROR(CrossBackward(comm, gsk, gsv, grad));
  // 3. Back to the owners; each rank sums its tokens' gradients over the
  // positions in order.
  sends.clear();
  recvs.clear();
  for (int32_t i = 0; i < kk; ++i) {
    if (i == j) continue;
    out[i].resize(a.tokens[i] * w);
    for (int64_t r = 0; r < a.tokens[i]; ++r)
      Copy(out[i].data() + r * w, grad.data() + a.doc_row[a.first[i] + r] * w, w);
    in[i].resize(mine * (heads_.query[i].count + 2 * int64_t{heads_.kv[i].count}) * d);
    sends.push_back(SendOp{a.group[i], Bytes(out[i])});
    recvs.push_back(RecvOp{a.group[i], Bytes(in[i])});
  }
  FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
  std::fill(dq.begin(), dq.end(), 0.0f);
  std::fill(dk.begin(), dk.end(), 0.0f);
  std::fill(dv.begin(), dv.end(), 0.0f);
  for (int32_t i = 0; i < kk; ++i) {
    const core::HeadRange qi = heads_.query[i], ki = heads_.kv[i];
    const int64_t wi = (qi.count + 2 * int64_t{ki.count}) * d;
    for (int64_t r = 0; r < mine; ++r) {
      const float* src = i == j ? grad.data() + a.doc_row[a.first[j] + r] * w
                                : in[i].data() + r * wi;
      Copy(dq.data() + (r * hq_all + qi.first) * d, src, qi.count * d);
      AddTo(dk.data() + (r * hkv_all + ki.first) * d, src + qi.count * d, ki.count * d);
      AddTo(dv.data() + (r * hkv_all + ki.first) * d, src + (qi.count + ki.count) * d,
            ki.count * d);
    }
  }
  return Pad(comm);
}

}  // namespace flashcp::worker
