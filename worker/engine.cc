#include "worker/engine.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/two_level.h"
#include "worker/attention_masked_cpu.h"

namespace flashcp::worker {
namespace {

absl::Span<const std::byte> Bytes(absl::Span<const float> f) {
  return absl::MakeConstSpan(reinterpret_cast<const std::byte*>(f.data()), f.size() * sizeof(float));
}
absl::Span<std::byte> Bytes(absl::Span<float> f) {
  return absl::MakeSpan(reinterpret_cast<std::byte*>(f.data()), f.size() * sizeof(float));
}

// dst[0, n) += src[0, n)
void AddTo(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

absl::Status CheckShape(const AttentionShape& shape) {
  if (shape.heads < 1 || shape.head_dim < 1 || !(shape.scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("shape: heads ", shape.heads, ", head_dim ",
                                                   shape.head_dim, ", scale ", shape.scale,
                                                   " (each must be positive)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSize(absl::string_view name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", got, " floats, expected ", want));
}

}  // namespace

absl::StatusOr<CpAttentionStep> CpAttentionStep::Create(const core::Plan& plan, int32_t rank,
                                                        const AttentionShape& shape,
                                                        core::CommScheme scheme) {
  FLASHCP_RETURN_IF_ERROR(CheckShape(shape));
  CpAttentionStep step;
  FLASHCP_ASSIGN_OR_RETURN(step.layout_, core::BuildCommLayout(plan));
  if (rank < 0 || rank >= plan.cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " outside a group of ", plan.cp_size));
  }
  if (scheme == core::CommScheme::kAllToAll) {
    FLASHCP_ASSIGN_OR_RETURN(
        AllToAllStep a2a,
        AllToAllStep::Create(plan, rank, HeadShape{shape.heads, shape.heads, shape.head_dim,
                                                   shape.scale}));
    step.a2a_ = std::make_shared<AllToAllStep>(std::move(a2a));
  }
  FLASHCP_ASSIGN_OR_RETURN(step.lay_, BuildCpRankLayout(plan, step.layout_, rank, scheme));
  step.plan_ = plan;
  step.rank_ = rank;
  step.shape_ = shape;
  step.rows_ = step.lay_.local_rows;
  step.real_rows_ = core::RankRealTokens(core::TotalTokens(plan.doc_lens), plan.cp_size, rank);
  return step;
}

absl::StatusOr<CpAttentionStep> CpAttentionStep::CreateMixed(
    const core::Plan& plan, int32_t rank, const AttentionShape& shape,
    const std::vector<core::RankGroup>& groups, int32_t ranks_per_node) {
  FLASHCP_RETURN_IF_ERROR(core::ValidatePlan(plan));
  FLASHCP_RETURN_IF_ERROR(CheckShape(shape));
  std::vector<std::vector<int32_t>> want = core::PlanRankGroups(plan), got;
  // Grouped send/recvs a phase: targeted and all-gather groups 1, all_to_all
  // 2 (heads out, results back), two-level 3 (and the KV across nodes).
  auto calls = [](const core::RankGroup& g) {
    return g.scheme != core::CommScheme::kAllToAll ? 1 : g.two_level ? 3 : 2;
  };
  int32_t most = 1;
  const core::RankGroup* mine = nullptr;
  for (size_t g = 0; g < groups.size(); ++g) {
    got.push_back(groups[g].ranks);
    most = std::max(most, calls(groups[g]));
    if (std::find(groups[g].ranks.begin(), groups[g].ranks.end(), rank) != groups[g].ranks.end())
      mine = &groups[g];
    if (groups[g].two_level && groups[g].scheme != core::CommScheme::kAllToAll) {
      return absl::InvalidArgumentError(absl::StrCat(
          "groups[", g, "]: two_level with scheme ", core::CommSchemeName(groups[g].scheme),
          "; the two-level scheme is all_to_all within each node"));
    }
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  if (got != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "groups: ", groups.size(), " groups that are not the plan's ", want.size(),
        " rank groups (core::PlanRankGroups: the ranks linked by shared documents)"));
  }
  if (mine == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " outside a group of ", plan.cp_size));
  }
  // Every rank checks every two-level group, so all refuse alike before
  // any exchange.
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].two_level) continue;
    absl::StatusOr<core::TwoLevelParts> parts =
        core::TwoLevelNeeds(plan, groups[g].ranks, ranks_per_node);
    absl::Status st = parts.status();
    if (st.ok()) {
      core::ModelShape model;
      model.heads = shape.heads;
      model.head_dim = shape.head_dim;
      model.dtype_bytes = 4;
      st = core::AllToAllGroupHeads(static_cast<int32_t>(parts->parts.front().size()), model)
               .status();
    }
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("groups[", g, "]: ", st.message()));
  }
  if (mine->two_level) {
    // The layout's own fields are unused: the AllToAllStep is the whole step.
    FLASHCP_ASSIGN_OR_RETURN(CpAttentionStep step,
                             Create(plan, rank, shape, core::CommScheme::kTargeted));
    FLASHCP_ASSIGN_OR_RETURN(
        AllToAllStep a2a,
        AllToAllStep::CreateTwoLevel(
            plan, rank, HeadShape{shape.heads, shape.heads, shape.head_dim, shape.scale},
            mine->ranks, ranks_per_node));
    a2a.set_pad_calls(most - calls(*mine));
    step.a2a_ = std::make_shared<AllToAllStep>(std::move(a2a));
    return step;
  }
  FLASHCP_ASSIGN_OR_RETURN(CpAttentionStep step, Create(plan, rank, shape, mine->scheme));
  if (step.a2a_ != nullptr) {
    step.a2a_->set_pad_calls(most - calls(*mine));
    return step;
  }
  // An all-gather group's blocks travel point to point within the group
  // (cp_layout.h), one send/recv a phase, as a targeted group's do.
  FLASHCP_ASSIGN_OR_RETURN(step.lay_,
                           BuildCpRankLayout(plan, step.layout_, rank, mine->scheme, mine->ranks));
  step.pad_calls_ = most - calls(*mine);
  return step;
}

absl::Status CpAttentionStep::CheckComm(const Communicator& comm) const {
  if (comm.size() != plan_.cp_size || comm.rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("communicator is rank ", comm.rank(), " of ",
                                                   comm.size(), "; the step is rank ", rank_,
                                                   " of ", plan_.cp_size));
  }
  return absl::OkStatus();
}

std::vector<DocAttention> CpAttentionStep::Docs(absl::Span<const float> k,
                                                absl::Span<const float> v, absl::Span<float> dk,
                                                absl::Span<float> dv, absl::Span<float> stage_dk,
                                                absl::Span<float> stage_dv) const {
  const int64_t e = RowFloats();
  const bool backward = !dk.empty();
  std::vector<DocAttention> docs;
  docs.reserve(lay_.whole_start.size() + lay_.prefix_q_start.size());
  for (size_t i = 0; i < lay_.whole_start.size(); ++i) {
    const int64_t row = lay_.whole_start[i], len = lay_.whole_len[i];
    docs.push_back(DocAttention{k.data() + row * e, v.data() + row * e, len, {{row, 0, len}},
                                backward ? dk.data() + row * e : nullptr,
                                backward ? dv.data() + row * e : nullptr});
  }
  int64_t at = 0;  // first staged row of the shard
  for (size_t i = 0; i < lay_.prefix_q_start.size(); ++i) {
    const int64_t kv = lay_.prefix_kv_len[i], len = lay_.prefix_q_len[i];
    docs.push_back(DocAttention{stage_k_.data() + at * e, stage_v_.data() + at * e, kv,
                                {{lay_.prefix_q_start[i], kv - len, len}},
                                backward ? stage_dk.data() + at * e : nullptr,
                                backward ? stage_dv.data() + at * e : nullptr});
    at += kv;
  }
  return docs;
}

absl::Status CpAttentionStep::Forward(Communicator& comm, ThreadPool& pool,
                                      absl::Span<const float> q, absl::Span<const float> k,
                                      absl::Span<const float> v, absl::Span<float> o,
                                      absl::Span<float> lse) {
  const int64_t e = RowFloats();
  FLASHCP_RETURN_IF_ERROR(CheckComm(comm));
  FLASHCP_RETURN_IF_ERROR(CheckSize("q", q.size(), rows_ * e));
  FLASHCP_RETURN_IF_ERROR(CheckSize("k", k.size(), rows_ * e));
  FLASHCP_RETURN_IF_ERROR(CheckSize("v", v.size(), rows_ * e));
  FLASHCP_RETURN_IF_ERROR(CheckSize("o", o.size(), rows_ * e));
  FLASHCP_RETURN_IF_ERROR(CheckSize("lse", lse.size(), rows_ * shape_.heads));
  forward_done_ = false;
  if (a2a_ != nullptr) {
    std::fill(lse.begin(), lse.end(), 0.0f);
    return a2a_->Forward(comm, pool, q, k, v, o);
  }
  // 1. Pack [K | V] rows; padding rows of an all-gather block stay 0.
  const int64_t row2 = 2 * e;
  std::vector<float> pack(lay_.pack_rows.size() * row2, 0.0f);
  for (size_t i = 0; i < lay_.pack_rows.size(); ++i) {
    const int64_t src = lay_.pack_rows[i];
    if (src == kNoRow) continue;
    std::memcpy(pack.data() + i * row2, k.data() + src * e, e * sizeof(float));
    std::memcpy(pack.data() + i * row2 + e, v.data() + src * e, e * sizeof(float));
  }
  // 2. The exchange.
  recv_.assign(lay_.recv_rows * row2, 0.0f);
  if (CallsExchange(lay_)) {
    if (lay_.collective == Collective::kAllGather) {
      const std::vector<int64_t> counts(plan_.cp_size,
                                        lay_.block_rows * row2 * static_cast<int64_t>(sizeof(float)));
      FLASHCP_RETURN_IF_ERROR(
          comm.AllGatherV(Bytes(absl::MakeConstSpan(pack)), Bytes(absl::MakeSpan(recv_)), counts));
    } else {
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      for (const RowSegment& s : lay_.sends)
        sends.push_back(SendOp{
            s.peer, Bytes(absl::MakeConstSpan(pack).subspan(s.first * row2, s.rows * row2))});
      for (const RowSegment& s : lay_.recvs)
        recvs.push_back(
            RecvOp{s.peer, Bytes(absl::MakeSpan(recv_).subspan(s.first * row2, s.rows * row2))});
      FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
    }
  }
  for (int32_t i = 0; i < pad_calls_; ++i) FLASHCP_RETURN_IF_ERROR(comm.SendRecv({}, {}));
  // 3. Stage every prefixed shard's [prefix pieces, own rows].
  const int64_t staged = static_cast<int64_t>(lay_.stage_src.size());
  stage_k_.assign(staged * e, 0.0f);
  stage_v_.assign(staged * e, 0.0f);
  for (int64_t j = 0; j < staged; ++j) {
    const int64_t src = lay_.stage_src[j];
    const float* kf = src >= 0 ? k.data() + src * e : recv_.data() + (-1 - src) * row2;
    const float* vf = src >= 0 ? v.data() + src * e : recv_.data() + (-1 - src) * row2 + e;
    std::memcpy(stage_k_.data() + j * e, kf, e * sizeof(float));
    std::memcpy(stage_v_.data() + j * e, vf, e * sizeof(float));
  }
  // 4. Attention.
  std::fill(o.begin(), o.end(), 0.0f);  // padding rows stay 0
  std::fill(lse.begin(), lse.end(), 0.0f);
  if (lay_.block_size > 0) {  // block diffusion: every shard on its staged K/V, masked
    const std::vector<MaskedShardAttention> shards =
        MaskedStagedShards(lay_, stage_k_.data(), stage_v_.data(), nullptr, nullptr, e);
    FLASHCP_RETURN_IF_ERROR(MaskedAttentionForwardCpu(shape_, lay_.block_size, shards, rows_,
                                                      q.data(), o.data(), lse.data(), pool));
  } else {
    const std::vector<DocAttention> docs = Docs(k, v, {}, {}, {}, {});
    FLASHCP_RETURN_IF_ERROR(
        AttentionForwardCpu(shape_, docs, rows_, q.data(), o.data(), lse.data(), pool));
  }
  q_ = q.data();
  k_ = k.data();
  v_ = v.data();
  o_ = o.data();
  lse_ = lse.data();
  forward_done_ = true;
  return absl::OkStatus();
}

absl::Status CpAttentionStep::Backward(Communicator& comm, ThreadPool& pool,
                                       absl::Span<const float> dout, absl::Span<float> dq,
                                       absl::Span<float> dk, absl::Span<float> dv) {
  const int64_t e = RowFloats();
  const int64_t row2 = 2 * e;
  if (a2a_ != nullptr) return a2a_->Backward(comm, pool, dout, dq, dk, dv);
  if (!forward_done_) {
    return absl::FailedPreconditionError("backward: no successful forward on this step");
  }
  FLASHCP_RETURN_IF_ERROR(CheckComm(comm));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dout", dout.size(), rows_ * e));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dq", dq.size(), rows_ * e));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dk", dk.size(), rows_ * e));
  FLASHCP_RETURN_IF_ERROR(CheckSize("dv", dv.size(), rows_ * e));
  forward_done_ = false;  // one backward per forward
  std::fill(dq.begin(), dq.end(), 0.0f);
  std::fill(dk.begin(), dk.end(), 0.0f);
  std::fill(dv.begin(), dv.end(), 0.0f);
  // 1. The kernels: whole shards' dK, dV straight into dk, dv; prefixed
  // shards' into gradients of the staged rows.
  const int64_t staged = static_cast<int64_t>(lay_.stage_src.size());
  std::vector<float> gk(staged * e, 0.0f), gv(staged * e, 0.0f);
  if (lay_.block_size > 0) {
    const std::vector<MaskedShardAttention> shards =
        MaskedStagedShards(lay_, stage_k_.data(), stage_v_.data(), gk.data(), gv.data(), e);
    FLASHCP_RETURN_IF_ERROR(MaskedAttentionBackwardCpu(shape_, lay_.block_size, shards, rows_, q_,
                                                       o_, lse_, dout.data(), dq.data(), pool));
  } else {
    const std::vector<DocAttention> docs =
        Docs(absl::MakeConstSpan(k_, rows_ * e), absl::MakeConstSpan(v_, rows_ * e), dk, dv,
             absl::MakeSpan(gk), absl::MakeSpan(gv));
    FLASHCP_RETURN_IF_ERROR(AttentionBackwardCpu(shape_, docs, rows_, q_, o_, lse_, dout.data(),
                                                 dq.data(), pool));
  }
  // 2. Staged rows' gradients to where the rows came from: local rows, or
  // the receive buffer (reused as its own gradient, in the layout the KV
  // arrived in).
  std::fill(recv_.begin(), recv_.end(), 0.0f);
  for (int64_t j = 0; j < staged; ++j) {
    const int64_t dst = lay_.stage_src[j];
    float* tk = dst >= 0 ? dk.data() + dst * e : recv_.data() + (-1 - dst) * row2;
    float* tv = dst >= 0 ? dv.data() + dst * e : recv_.data() + (-1 - dst) * row2 + e;
    AddTo(tk, gk.data() + j * e, e);
    AddTo(tv, gv.data() + j * e, e);
  }
  // 3. Return them to their owners, and add what comes back, peer by peer.
  if (!CallsExchange(lay_)) return absl::OkStatus();
  std::vector<float> back(lay_.back_rows * row2);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (const RowSegment& s : lay_.recvs)
    sends.push_back(
        SendOp{s.peer, Bytes(absl::MakeConstSpan(recv_).subspan(s.first * row2, s.rows * row2))});
  for (size_t i = 0; i < lay_.sends.size(); ++i)
    recvs.push_back(RecvOp{lay_.sends[i].peer,
                           Bytes(absl::MakeSpan(back).subspan(lay_.back_first[i] * row2,
                                                              lay_.sends[i].rows * row2))});
  FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
  for (int32_t i = 0; i < pad_calls_; ++i) FLASHCP_RETURN_IF_ERROR(comm.SendRecv({}, {}));
  for (size_t i = 0; i < lay_.sends.size(); ++i) {
    const RowSegment& s = lay_.sends[i];
    for (int64_t j = 0; j < s.rows; ++j) {
      const int64_t to = lay_.pack_rows[s.first + j];
      if (to == kNoRow) continue;
      const float* from = back.data() + (lay_.back_first[i] + j) * row2;
      AddTo(dk.data() + to * e, from, e);
      AddTo(dv.data() + to * e, from + e, e);
    }
  }
  return absl::OkStatus();
}

}  // namespace flashcp::worker
