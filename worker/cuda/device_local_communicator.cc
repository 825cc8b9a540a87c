// DeviceLocalGroup (device_communicator.h): N ranks as threads on one GPU.
#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "worker/cuda/comm_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/device_communicator.h"
#include "worker/cuda/device_memory.h"

namespace flashcp::worker::cuda {

// What one rank posted for the current operation.
struct Posted {
  std::string op;                       // "AllGatherV", "SendRecv", ...
  const std::byte* input = nullptr;     // AllGatherV, ReduceScatterV (whole input)
  std::vector<int64_t> counts;          // AllGatherV (bytes), ReduceScatterV (floats)
  std::vector<SendOp> sends;            // SendRecv
};

class DeviceLocalGroup::State {
 public:
  State(int32_t size, int device, absl::Duration timeout)
      : size_(size), device_(device), timeout_(timeout), posted_(size) {}

  int32_t size() const { return size_; }
  int device() const { return device_; }

  // Meets every rank (generation barrier). DeadlineExceeded names the
  // missing ranks; after any failure the group is broken for everyone.
  absl::Status Meet(int32_t rank, absl::string_view what) {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return Broken(rank, what);
    const int64_t gen = generation_;
    arrived_.push_back(rank);
    if (static_cast<int32_t>(arrived_.size()) == size_) {
      arrived_.clear();
      ++generation_;
      return absl::OkStatus();
    }
    const absl::Time deadline = absl::Now() + timeout_;
    auto done = [&]() { return generation_ != gen || !broken_.ok(); };
    if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
      std::vector<int32_t> missing;
      for (int32_t r = 0; r < size_; ++r)
        if (std::find(arrived_.begin(), arrived_.end(), r) == arrived_.end()) missing.push_back(r);
      broken_ = absl::DeadlineExceededError(absl::StrCat(
          what, ": rank ", rank, " waited ", absl::FormatDuration(timeout_), " for ranks ",
          absl::StrJoin(missing, ","), " (gone or stuck)"));
      return broken_;
    }
    if (!broken_.ok() && generation_ == gen) return Broken(rank, what);
    return absl::OkStatus();
  }

  void Post(int32_t rank, Posted p) {
    absl::MutexLock lock(&mu_);
    posted_[rank] = std::move(p);
  }
  Posted Get(int32_t rank) {
    absl::MutexLock lock(&mu_);
    return posted_[rank];
  }
  void Break(absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = std::move(s);
  }

 private:
  absl::Status Broken(int32_t rank, absl::string_view what) const {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " on rank ", rank, ": group broken after: ", broken_.message()));
  }

  const int32_t size_;
  const int device_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  int64_t generation_ = 0;
  std::vector<int32_t> arrived_;
  std::vector<Posted> posted_;
  absl::Status broken_;
};

namespace {

class DeviceLocalCommunicator final : public DeviceCommunicator {
 public:
  DeviceLocalCommunicator(std::shared_ptr<DeviceLocalGroup::State> state, int32_t rank)
      : state_(std::move(state)), rank_(rank) {}

  absl::Status Init() {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(state_->device()), "device-local rank ", rank_,
                                 ": cudaSetDevice(", state_->device(), ")");
    FLASHCP_ASSIGN_OR_RETURN(stream_, CudaStream::Create());
    return absl::OkStatus();
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return state_->size(); }
  cudaStream_t stream() const override { return stream_.get(); }
  int device() const override { return state_->device(); }
  CommStats stats() const override { return stats_; }

  absl::Status AllGatherV(absl::Span<const std::byte> input, absl::Span<std::byte> output,
                          absl::Span<const int64_t> counts) override {
    const std::string what = absl::StrCat("AllGatherV (device-local) rank ", rank_);
    FLASHCP_RETURN_IF_ERROR(CheckCounts(what, counts));
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (static_cast<int64_t>(input.size()) != counts[rank_] ||
        static_cast<int64_t>(output.size()) != total)
      return absl::InvalidArgumentError(absl::StrCat(what, ": input ", input.size(), " bytes, output ",
                                                     output.size(), " bytes; want ", counts[rank_],
                                                     " and ", total));
    FLASHCP_RETURN_IF_ERROR(Begin(what, Posted{"AllGatherV", input.data(),
                                               {counts.begin(), counts.end()}, {}}));
    int64_t offset = 0;
    for (int32_t p = 0; p < size(); ++p) {
      const Posted peer = state_->Get(p);
      if (peer.op != "AllGatherV" || peer.counts != std::vector<int64_t>(counts.begin(), counts.end()))
        return Abort(absl::InvalidArgumentError(absl::StrCat(
            what, ": rank ", p, " posted ", peer.op, " with other counts")));
      if (counts[p] > 0)
        FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(output.data() + offset, peer.input, counts[p],
                                                     cudaMemcpyDeviceToDevice, stream_.get()),
                                     what, ": copy block of rank ", p, " (", counts[p], " bytes)");
      offset += counts[p];
    }
    FLASHCP_RETURN_IF_ERROR(End(what));
    stats_.bytes_sent += counts[rank_] * (size() - 1);
    stats_.bytes_received += total - counts[rank_];
    return absl::OkStatus();
  }

  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) override {
    const std::string what = absl::StrCat("SendRecv (device-local) rank ", rank_);
    for (const SendOp& s : sends)
      if (s.peer < 0 || s.peer >= size() || s.peer == rank_)
        return absl::InvalidArgumentError(absl::StrCat(what, ": bad send peer ", s.peer));
    for (const RecvOp& r : recvs)
      if (r.peer < 0 || r.peer >= size() || r.peer == rank_)
        return absl::InvalidArgumentError(absl::StrCat(what, ": bad recv peer ", r.peer));
    FLASHCP_RETURN_IF_ERROR(Begin(what, Posted{"SendRecv", nullptr, {}, {sends.begin(), sends.end()}}));
    int64_t in = 0, out = 0;
    for (const RecvOp& r : recvs) {
      if (r.data.empty()) continue;
      const Posted peer = state_->Get(r.peer);
      auto it = std::find_if(peer.sends.begin(), peer.sends.end(),
                             [&](const SendOp& s) { return s.peer == rank_; });
      if (peer.op != "SendRecv" || it == peer.sends.end() || it->data.size() != r.data.size())
        return Abort(absl::InvalidArgumentError(absl::StrCat(
            what, ": expects ", r.data.size(), " bytes from rank ", r.peer, ", which sends ",
            it == peer.sends.end() ? int64_t{-1} : static_cast<int64_t>(it->data.size()))));
      FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.data.data(), it->data.data(), r.data.size(),
                                                   cudaMemcpyDeviceToDevice, stream_.get()),
                                   what, ": recv from rank ", r.peer, " (", r.data.size(), " bytes)");
      in += static_cast<int64_t>(r.data.size());
    }
    for (const SendOp& s : sends) out += static_cast<int64_t>(s.data.size());
    FLASHCP_RETURN_IF_ERROR(End(what));
    stats_.bytes_sent += out;
    stats_.bytes_received += in;
    return absl::OkStatus();
  }

  absl::Status ReduceScatterV(absl::Span<const float> input, absl::Span<float> output,
                              absl::Span<const int64_t> counts) override {
    const std::string what = absl::StrCat("ReduceScatterV (device-local) rank ", rank_);
    FLASHCP_RETURN_IF_ERROR(CheckCounts(what, counts));
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t mine = counts[rank_];
    if (static_cast<int64_t>(input.size()) != total || static_cast<int64_t>(output.size()) != mine)
      return absl::InvalidArgumentError(absl::StrCat(what, ": input ", input.size(),
                                                     " floats, output ", output.size(), "; want ",
                                                     total, " and ", mine));
    int64_t my_offset = 0;
    for (int32_t p = 0; p < rank_; ++p) my_offset += counts[p];
    FLASHCP_RETURN_IF_ERROR(scratch_.Reserve(static_cast<size_t>(mine) * size()));
    FLASHCP_RETURN_IF_ERROR(
        Begin(what, Posted{"ReduceScatterV", reinterpret_cast<const std::byte*>(input.data()),
                           {counts.begin(), counts.end()}, {}}));
    for (int32_t p = 0; p < size(); ++p) {
      const Posted peer = state_->Get(p);
      if (peer.op != "ReduceScatterV" ||
          peer.counts != std::vector<int64_t>(counts.begin(), counts.end()))
        return Abort(absl::InvalidArgumentError(
            absl::StrCat(what, ": rank ", p, " posted ", peer.op, " with other counts")));
      if (mine > 0)
        FLASHCP_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(scratch_.data() + p * mine,
                            reinterpret_cast<const float*>(peer.input) + my_offset,
                            mine * sizeof(float), cudaMemcpyDeviceToDevice, stream_.get()),
            what, ": block from rank ", p);
    }
    FLASHCP_RETURN_IF_ERROR(LaunchSumBlocks(scratch_.data(), size(), mine, output.data(), stream_.get()));
    FLASHCP_RETURN_IF_ERROR(End(what));
    for (int32_t p = 0; p < size(); ++p)
      if (p != rank_) stats_.bytes_sent += counts[p] * 4;
    stats_.bytes_received += mine * 4 * (size() - 1);
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    const std::string what = absl::StrCat("Barrier (device-local) rank ", rank_);
    FLASHCP_RETURN_IF_ERROR(Begin(what, Posted{"Barrier", nullptr, {}, {}}));
    return End(what);
  }

 private:
  absl::Status CheckCounts(const std::string& what, absl::Span<const int64_t> counts) const {
    if (static_cast<int32_t>(counts.size()) != size())
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", counts.size(), " counts for ",
                                                     size(), " ranks"));
    for (int64_t c : counts)
      if (c < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative count ", c));
    return absl::OkStatus();
  }
  // Inputs ready (the caller ordered them before stream()), posted, met.
  absl::Status Begin(const std::string& what, Posted p) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(state_->device()), what, ": cudaSetDevice");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()), what, ": inputs");
    state_->Post(rank_, std::move(p));
    return state_->Meet(rank_, what);
  }
  // Own copies done, then meet again so no peer reuses its buffers early.
  absl::Status End(const std::string& what) {
    if (const cudaError_t e = cudaStreamSynchronize(stream_.get()); e != cudaSuccess)
      return Abort(CudaStatus(e, absl::StrCat(what, ": copies")));
    return state_->Meet(rank_, absl::StrCat(what, " (completion)"));
  }
  absl::Status Abort(absl::Status s) {
    state_->Break(s);
    return s;
  }

  std::shared_ptr<DeviceLocalGroup::State> state_;
  int32_t rank_;
  CudaStream stream_;
  DeviceBuffer<float> scratch_;
  CommStats stats_;
};

}  // namespace

DeviceLocalGroup::~DeviceLocalGroup() = default;

absl::StatusOr<std::shared_ptr<DeviceLocalGroup>> DeviceLocalGroup::Create(int32_t size, int device,
                                                                           absl::Duration timeout) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("DeviceLocalGroup: size ", size));
  if (timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("DeviceLocalGroup: timeout must be positive");
  std::shared_ptr<DeviceLocalGroup> g(new DeviceLocalGroup());
  g->state_ = std::make_shared<State>(size, device, timeout);
  return g;
}

void DeviceLocalGroup::Abort(absl::Status why) { state_->Break(std::move(why)); }

absl::StatusOr<std::unique_ptr<DeviceCommunicator>> DeviceLocalGroup::Join(int32_t rank) {
  if (rank < 0 || rank >= state_->size())
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceLocalGroup::Join: rank ", rank, " of ", state_->size()));
  auto c = std::make_unique<DeviceLocalCommunicator>(state_, rank);
  FLASHCP_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<DeviceCommunicator>(std::move(c));
}

}  // namespace flashcp::worker::cuda
