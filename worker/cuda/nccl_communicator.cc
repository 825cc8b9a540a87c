// NCCL backend of DeviceCommunicator (device_communicator.h). Every NCCL and
// CUDA call is checked and turned into a Status naming the operation, the
// peer where there is one, and the bytes.
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "worker/cuda/comm_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/device_communicator.h"
#include "worker/cuda/device_memory.h"

namespace flashcp::worker::cuda {
namespace {

// How often a wait polls NCCL's async error and the stream: short against a
// millisecond-scale collective, long enough not to spin a core flat out.
constexpr absl::Duration kPoll = absl::Microseconds(20);

absl::Status NcclError(ncclResult_t r, ncclComm_t comm, absl::string_view context) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  const std::string msg = absl::StrCat(context, ": NCCL ", ncclGetErrorString(r),
                                       (last != nullptr && *last != '\0') ? absl::StrCat(" (", last, ")") : "");
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

class NcclCommunicator final : public DeviceCommunicator {
 public:
  NcclCommunicator(int32_t rank, int32_t size, const NcclOptions& options)
      : rank_(rank), size_(size), options_(options) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      (void)cudaSetDevice(options_.device);
      // A broken communicator may have operations stuck on a dead peer:
      // abort frees it without waiting; a healthy one is destroyed normally.
      if (!broken_.ok()) (void)ncclCommAbort(comm_);
      else (void)ncclCommDestroy(comm_);
    }
  }

  absl::Status Init(const ncclUniqueId& id) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "NCCL init: cudaSetDevice(",
                                 options_.device, ")");
    FLASHCP_ASSIGN_OR_RETURN(stream_, CudaStream::Create());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every wait is ours, bounded by the timeout
    ncclUniqueId copy = id;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, copy, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      return Fail(NcclError(r, comm_, absl::StrCat("ncclCommInitRankConfig rank ", rank_, " of ", size_)));
    return WaitEnqueued(absl::StrCat("ncclCommInitRankConfig rank ", rank_, " of ", size_));
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  cudaStream_t stream() const override { return stream_.get(); }
  int device() const override { return options_.device; }
  CommStats stats() const override { return stats_; }

  absl::Status AllGatherV(absl::Span<const std::byte> input, absl::Span<std::byte> output,
                          absl::Span<const int64_t> counts) override {
    FLASHCP_RETURN_IF_ERROR(Usable("AllGatherV"));
    FLASHCP_RETURN_IF_ERROR(CheckCounts("AllGatherV", counts));
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (static_cast<int64_t>(input.size()) != counts[rank_] ||
        static_cast<int64_t>(output.size()) != total)
      return absl::InvalidArgumentError(absl::StrCat(
          "AllGatherV rank ", rank_, ": input ", input.size(), " bytes (want ", counts[rank_],
          "), output ", output.size(), " bytes (want ", total, ")"));
    const bool equal = std::all_of(counts.begin(), counts.end(),
                                   [&](int64_t c) { return c == counts[0]; });
    const std::string what = absl::StrCat("AllGatherV rank ", rank_, " (", counts[rank_],
                                          " bytes in, ", total, " bytes out)");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), what, ": cudaSetDevice");
    if (equal && counts[0] > 0) {
      // The schemes that pad to the largest block: one ncclAllGather.
      const ncclResult_t r = ncclAllGather(input.data(), output.data(),
                                           static_cast<size_t>(counts[0]), ncclUint8, comm_,
                                           stream_.get());
      if (r != ncclSuccess && r != ncclInProgress) return Fail(NcclError(r, comm_, what));
    } else {
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      int64_t offset = 0;
      for (int32_t p = 0; p < size_; ++p) {
        if (p == rank_) {
          if (counts[p] > 0)
            FLASHCP_CUDA_RETURN_IF_ERROR(
                cudaMemcpyAsync(output.data() + offset, input.data(), counts[p],
                                cudaMemcpyDeviceToDevice, stream_.get()),
                what, ": own block");
        } else {
          sends.push_back({p, input});
          recvs.push_back({p, output.subspan(offset, counts[p])});
        }
        offset += counts[p];
      }
      FLASHCP_RETURN_IF_ERROR(EnqueueGroup(what, sends, recvs));
    }
    FLASHCP_RETURN_IF_ERROR(WaitEnqueued(what));
    FLASHCP_RETURN_IF_ERROR(WaitStream(what));
    stats_.bytes_sent += counts[rank_] * (size_ - 1);
    stats_.bytes_received += total - counts[rank_];
    return absl::OkStatus();
  }

  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) override {
    FLASHCP_RETURN_IF_ERROR(Usable("SendRecv"));
    int64_t out = 0, in = 0;
    for (const SendOp& s : sends) {
      FLASHCP_RETURN_IF_ERROR(CheckPeer("SendRecv send", s.peer));
      out += static_cast<int64_t>(s.data.size());
    }
    for (const RecvOp& r : recvs) {
      FLASHCP_RETURN_IF_ERROR(CheckPeer("SendRecv recv", r.peer));
      in += static_cast<int64_t>(r.data.size());
    }
    const std::string what = absl::StrCat("SendRecv rank ", rank_, " (", sends.size(), " sends, ",
                                          out, " bytes; ", recvs.size(), " recvs, ", in, " bytes)");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), what, ": cudaSetDevice");
    FLASHCP_RETURN_IF_ERROR(EnqueueGroup(what, sends, recvs));
    FLASHCP_RETURN_IF_ERROR(WaitEnqueued(what));
    FLASHCP_RETURN_IF_ERROR(WaitStream(what));
    stats_.bytes_sent += out;
    stats_.bytes_received += in;
    return absl::OkStatus();
  }

  absl::Status ReduceScatterV(absl::Span<const float> input, absl::Span<float> output,
                              absl::Span<const int64_t> counts) override {
    FLASHCP_RETURN_IF_ERROR(Usable("ReduceScatterV"));
    FLASHCP_RETURN_IF_ERROR(CheckCounts("ReduceScatterV", counts));
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t mine = counts[rank_];
    if (static_cast<int64_t>(input.size()) != total || static_cast<int64_t>(output.size()) != mine)
      return absl::InvalidArgumentError(absl::StrCat(
          "ReduceScatterV rank ", rank_, ": input ", input.size(), " floats (want ", total,
          "), output ", output.size(), " floats (want ", mine, ")"));
    const std::string what =
        absl::StrCat("ReduceScatterV rank ", rank_, " (", mine * 4, " bytes per block)");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), what, ": cudaSetDevice");
    // scratch [size][mine]: block p from rank p, own block copied in, then
    // summed in rank order on the device (deterministic, fp32).
    FLASHCP_RETURN_IF_ERROR(scratch_.Reserve(static_cast<size_t>(mine) * size_));
    std::vector<int64_t> offset(size_ + 1, 0);
    for (int32_t p = 0; p < size_; ++p) offset[p + 1] = offset[p] + counts[p];
    auto bytes_of = [](absl::Span<const float> s) {
      return absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()),
                                         s.size() * sizeof(float));
    };
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int32_t p = 0; p < size_; ++p) {
      float* slot = scratch_.data() + static_cast<int64_t>(p) * mine;
      if (p == rank_) {
        if (mine > 0)
          FLASHCP_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(slot, input.data() + offset[p], mine * sizeof(float),
                              cudaMemcpyDeviceToDevice, stream_.get()),
              what, ": own block");
        continue;
      }
      sends.push_back({p, bytes_of(input.subspan(offset[p], counts[p]))});
      recvs.push_back({p, absl::Span<std::byte>(reinterpret_cast<std::byte*>(slot),
                                                mine * sizeof(float))});
    }
    FLASHCP_RETURN_IF_ERROR(EnqueueGroup(what, sends, recvs));
    FLASHCP_RETURN_IF_ERROR(WaitEnqueued(what));
    FLASHCP_RETURN_IF_ERROR(LaunchSumBlocks(scratch_.data(), size_, mine, output.data(), stream_.get()));
    FLASHCP_RETURN_IF_ERROR(WaitStream(what));
    for (int32_t p = 0; p < size_; ++p)
      if (p != rank_) stats_.bytes_sent += counts[p] * 4;
    stats_.bytes_received += mine * 4 * (size_ - 1);
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    FLASHCP_RETURN_IF_ERROR(Usable("Barrier"));
    const std::string what = absl::StrCat("Barrier rank ", rank_);
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), what, ": cudaSetDevice");
    FLASHCP_RETURN_IF_ERROR(scratch_.Reserve(1));
    const ncclResult_t r = ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclFloat, ncclSum,
                                         comm_, stream_.get());
    if (r != ncclSuccess && r != ncclInProgress) return Fail(NcclError(r, comm_, what));
    FLASHCP_RETURN_IF_ERROR(WaitEnqueued(what));
    return WaitStream(what);
  }

 private:
  absl::Status Usable(absl::string_view op) const {
    if (broken_.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(op, " on rank ", rank_, ": communicator aborted after: ", broken_.message()));
  }
  absl::Status CheckPeer(absl::string_view op, int32_t peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      return absl::InvalidArgumentError(
          absl::StrCat(op, " rank ", rank_, ": bad peer ", peer, " (size ", size_, ")"));
    return absl::OkStatus();
  }
  absl::Status CheckCounts(absl::string_view op, absl::Span<const int64_t> counts) const {
    if (static_cast<int32_t>(counts.size()) != size_)
      return absl::InvalidArgumentError(
          absl::StrCat(op, " rank ", rank_, ": ", counts.size(), " counts for ", size_, " ranks"));
    for (int64_t c : counts)
      if (c < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative count ", c));
    return absl::OkStatus();
  }

  // Aborts the communicator and remembers why; every later call fails with it.
  absl::Status Fail(absl::Status s) {
    if (broken_.ok()) broken_ = s;
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    return s;
  }

  absl::Status EnqueueGroup(const std::string& what, absl::Span<const SendOp> sends,
                            absl::Span<const RecvOp> recvs) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return Fail(NcclError(r, comm_, absl::StrCat(what, ": ncclGroupStart")));
    for (const SendOp& s : sends) {
      if (s.data.empty()) continue;  // zero-byte messages are skipped by both sides
      r = ncclSend(s.data.data(), s.data.size(), ncclUint8, s.peer, comm_, stream_.get());
      if (r != ncclSuccess && r != ncclInProgress) {
        (void)ncclGroupEnd();
        return Fail(NcclError(r, comm_, absl::StrCat(what, ": ncclSend to rank ", s.peer, " (",
                                                     s.data.size(), " bytes)")));
      }
    }
    for (const RecvOp& v : recvs) {
      if (v.data.empty()) continue;
      r = ncclRecv(v.data.data(), v.data.size(), ncclUint8, v.peer, comm_, stream_.get());
      if (r != ncclSuccess && r != ncclInProgress) {
        (void)ncclGroupEnd();
        return Fail(NcclError(r, comm_, absl::StrCat(what, ": ncclRecv from rank ", v.peer, " (",
                                                     v.data.size(), " bytes)")));
      }
    }
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress)
      return Fail(NcclError(r, comm_, absl::StrCat(what, ": ncclGroupEnd")));
    return absl::OkStatus();
  }

  // Non-blocking communicator: the host side of an operation may still be in
  // progress after the call returned ncclInProgress. Poll until it is not.
  absl::Status WaitEnqueued(const std::string& what) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    while (true) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) return Fail(NcclError(r, comm_, absl::StrCat(what, ": ncclCommGetAsyncError")));
      if (async == ncclSuccess) return absl::OkStatus();
      if (async != ncclInProgress) return Fail(NcclError(async, comm_, what));
      if (absl::Now() > deadline)
        return Fail(absl::DeadlineExceededError(absl::StrCat(
            what, ": not enqueued within ", absl::FormatDuration(options_.timeout),
            " (a peer did not take part); communicator aborted")));
      absl::SleepFor(kPoll);
    }
  }

  // Waits for the stream with the deadline, watching NCCL's async error so a
  // dead peer (ncclRemoteError / ncclSystemError from the proxy) fails fast.
  absl::Status WaitStream(const std::string& what) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_.get());
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Fail(CudaStatus(q, absl::StrCat(what, ": stream")));
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        return Fail(NcclError(async, comm_, absl::StrCat(what, ": peer failure")));
      if (absl::Now() > deadline)
        return Fail(absl::DeadlineExceededError(absl::StrCat(
            what, ": did not complete within ", absl::FormatDuration(options_.timeout),
            " (a peer is gone or stuck); communicator aborted")));
      absl::SleepFor(kPoll);
    }
  }

  int32_t rank_, size_;
  NcclOptions options_;
  ncclComm_t comm_ = nullptr;
  CudaStream stream_;
  DeviceBuffer<float> scratch_;
  CommStats stats_;
  absl::Status broken_;
};

// The unique id through the group's store. Gloo's stores throw on timeout
// and I/O failure; no exception may leave this function.
absl::StatusOr<ncclUniqueId> ExchangeId(gloo::rendezvous::Store& store, int32_t rank,
                                        const NcclOptions& options) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  try {
    if (rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) return NcclError(r, nullptr, "ncclGetUniqueId");
      store.set(options.id_key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    }
    store.wait({options.id_key}, std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout)));
    const std::vector<char> got = store.get(options.id_key);
    if (got.size() != sizeof(id.internal))
      return absl::InternalError(absl::StrCat("NCCL unique id under '", options.id_key, "' has ",
                                              got.size(), " bytes, want ", sizeof(id.internal)));
    std::memcpy(id.internal, got.data(), got.size());
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat("rank ", rank, ": NCCL unique id '",
                                                    options.id_key, "' from the store: ", e.what()));
  }
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCommunicator>> ConnectNccl(gloo::rendezvous::Store& store,
                                                                int32_t rank, int32_t size,
                                                                const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size)
    return absl::InvalidArgumentError(absl::StrCat("ConnectNccl: rank ", rank, " of size ", size));
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("ConnectNccl: timeout must be positive");
  int devices = 0;
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&devices), "ConnectNccl: cudaGetDeviceCount");
  if (options.device < 0 || options.device >= devices)
    return absl::InvalidArgumentError(
        absl::StrCat("ConnectNccl: device ", options.device, " of ", devices));
  FLASHCP_ASSIGN_OR_RETURN(const ncclUniqueId id, ExchangeId(store, rank, options));
  auto comm = std::make_unique<NcclCommunicator>(rank, size, options);
  FLASHCP_RETURN_IF_ERROR(comm->Init(id));
  return std::unique_ptr<DeviceCommunicator>(std::move(comm));
}

}  // namespace flashcp::worker::cuda
