// The seam between the worker daemon's step loop and the device that runs a
// step: one rank's forward and backward of a plan on seeded inputs. The CPU
// backend (here) runs the engine (worker/engine.h) over the group's Gloo
// communicator; the CUDA backend (worker/cuda/cuda_rank_backend.h) runs
// GpuCpRank over its own NCCL communicator, which it joins through the
// group's rendezvous store. flashcp-worker picks one from --device.
#ifndef FLASHCP_WORKER_RANK_BACKEND_H_
#define FLASHCP_WORKER_RANK_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/analysis.h"
#include "core/clock.h"
#include "core/types.h"
#include "gloo/rendezvous/store.h"
#include "worker/communicator.h"

namespace flashcp::worker {

// What one rank's step measured (seconds, bytes).
struct StepMeasurement {
  // Forward and backward passes. CPU: wall time of each pass, its collectives
  // included. CUDA: device time of the pass's attention launches (CUDA
  // events; packing and exchange waits outside).
  double forward_seconds = 0, backward_seconds = 0;
  // Time inside the step's KV and gradient collectives (waiting for peers
  // included).
  double comm_seconds = 0;
  // Attention compute time, what the group compares for its measured
  // imbalance. CPU: forward + backward - comm. CUDA: forward + backward.
  double attention_seconds = 0;
  // CPU with one kernel thread: CPU time of the rank's thread over forward
  // and backward (BackendConfig::thread_cpu_seconds), the kernels' compute
  // without the waits a shared machine adds to wall time (collectives' own
  // CPU work included, their waits not). 0: not measured (CUDA, or more
  // than one kernel thread, whose other threads it would miss).
  double attention_cpu_seconds = 0;
  // Payload bytes of the step's collectives (Communicator::stats counting).
  int64_t bytes_sent = 0, bytes_received = 0;
};

// A decorator that adds up the time spent inside the collectives on an
// injected clock (StepMeasurement::comm_seconds, both backends); counts pass
// through. `Base` is Communicator or an interface derived from it; a derived
// interface's own methods are the subclass's to forward to inner() (the CUDA
// backend's stream() and device()). `inner` and `clock` must outlive it.
template <typename Base = Communicator>
class TimedCommunicator : public Base {
 public:
  TimedCommunicator(Base& inner, const core::WaitClock& clock) : inner_(inner), clock_(clock) {}
  int32_t rank() const override { return inner_.rank(); }
  int32_t size() const override { return inner_.size(); }
  absl::Status AllGatherV(absl::Span<const std::byte> input, absl::Span<std::byte> output,
                          absl::Span<const int64_t> counts) override {
    return Time([&] { return inner_.AllGatherV(input, output, counts); });
  }
  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) override {
    return Time([&] { return inner_.SendRecv(sends, recvs); });
  }
  absl::Status ReduceScatterV(absl::Span<const float> input, absl::Span<float> output,
                              absl::Span<const int64_t> counts) override {
    return Time([&] { return inner_.ReduceScatterV(input, output, counts); });
  }
  absl::Status Barrier() override {
    return Time([&] { return inner_.Barrier(); });
  }
  CommStats stats() const override { return inner_.stats(); }
  // The time inside the collectives so far.
  absl::Duration time() const { return time_; }

 protected:
  Base& inner() const { return inner_; }

 private:
  template <typename F>
  absl::Status Time(F f) {
    const absl::Time t0 = clock_.Now();
    absl::Status s = f();
    time_ += clock_.Now() - t0;
    return s;
  }
  Base& inner_;
  const core::WaitClock& clock_;
  absl::Duration time_;
};

class RankBackend {
 public:
  virtual ~RankBackend() = default;
  // Bytes per element of Q, K and V as this backend stores them: the plans'
  // byte predictions are made for it (4: fp32 CPU; 2: bf16 CUDA).
  virtual int32_t dtype_bytes() const = 0;
  // Called once on every rank after the group's Gloo mesh has formed, with the
  // group's rendezvous store: a backend with a transport of its own joins it
  // here, bounded by `timeout`. `store` reports failures by exception
  // (gloo::IoException); none may leave this call.
  virtual absl::Status Connect(gloo::rendezvous::Store& store, int32_t rank, int32_t size,
                               absl::Duration timeout) = 0;
  // This rank's forward and backward of `plan` under `scheme` on inputs
  // seeded by `seed`. `group` is the group's (Gloo) communicator.
  virtual absl::StatusOr<StepMeasurement> Run(const core::Plan& plan, core::CommScheme scheme,
                                              uint64_t seed, Communicator& group) = 0;
};

struct BackendConfig {
  int32_t rank = 0;
  int32_t heads = 1, head_dim = 1;  // H, D (the CUDA backend: heads_q = heads_kv = H)
  int32_t threads = 1;              // CPU kernel threads
  const core::WaitClock* clock = nullptr;  // host timings; must outlive the backend
  // CPU seconds the calling thread has used (the CPU backend's
  // attention_cpu_seconds); null: CLOCK_THREAD_CPUTIME_ID.
  std::function<double()> thread_cpu_seconds;
};

// The CPU engine over the group communicator; times on config.clock, which
// must be set (MakeRankBackend checks; this does not).
std::unique_ptr<RankBackend> MakeCpuRankBackend(const BackendConfig& config);

// Makes the CUDA backend on device K (FailedPrecondition where no device is
// usable). Supplied by worker/cuda in a build with CUDA.
using CudaBackendFactory = std::function<absl::StatusOr<std::unique_ptr<RankBackend>>(
    int32_t device, const BackendConfig& config)>;

// --device: "cpu" gives -1, "cuda:K" gives K (decimal digits only, K <=
// 4095); InvalidArgument naming the flag otherwise.
absl::StatusOr<int32_t> ParseDevice(absl::string_view device);

// The backend for `device`: the CPU one, or for cuda:K the one `cuda` makes;
// FailedPrecondition "built without CUDA" where `cuda` is empty.
absl::StatusOr<std::unique_ptr<RankBackend>> MakeRankBackend(absl::string_view device,
                                                             const BackendConfig& config,
                                                             const CudaBackendFactory& cuda);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_RANK_BACKEND_H_
