#include "worker/cuda/masked_batch.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "worker/cuda/cuda_status.h"

namespace flashcp::worker::cuda {
namespace {

template <typename T>
absl::StatusOr<DeviceBuffer<T>> Upload(const std::vector<T>& host, cudaStream_t stream,
                                       const char* what) {
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<T> d, DeviceBuffer<T>::Allocate(host.size()));
  if (!host.empty()) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T),
                                                 cudaMemcpyHostToDevice, stream),
                                 "upload masked ", what);
    // Pageable source: wait before the host vector goes away.
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "upload masked ", what);
  }
  return d;
}

}  // namespace

absl::StatusOr<MaskedBatch> MaskedBatch::Create(const CpRankLayout& p, cudaStream_t stream) {
  if (p.block_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: the masked kernels need block_size >= 1, got ", p.block_size));
  const size_t n = p.prefix_q_start.size();
  if (p.prefix_q_len.size() != n || p.prefix_kv_len.size() != n || p.prefix_q_pos.size() != n ||
      p.prefix_q_noisy.size() != n)
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix_q_pos: ", p.prefix_q_pos.size(), " shard positions, ", p.prefix_q_noisy.size(),
        " noisy flags and ", p.prefix_kv_len.size(), " staged lengths for ", n, " shards"));
  if (p.stage_noisy.size() != p.stage_src.size() || p.stage_pos.size() != p.stage_src.size())
    return absl::InvalidArgumentError(absl::StrCat("stage_pos: ", p.stage_pos.size(),
                                                   " positions, ", p.stage_noisy.size(),
                                                   " flags for ", p.stage_src.size(),
                                                   " staged rows"));
  std::vector<int32_t> q_shard, stage_shard;
  std::vector<int64_t> q_len, kv_first, kv_len, q_first;
  for (size_t s = 0; s < n; ++s) {
    q_first.push_back(static_cast<int64_t>(q_shard.size()));
    kv_first.push_back(static_cast<int64_t>(stage_shard.size()));
    q_len.push_back(p.prefix_q_len[s]);
    kv_len.push_back(p.prefix_kv_len[s]);
    q_shard.insert(q_shard.end(), p.prefix_q_len[s], static_cast<int32_t>(s));
    stage_shard.insert(stage_shard.end(), p.prefix_kv_len[s], static_cast<int32_t>(s));
  }
  if (stage_shard.size() != p.stage_src.size())
    return absl::InvalidArgumentError(absl::StrCat("prefix_kv_len: shards stage ",
                                                   stage_shard.size(), " rows, the layout has ",
                                                   p.stage_src.size()));
  MaskedBatch m;
  FLASHCP_ASSIGN_OR_RETURN(m.q_shard_, Upload(q_shard, stream, "query shards"));
  FLASHCP_ASSIGN_OR_RETURN(m.stage_shard_, Upload(stage_shard, stream, "staged shards"));
  FLASHCP_ASSIGN_OR_RETURN(m.shard_q_row_, Upload(p.prefix_q_start, stream, "query rows"));
  FLASHCP_ASSIGN_OR_RETURN(m.shard_q_len_, Upload(q_len, stream, "query lengths"));
  FLASHCP_ASSIGN_OR_RETURN(m.shard_q_pos_, Upload(p.prefix_q_pos, stream, "query positions"));
  FLASHCP_ASSIGN_OR_RETURN(m.shard_kv_first_, Upload(kv_first, stream, "staged starts"));
  FLASHCP_ASSIGN_OR_RETURN(m.shard_kv_len_, Upload(kv_len, stream, "staged lengths"));
  FLASHCP_ASSIGN_OR_RETURN(m.shard_q_first_, Upload(q_first, stream, "query starts"));
  FLASHCP_ASSIGN_OR_RETURN(m.stage_pos_, Upload(p.stage_pos, stream, "staged positions"));
  FLASHCP_ASSIGN_OR_RETURN(m.shard_noisy_, Upload(p.prefix_q_noisy, stream, "query copies"));
  FLASHCP_ASSIGN_OR_RETURN(m.stage_noisy_, Upload(p.stage_noisy, stream, "staged copies"));
  // Device pointers do not move with the DeviceBuffers' owner, so the
  // tables stay valid when the batch is moved.
  m.t_ = MaskedTables{p.block_size,
                      static_cast<int64_t>(q_shard.size()),
                      static_cast<int64_t>(stage_shard.size()),
                      m.q_shard_.data(),
                      m.shard_q_row_.data(),
                      m.shard_q_len_.data(),
                      m.shard_q_pos_.data(),
                      m.shard_kv_first_.data(),
                      m.shard_kv_len_.data(),
                      m.shard_q_first_.data(),
                      m.shard_noisy_.data(),
                      m.stage_shard_.data(),
                      m.stage_noisy_.data(),
                      m.stage_pos_.data()};
  return m;
}

}  // namespace flashcp::worker::cuda
