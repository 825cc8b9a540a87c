#include "worker/engine.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

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

absl::Status CheckSize(absl::string_view name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", got, " floats, expected ", want));
}

}  // namespace

absl::StatusOr<CpAttentionStep> CpAttentionStep::Create(const core::Plan& plan, int32_t rank,
                                                        const AttentionShape& shape,
                                                        core::CommScheme scheme) {
  if (shape.heads < 1 || shape.head_dim < 1 || !(shape.scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("shape: heads ", shape.heads, ", head_dim ",
                                                   shape.head_dim, ", scale ", shape.scale,
                                                   " (each must be positive)"));
  }
  CpAttentionStep step;
  FLASHCP_ASSIGN_OR_RETURN(step.layout_, core::BuildCommLayout(plan));
  if (rank < 0 || rank >= plan.cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " outside a group of ", plan.cp_size));
  }
  step.plan_ = plan;
  step.rank_ = rank;
  step.shape_ = shape;
  step.scheme_ = scheme;
  const int32_t n = plan.cp_size;
  const int64_t total = core::TotalTokens(plan.doc_lens);
  step.rows_ = core::TokensPerRank(total, n);
  step.real_rows_ = core::RankRealTokens(total, n, rank);
  step.shard_row_.assign(plan.shards.size(), 0);
  for (const core::RankLayout& r : step.layout_.ranks) {
    for (size_t i = 0; i < r.shards.size(); ++i) step.shard_row_[r.shards[i]] = r.shard_offset[i];
    step.max_send_ = std::max(step.max_send_, r.send_tokens);
  }
  const int64_t e = step.RowFloats();
  step.msg_offset_.assign(n, 0);
  step.msg_rows_.assign(n, 0);
  step.msg_row_of_send_.assign(n, {});
  int64_t offset = 0;
  for (int32_t src = 0; src < n; ++src) {
    if (src == rank) continue;
    const core::RankLayout& r = step.layout_.ranks[src];
    step.msg_row_of_send_[src].assign(r.send.size(), -1);
    step.msg_offset_[src] = offset;
    for (const core::TargetedSend& t : r.targeted) {
      if (t.dest != rank) continue;
      int64_t row = 0;
      for (int32_t si : t.send_indices) {
        step.msg_row_of_send_[src][si] = row;
        row += r.send[si].len;
      }
      step.msg_rows_[src] = row;
    }
    offset += 2 * step.msg_rows_[src] * e;
  }
  // Local documents, in the order this rank first holds them.
  const core::RankLayout& mine = step.layout_.ranks[rank];
  std::map<int32_t, size_t> index;
  for (size_t i = 0; i < mine.shards.size(); ++i) {
    const core::Shard& s = plan.shards[mine.shards[i]];
    auto [it, inserted] = index.emplace(s.doc, step.docs_.size());
    if (inserted) step.docs_.push_back(LocalDoc{s.doc, 0, 0, -1, {}});
    LocalDoc& doc = step.docs_[it->second];
    doc.last_pos = std::max(doc.last_pos, mine.doc_pos[i]);
    doc.queries.push_back(QueryRange{mine.shard_offset[i], s.start, s.len});
  }
  for (LocalDoc& doc : step.docs_) {
    const core::Shard& last = plan.shards[step.layout_.docs[doc.doc][doc.last_pos].shard];
    doc.kv_len = last.start + last.len;
    if (doc.last_pos > 0) {  // the context spans several pieces: copy them together
      doc.ctx_offset = step.ctx_rows_;
      step.ctx_rows_ += doc.kv_len;
    }
  }
  return step;
}

CpAttentionStep::RemoteRows CpAttentionStep::Locate(int32_t shard) const {
  const int64_t e = RowFloats();
  const int32_t src = plan_.shards[shard].rank;
  const core::Shard& s = plan_.shards[shard];
  int32_t send_index = -1;
  for (const core::DocPiece& p : layout_.docs[s.doc]) {
    if (p.shard == shard) send_index = p.send_index;
  }
  switch (scheme_) {
    case core::CommScheme::kFullKv: {
      const int64_t block = 2 * rows_ * e;
      return {src * block + shard_row_[shard] * e, src * block + (rows_ + shard_row_[shard]) * e};
    }
    case core::CommScheme::kAllGather: {
      const int64_t block = 2 * max_send_ * e;
      const int64_t row = layout_.ranks[src].send[send_index].offset;
      return {src * block + row * e, src * block + (max_send_ + row) * e};
    }
    case core::CommScheme::kTargeted: {
      const int64_t row = msg_row_of_send_[src][send_index];
      return {msg_offset_[src] + row * e, msg_offset_[src] + (msg_rows_[src] + row) * e};
    }
  }
  return {};
}

absl::Status CpAttentionStep::CheckComm(const Communicator& comm) const {
  if (comm.size() != plan_.cp_size || comm.rank() != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("communicator is rank ", comm.rank(), " of ",
                                                   comm.size(), "; the step is rank ", rank_,
                                                   " of ", plan_.cp_size));
  }
  return absl::OkStatus();
}

absl::Status CpAttentionStep::ExchangeForward(Communicator& comm, absl::Span<const float> k,
                                              absl::Span<const float> v) {
  const int32_t n = plan_.cp_size;
  const int64_t e = RowFloats();
  const core::RankLayout& mine = layout_.ranks[rank_];
  switch (scheme_) {
    case core::CommScheme::kFullKv: {
      const int64_t block = 2 * rows_ * e;
      std::vector<float> send(block);
      std::copy(k.begin(), k.end(), send.begin());
      std::copy(v.begin(), v.end(), send.begin() + rows_ * e);
      recv_.assign(block * n, 0.0f);
      const std::vector<int64_t> counts(n, block * static_cast<int64_t>(sizeof(float)));
      return comm.AllGatherV(Bytes(absl::MakeConstSpan(send)), Bytes(absl::MakeSpan(recv_)),
                             counts);
    }
    case core::CommScheme::kAllGather: {
      recv_.clear();
      if (max_send_ == 0) return absl::OkStatus();  // nothing travels on any rank
      const int64_t block = 2 * max_send_ * e;
      std::vector<float> send(block, 0.0f);  // rows past send_tokens are padding
      for (const core::SendRange& r : mine.send) {
        const int64_t from = shard_row_[r.shard] * e;
        std::copy(k.begin() + from, k.begin() + from + r.len * e, send.begin() + r.offset * e);
        std::copy(v.begin() + from, v.begin() + from + r.len * e,
                  send.begin() + (max_send_ + r.offset) * e);
      }
      recv_.assign(block * n, 0.0f);
      const std::vector<int64_t> counts(n, block * static_cast<int64_t>(sizeof(float)));
      return comm.AllGatherV(Bytes(absl::MakeConstSpan(send)), Bytes(absl::MakeSpan(recv_)),
                             counts);
    }
    case core::CommScheme::kTargeted: {
      int64_t total = 0;
      for (int32_t src = 0; src < n; ++src) total += 2 * msg_rows_[src] * e;
      recv_.assign(total, 0.0f);
      std::vector<std::vector<float>> buffers;
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      buffers.reserve(mine.targeted.size());
      for (const core::TargetedSend& t : mine.targeted) {
        std::vector<float>& buf = buffers.emplace_back(2 * t.tokens * e);
        int64_t row = 0;
        for (int32_t si : t.send_indices) {
          const core::SendRange& r = mine.send[si];
          const int64_t from = shard_row_[r.shard] * e;
          std::copy(k.begin() + from, k.begin() + from + r.len * e, buf.begin() + row * e);
          std::copy(v.begin() + from, v.begin() + from + r.len * e,
                    buf.begin() + (t.tokens + row) * e);
          row += r.len;
        }
        sends.push_back(SendOp{t.dest, Bytes(absl::MakeConstSpan(buf))});
      }
      for (int32_t src = 0; src < n; ++src) {
        if (msg_rows_[src] == 0) continue;
        recvs.push_back(RecvOp{
            src, Bytes(absl::MakeSpan(recv_).subspan(msg_offset_[src], 2 * msg_rows_[src] * e))});
      }
      return comm.SendRecv(sends, recvs);
    }
  }
  return absl::InvalidArgumentError("scheme: unknown communication scheme");
}

std::vector<DocAttention> CpAttentionStep::Docs(absl::Span<const float> k,
                                                absl::Span<const float> v, absl::Span<float> dk,
                                                absl::Span<float> dv) {
  const int64_t e = RowFloats();
  std::vector<DocAttention> docs;
  docs.reserve(docs_.size());
  for (const LocalDoc& doc : docs_) {
    DocAttention a;
    a.kv_len = doc.kv_len;
    a.queries = doc.queries;
    if (doc.ctx_offset < 0) {
      // Zero-copy: the context is this rank's piece 0 alone, in local memory.
      const int64_t row = doc.queries[0].row;
      a.k = k.data() + row * e;
      a.v = v.data() + row * e;
      if (!dk.empty()) {
        a.dk = dk.data() + row * e;
        a.dv = dv.data() + row * e;
      }
    } else {
      a.k = ctx_k_.data() + doc.ctx_offset * e;
      a.v = ctx_v_.data() + doc.ctx_offset * e;
    }
    docs.push_back(std::move(a));
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
  FLASHCP_RETURN_IF_ERROR(ExchangeForward(comm, k, v));
  // Assemble multi-piece contexts: piece j of the document at rows
  // [start_j, start_j + len_j) of its context, from local memory or recv_.
  ctx_k_.assign(ctx_rows_ * e, 0.0f);
  ctx_v_.assign(ctx_rows_ * e, 0.0f);
  for (const LocalDoc& doc : docs_) {
    if (doc.ctx_offset < 0) continue;
    for (int32_t j = 0; j <= doc.last_pos; ++j) {
      const int32_t shard = layout_.docs[doc.doc][j].shard;
      const core::Shard& s = plan_.shards[shard];
      const int64_t to = (doc.ctx_offset + s.start) * e, n = s.len * e;
      const float *kf, *vf;
      if (s.rank == rank_) {
        kf = k.data() + shard_row_[shard] * e;
        vf = v.data() + shard_row_[shard] * e;
      } else {
        const RemoteRows at = Locate(shard);
        kf = recv_.data() + at.k_offset;
        vf = recv_.data() + at.v_offset;
      }
      std::memcpy(ctx_k_.data() + to, kf, n * sizeof(float));
      std::memcpy(ctx_v_.data() + to, vf, n * sizeof(float));
    }
  }
  std::fill(o.begin(), o.end(), 0.0f);  // padding rows stay 0
  std::fill(lse.begin(), lse.end(), 0.0f);
  const std::vector<DocAttention> docs = Docs(k, v, {}, {});
  FLASHCP_RETURN_IF_ERROR(
      AttentionForwardCpu(shape_, docs, rows_, q.data(), o.data(), lse.data(), pool));
  q_ = q.data();
  k_ = k.data();
  v_ = v.data();
  o_ = o.data();
  lse_ = lse.data();
  forward_done_ = true;
  return absl::OkStatus();
}

absl::Status CpAttentionStep::ExchangeBackward(Communicator& comm, absl::Span<float> dk,
                                               absl::Span<float> dv) {
  const int32_t n = plan_.cp_size;
  const int64_t e = RowFloats();
  const core::RankLayout& mine = layout_.ranks[rank_];
  // recv_ now holds the gradients of the received rows, in the forward layout.
  switch (scheme_) {
    case core::CommScheme::kFullKv: {
      const int64_t block = 2 * rows_ * e;
      std::vector<float> out(block);
      FLASHCP_RETURN_IF_ERROR(
          comm.ReduceScatterV(recv_, absl::MakeSpan(out), std::vector<int64_t>(n, block)));
      AddTo(dk.data(), out.data(), rows_ * e);
      AddTo(dv.data(), out.data() + rows_ * e, rows_ * e);
      return absl::OkStatus();
    }
    case core::CommScheme::kAllGather: {
      if (max_send_ == 0) return absl::OkStatus();
      const int64_t block = 2 * max_send_ * e;
      std::vector<float> out(block);
      FLASHCP_RETURN_IF_ERROR(
          comm.ReduceScatterV(recv_, absl::MakeSpan(out), std::vector<int64_t>(n, block)));
      for (const core::SendRange& r : mine.send) {
        const int64_t to = shard_row_[r.shard] * e;
        AddTo(dk.data() + to, out.data() + r.offset * e, r.len * e);
        AddTo(dv.data() + to, out.data() + (max_send_ + r.offset) * e, r.len * e);
      }
      return absl::OkStatus();
    }
    case core::CommScheme::kTargeted: {
      std::vector<std::vector<float>> buffers;
      buffers.reserve(mine.targeted.size());
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      for (int32_t src = 0; src < n; ++src) {
        if (msg_rows_[src] == 0) continue;
        sends.push_back(SendOp{
            src, Bytes(absl::MakeConstSpan(recv_).subspan(msg_offset_[src], 2 * msg_rows_[src] * e))});
      }
      for (const core::TargetedSend& t : mine.targeted) {
        std::vector<float>& buf = buffers.emplace_back(2 * t.tokens * e);
        recvs.push_back(RecvOp{t.dest, Bytes(absl::MakeSpan(buf))});
      }
      FLASHCP_RETURN_IF_ERROR(comm.SendRecv(sends, recvs));
      for (size_t i = 0; i < mine.targeted.size(); ++i) {  // by dest ascending: deterministic
        const core::TargetedSend& t = mine.targeted[i];
        int64_t row = 0;
        for (int32_t si : t.send_indices) {
          const core::SendRange& r = mine.send[si];
          const int64_t to = shard_row_[r.shard] * e;
          AddTo(dk.data() + to, buffers[i].data() + row * e, r.len * e);
          AddTo(dv.data() + to, buffers[i].data() + (t.tokens + row) * e, r.len * e);
          row += r.len;
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("scheme: unknown communication scheme");
}

absl::Status CpAttentionStep::Backward(Communicator& comm, ThreadPool& pool,
                                       absl::Span<const float> dout, absl::Span<float> dq,
                                       absl::Span<float> dk, absl::Span<float> dv) {
  const int64_t e = RowFloats();
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
  std::vector<float> ctx_dk(ctx_rows_ * e), ctx_dv(ctx_rows_ * e);
  std::vector<DocAttention> docs =
      Docs(absl::MakeConstSpan(k_, rows_ * e), absl::MakeConstSpan(v_, rows_ * e), dk, dv);
  for (size_t i = 0; i < docs.size(); ++i) {
    if (docs_[i].ctx_offset < 0) continue;
    docs[i].dk = ctx_dk.data() + docs_[i].ctx_offset * e;
    docs[i].dv = ctx_dv.data() + docs_[i].ctx_offset * e;
  }
  FLASHCP_RETURN_IF_ERROR(AttentionBackwardCpu(shape_, docs, rows_, q_, o_, lse_, dout.data(),
                                               dq.data(), pool));
  // Route context gradients: local pieces into dk/dv, remote ones into recv_
  // (reused as the gradient buffer, in the layout the KV arrived in).
  std::fill(recv_.begin(), recv_.end(), 0.0f);
  for (const LocalDoc& doc : docs_) {
    if (doc.ctx_offset < 0) continue;
    for (int32_t j = 0; j <= doc.last_pos; ++j) {
      const int32_t shard = layout_.docs[doc.doc][j].shard;
      const core::Shard& s = plan_.shards[shard];
      const int64_t from = (doc.ctx_offset + s.start) * e, n = s.len * e;
      float *gk, *gv;
      if (s.rank == rank_) {
        gk = dk.data() + shard_row_[shard] * e;
        gv = dv.data() + shard_row_[shard] * e;
      } else {
        const RemoteRows at = Locate(shard);
        gk = recv_.data() + at.k_offset;
        gv = recv_.data() + at.v_offset;
      }
      AddTo(gk, ctx_dk.data() + from, n);
      AddTo(gv, ctx_dv.data() + from, n);
    }
  }
  return ExchangeBackward(comm, dk, dv);
}

}  // namespace flashcp::worker
