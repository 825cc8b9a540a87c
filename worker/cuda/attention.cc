#include "worker/cuda/attention.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/status_macros.h"

namespace flashcp::worker::cuda {

float AttentionShape::EffectiveScale() const {
  return scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

absl::Status ValidateAttentionShape(const AttentionShape& s) {
  if (s.heads_kv < 1 || s.heads_kv > 256)
    return absl::InvalidArgumentError(absl::StrCat("heads_kv must be in [1, 256], got ", s.heads_kv));
  if (s.heads_q < s.heads_kv || s.heads_q > 256)
    return absl::InvalidArgumentError(
        absl::StrCat("heads_q must be in [heads_kv, 256], got ", s.heads_q));
  if (s.heads_q % s.heads_kv != 0)
    return absl::InvalidArgumentError(absl::StrCat("heads_kv (", s.heads_kv,
                                                   ") must divide heads_q (", s.heads_q, ")"));
  if (s.head_dim < 8 || s.head_dim > 256 || s.head_dim % 8 != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim must be a multiple of 8 in [8, 256], got ", s.head_dim));
  if (!(s.scale >= 0) || !std::isfinite(s.scale))
    return absl::InvalidArgumentError(absl::StrCat("scale must be finite and >= 0, got ", s.scale));
  return absl::OkStatus();
}

double VarlenBatch::Pairs() const {
  double pairs = 0;
  for (size_t i = 0; i < q_len_.size(); ++i) {
    pairs += core::ShardWorkload(kv_len_[i] - q_len_[i], q_len_[i]);  // prefix, shard length
  }
  return pairs;
}

absl::StatusOr<VarlenBatch> VarlenBatch::Create(std::vector<int32_t> q_len,
                                                std::vector<int32_t> kv_len,
                                                const AttentionShape& shape,
                                                cudaStream_t stream) {
  std::vector<int64_t> q_start(q_len.size()), kv_start(kv_len.size());
  int64_t q = 0, kv = 0;
  for (size_t i = 0; i < q_len.size(); ++i) {
    q_start[i] = q;
    q += q_len[i];
  }
  for (size_t i = 0; i < kv_len.size(); ++i) {
    kv_start[i] = kv;
    kv += kv_len[i];
  }
  return Create(std::move(q_start), std::move(q_len), std::move(kv_start), std::move(kv_len), shape,
                stream);
}

absl::StatusOr<VarlenBatch> VarlenBatch::Create(std::vector<int64_t> q_start,
                                                std::vector<int32_t> q_len,
                                                std::vector<int64_t> kv_start,
                                                std::vector<int32_t> kv_len,
                                                const AttentionShape& shape,
                                                cudaStream_t stream) {
  FLASHCP_ASSIGN_OR_RETURN(VarlenBatch b, Describe(std::move(q_start), std::move(q_len),
                                                   std::move(kv_start), std::move(kv_len), shape));
  FLASHCP_ASSIGN_OR_RETURN(b.dev_, DeviceBuffer<int32_t>::Allocate(b.host_.size()));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.dev_.data(), b.host_.data(),
                                               b.host_.size() * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, stream),
                               "upload varlen lengths (", b.host_.size() * 4, " bytes)");
  // A pageable copy may read the host array after the call returns: wait for
  // it, so that the batch may move or die right away.
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "upload varlen lengths: sync");
  return b;
}

absl::Status VarlenBatch::UseDeviceTables(const int32_t* device, size_t count) {
  if (device == nullptr || count != host_.size())
    return absl::InvalidArgumentError(absl::StrCat(
        "varlen batch tables: ", count, " int32 at ", device == nullptr ? "null" : "an address",
        "; expected ", host_.size(), " at a device address"));
  external_ = device;
  return absl::OkStatus();
}

absl::StatusOr<VarlenBatch> VarlenBatch::Describe(std::vector<int64_t> q_start,
                                                  std::vector<int32_t> q_len,
                                                  std::vector<int64_t> kv_start,
                                                  std::vector<int32_t> kv_len,
                                                  const AttentionShape& shape) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  const size_t n = q_len.size();
  if (kv_len.size() != n || q_start.size() != n || kv_start.size() != n)
    return absl::InvalidArgumentError(absl::StrCat(
        "varlen batch: q_start ", q_start.size(), ", q_len ", n, ", kv_start ", kv_start.size(),
        ", kv_len ", kv_len.size(), " entries; all must match"));
  if (n == 0) return absl::InvalidArgumentError("a varlen batch needs at least one sequence");
  VarlenBatch b;
  b.stride_ = n + 1;
  std::vector<int64_t> host(7 * b.stride_, 0);
  auto at = [&](int array, size_t i) -> int64_t& { return host[array * b.stride_ + i]; };
  const int64_t q_row = int64_t{shape.heads_q} * shape.head_dim;
  const int64_t kv_row = int64_t{shape.heads_kv} * shape.head_dim;
  for (size_t i = 0; i < n; ++i) {
    if (q_len[i] < 0 || kv_len[i] < q_len[i])
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": need 0 <= q_len (", q_len[i],
                                                     ") <= kv_len (", kv_len[i], ")"));
    if (q_start[i] < b.q_rows_ || kv_start[i] < b.kv_rows_)
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", i, " starts at row ", q_start[i], " (Q) / ", kv_start[i],
          " (KV), before the end of the previous one (", b.q_rows_, " / ", b.kv_rows_, ")"));
    at(0, i) = q_start[i];
    at(1, i) = kv_start[i];
    at(2, i) = q_len[i];
    at(3, i) = kv_len[i];
    b.q_rows_ = q_start[i] + q_len[i];
    b.kv_rows_ = kv_start[i] + kv_len[i];
    b.total_q_ += q_len[i];
    b.total_kv_ += kv_len[i];
    b.max_q_ = std::max(b.max_q_, q_len[i]);
    b.max_kv_ = std::max(b.max_kv_, kv_len[i]);
  }
  at(0, n) = b.q_rows_;
  at(1, n) = b.kv_rows_;
  for (size_t i = 0; i <= n; ++i) {
    at(4, i) = at(0, i) * q_row;
    at(5, i) = at(1, i) * kv_row;
    at(6, i) = at(0, i) * shape.heads_q;
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (at(4, n) > kMax || at(5, n) > kMax)
    return absl::InvalidArgumentError(absl::StrCat(
        "batch too large for int32 element offsets: ", b.q_rows_, " query and ", b.kv_rows_,
        " KV rows at ", q_row, " and ", kv_row, " elements per row"));
  b.host_.assign(host.begin(), host.end());
  b.q_len_ = std::move(q_len);
  b.kv_len_ = std::move(kv_len);
  return b;
}

}  // namespace flashcp::worker::cuda
