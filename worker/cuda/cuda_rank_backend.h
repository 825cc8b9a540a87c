// flashcp-worker's CUDA rank backend (worker/rank_backend.h): each step runs
// GpuCpRank (gpu_cp_step.h) on cuDNN attention over a NCCL communicator. The
// communicator joins the group in Connect: the driver (rank 0) makes the
// ncclUniqueId and sets it in the group's rendezvous store, the others wait
// for it there, bounded by the daemon's timeout (ConnectNccl). Inputs are
// seeded bf16 on the device (LaunchFillRandomBf16); heads_q = heads_kv = H.
//
// What a step reports: forward and backward are the device time of their
// attention launches (CUDA events on the compute stream), attention the two
// together; comm is the host time inside NCCL calls (each returns once its
// transfer completed); bytes are the NCCL communicator's payload counts, which
// the plans (made for 2-byte elements) predict exactly.
#ifndef FLASHCP_WORKER_CUDA_CUDA_RANK_BACKEND_H_
#define FLASHCP_WORKER_CUDA_CUDA_RANK_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/rank_backend.h"

namespace flashcp::worker::cuda {

// FailedPrecondition where CUDA has no usable device (naming
// cudaGetDeviceCount's error) or fewer than device + 1 of them;
// InvalidArgument for a shape the attention refuses (--heads, --head_dim).
absl::StatusOr<std::unique_ptr<RankBackend>> MakeCudaRankBackend(int32_t device,
                                                                 const BackendConfig& config);

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_CUDA_RANK_BACKEND_H_
