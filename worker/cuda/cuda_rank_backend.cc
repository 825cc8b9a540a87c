#include "worker/cuda/cuda_rank_backend.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "worker/cuda/attention.h"
#include "worker/cuda/comm_kernels.h"
#include "worker/cp_layout.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/cudnn_attention.h"
#include "worker/cuda/device_communicator.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/gpu_cp_step.h"

namespace flashcp::worker::cuda {
namespace {

// Measures the host time inside the NCCL calls on `clock` (each returns once
// its transfer completed on the device); everything else passes through.
class TimedDeviceCommunicator final : public TimedCommunicator<DeviceCommunicator> {
 public:
  using TimedCommunicator::TimedCommunicator;
  cudaStream_t stream() const override { return inner().stream(); }
  int device() const override { return inner().device(); }
};

class CudaRankBackend final : public RankBackend {
 public:
  CudaRankBackend(int32_t device, const BackendConfig& config, const AttentionShape& shape,
                  CudaStream stream, std::unique_ptr<Attention> attention)
      : device_(device), rank_(config.rank), clock_(*config.clock), shape_(shape),
        stream_(std::move(stream)), attention_(std::move(attention)) {}

  int32_t dtype_bytes() const override { return 2; }

  absl::Status Connect(gloo::rendezvous::Store& store, int32_t rank, int32_t size,
                       absl::Duration timeout) override {
    if (rank != rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA backend of rank ", rank_, " connecting as rank ", rank));
    }
    NcclOptions options;
    options.device = device_;
    options.timeout = timeout;
    options.id_key = "flashcp/worker/nccl_unique_id";
    absl::StatusOr<std::unique_ptr<DeviceCommunicator>> nccl =
        ConnectNccl(store, rank, size, options);
    if (!nccl.ok()) {
      return absl::Status(nccl.status().code(),
                          absl::StrCat("cuda:", device_, ": ", nccl.status().message()));
    }
    nccl_ = *std::move(nccl);
    timed_ = std::make_unique<TimedDeviceCommunicator>(*nccl_, clock_);
    return absl::OkStatus();
  }

  absl::StatusOr<StepMeasurement> Run(const core::Plan& plan, core::CommScheme scheme,
                                      uint64_t seed, Communicator&) override {
    if (timed_ == nullptr) {
      return absl::FailedPreconditionError("CUDA backend: Run before Connect");
    }
    // The daemon's thread may not have this device current.
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice(", device_, ")");
    FLASHCP_ASSIGN_OR_RETURN(const core::CommLayout layout, core::BuildCommLayout(plan));
    FLASHCP_ASSIGN_OR_RETURN(CpRankLayout rank_plan,
                             BuildCpRankLayout(plan, layout, rank_, scheme));
    const size_t rows = static_cast<size_t>(rank_plan.local_rows);
    const size_t q_elems = rows * shape_.heads_q * shape_.head_dim;
    const size_t kv_elems = rows * shape_.heads_kv * shape_.head_dim;
    for (DeviceBuffer<bf16>* b : {&q_, &o_, &dout_, &dq_}) FLASHCP_RETURN_IF_ERROR(b->Reserve(q_elems));
    for (DeviceBuffer<bf16>* b : {&k_, &v_, &dk_, &dv_}) FLASHCP_RETURN_IF_ERROR(b->Reserve(kv_elems));
    FLASHCP_RETURN_IF_ERROR(lse_.Reserve(rows * shape_.heads_q));
    const cudaStream_t s = stream_.get();
    const uint64_t base = seed * 0x100000001B3ull + static_cast<uint64_t>(rank_) * 4;
    FLASHCP_RETURN_IF_ERROR(LaunchFillRandomBf16(q_.data(), q_elems, base, s));
    FLASHCP_RETURN_IF_ERROR(LaunchFillRandomBf16(k_.data(), kv_elems, base + 1, s));
    FLASHCP_RETURN_IF_ERROR(LaunchFillRandomBf16(v_.data(), kv_elems, base + 2, s));
    FLASHCP_RETURN_IF_ERROR(LaunchFillRandomBf16(dout_.data(), q_elems, base + 3, s));

    FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<GpuCpRank> step,
                             GpuCpRank::Create(std::move(rank_plan), shape_, *attention_,
                                               *timed_, s));
    const CommStats before = nccl_->stats();
    const absl::Duration comm_before = timed_->time();
    FLASHCP_RETURN_IF_ERROR(step->Forward(q_.data(), k_.data(), v_.data(), o_.data(), lse_.data()));
    FLASHCP_RETURN_IF_ERROR(step->Backward(dout_.data(), dq_.data(), dk_.data(), dv_.data()));
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "cuda:", device_, ": CP step of rank ",
                                 rank_);
    FLASHCP_ASSIGN_OR_RETURN(const CpAttentionTimes times, step->Times());
    const CommStats after = nccl_->stats();

    StepMeasurement m;
    m.forward_seconds = (times.whole_fwd_ms + times.prefix_fwd_ms) / 1e3;
    m.backward_seconds = (times.prefix_bwd_ms + times.whole_bwd_ms) / 1e3;
    m.attention_seconds = m.forward_seconds + m.backward_seconds;
    m.comm_seconds = absl::ToDoubleSeconds(timed_->time() - comm_before);
    m.bytes_sent = after.bytes_sent - before.bytes_sent;
    m.bytes_received = after.bytes_received - before.bytes_received;
    return m;
  }

 private:
  const int32_t device_;
  const int32_t rank_;
  const core::WaitClock& clock_;
  const AttentionShape shape_;
  CudaStream stream_;
  std::unique_ptr<Attention> attention_;
  std::unique_ptr<DeviceCommunicator> nccl_;
  std::unique_ptr<TimedDeviceCommunicator> timed_;
  // Step tensors, kept across steps (C/N rows each; grown, never shrunk).
  DeviceBuffer<bf16> q_, k_, v_, o_, dout_, dq_, dk_, dv_;
  DeviceBuffer<float> lse_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RankBackend>> MakeCudaRankBackend(int32_t device,
                                                                 const BackendConfig& config) {
  const std::string what = absl::StrCat("--device cuda:", device);
  if (config.clock == nullptr) return absl::InvalidArgumentError("CUDA backend: no clock");
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    // Whatever the reason (no driver, no device, a driver too old), this
    // machine cannot run the backend.
    return absl::FailedPreconditionError(
        CudaStatus(err, absl::StrCat(what, ": cudaGetDeviceCount")).message());
  }
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": this machine has ", count, " CUDA device(s)"));
  }
  AttentionShape shape;
  shape.heads_q = config.heads;
  shape.heads_kv = config.heads;
  shape.head_dim = config.head_dim;
  if (const absl::Status s = ValidateAttentionShape(shape); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--heads, --head_dim on ", what, ": ", s.message()));
  }
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), what, ": cudaSetDevice");
  FLASHCP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  // The heuristics' plans, as the device check verifies them: autotune showed
  // no consistent gain (docs/gpu.md) and would time inside the step.
  FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<CudnnAttention> attention,
                           CudnnAttention::Create(shape));
  return std::unique_ptr<RankBackend>(std::make_unique<CudaRankBackend>(
      device, config, shape, std::move(stream), std::move(attention)));
}

}  // namespace flashcp::worker::cuda
