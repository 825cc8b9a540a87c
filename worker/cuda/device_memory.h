// Owning handles for device memory, streams and events: no CUDA resource in
// worker/cuda is held by a raw pointer. Creation returns StatusOr; destruction
// ignores errors (a destructor has no one to report to, and a failed free
// after a device fault changes nothing).
#ifndef FLASHCP_WORKER_CUDA_DEVICE_MEMORY_H_
#define FLASHCP_WORKER_CUDA_DEVICE_MEMORY_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/cuda/cuda_status.h"

namespace flashcp::worker::cuda {

// `count` elements of T in device memory (cudaMalloc; never managed memory).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { Reset(); }

  // A zero-element buffer holds no allocation (data() is null).
  static absl::StatusOr<DeviceBuffer> Allocate(size_t count) {
    DeviceBuffer buffer;
    if (count > 0) {
      void* p = nullptr;
      FLASHCP_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc ",
                                   count * sizeof(T), " bytes");
      buffer.ptr_ = static_cast<T*>(p);
      buffer.count_ = count;
    }
    return buffer;
  }

  // Grows to at least `count` elements, dropping the contents when it grows.
  absl::Status Reserve(size_t count) {
    if (count <= count_) return absl::OkStatus();
    Reset();
    auto grown = Allocate(count);
    if (!grown.ok()) return grown.status();
    *this = *std::move(grown);
    return absl::OkStatus();
  }

  T* data() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  void Reset() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = nullptr;
    count_ = 0;
  }
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

class CudaStream {
 public:
  CudaStream() = default;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept {
    if (this != &o) {
      Reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~CudaStream() { Reset(); }
  // Non-blocking: never synchronizes with the legacy default stream.
  static absl::StatusOr<CudaStream> Create() {
    CudaStream s;
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags");
    return s;
  }
  cudaStream_t get() const { return s_; }

 private:
  void Reset() {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    if (this != &o) {
      Reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ~CudaEvent() { Reset(); }
  // `timing` false gives a cheaper event for ordering streams only.
  static absl::StatusOr<CudaEvent> Create(bool timing) {
    CudaEvent e;
    FLASHCP_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&e.e_, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
    return e;
  }
  cudaEvent_t get() const { return e_; }

 private:
  void Reset() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

// Milliseconds between two recorded timing events (waits for `end`).
inline absl::StatusOr<float> ElapsedMs(const CudaEvent& start, const CudaEvent& end) {
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end.get()), "cudaEventSynchronize");
  float ms = 0;
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), end.get()),
                               "cudaEventElapsedTime");
  return ms;
}

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_DEVICE_MEMORY_H_
