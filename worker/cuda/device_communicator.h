// GPU backends of worker::Communicator (worker/communicator.h): NCCL across
// GPUs, and a device-local group for N ranks on one GPU. Buffers passed to
// every operation are device memory of this communicator's device.
//
// Ordering: every operation is enqueued on stream() and the call returns once
// it completed on the device, or with an error after the timeout (the NCCL
// communicator is then aborted, so nothing hangs). Inputs produced on another
// stream must be ordered before the call: record an event there and make
// stream() wait on it. Work enqueued on other streams before the call keeps
// running while the call waits: that is how the CP step overlaps the
// attention of whole documents with the KV exchange.
#ifndef FLASHCP_WORKER_CUDA_DEVICE_COMMUNICATOR_H_
#define FLASHCP_WORKER_CUDA_DEVICE_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/communicator.h"

namespace flashcp::worker::cuda {

class DeviceCommunicator : public ::flashcp::worker::Communicator {
 public:
  virtual cudaStream_t stream() const = 0;
  virtual int device() const = 0;
};

struct NcclOptions {
  int device = 0;  // CUDA device of this rank
  // Bound on the rendezvous, the communicator's creation and every operation.
  absl::Duration timeout = absl::Seconds(60);
  // Store key of the NCCL unique id; one key per communicator of a group.
  std::string id_key = "flashcp/nccl/unique_id";
};

// Joins a NCCL group of `size` ranks as `rank`. Rank 0 makes the unique id and
// publishes it through `store` (the group's rendezvous: Gloo's HashStore or
// FileStore, or the planner-served GrpcStore of worker/grpc_store.h); the others read it. The
// communicator is non-blocking (ncclConfig_t::blocking = 0): every call polls
// ncclCommGetAsyncError and the stream with a deadline and aborts the
// communicator (ncclCommAbort) when a peer fails or does not take part.
// InvalidArgument for a bad rank, size or device; DeadlineExceeded when the id
// or the peers do not arrive in time; Unavailable for a NCCL or store failure.
// AllGatherV uses ncclAllGather where all counts are equal (the allgather and
// full_kv schemes pad to equal blocks), grouped ncclSend/ncclRecv otherwise;
// SendRecv is one ncclGroupStart/End of ncclSend/ncclRecv; ReduceScatterV
// receives the N-1 fp32 blocks and sums them in rank order on the device.
absl::StatusOr<std::unique_ptr<DeviceCommunicator>> ConnectNccl(gloo::rendezvous::Store& store,
                                                                int32_t rank, int32_t size,
                                                                const NcclOptions& options = {});

// N ranks as threads of one process sharing one GPU (NCCL refuses two ranks on
// one device). Each operation meets all N ranks (a barrier bounded by the
// timeout), then every rank copies what it receives from the peers' buffers on
// its own stream, waits, and meets them again so no sender reuses a buffer
// early. Used for correctness of the whole CP step on a one-GPU machine; its
// transfers are device-to-device copies, so it says nothing about interconnect
// time (that needs a multi-GPU machine and ConnectNccl).
class DeviceLocalGroup {
 public:
  static absl::StatusOr<std::shared_ptr<DeviceLocalGroup>> Create(int32_t size, int device,
                                                                  absl::Duration timeout);
  // One communicator per rank; each is used by one thread.
  absl::StatusOr<std::unique_ptr<DeviceCommunicator>> Join(int32_t rank);
  // Breaks the group (a rank failed outside a collective): every rank waiting
  // in or later entering an operation gets FailedPrecondition naming `why`,
  // instead of waiting out the timeout.
  void Abort(absl::Status why);

  class State;  // device_local_communicator.cc
  ~DeviceLocalGroup();

 private:
  DeviceLocalGroup() = default;
  std::shared_ptr<State> state_;
};

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_DEVICE_COMMUNICATOR_H_
