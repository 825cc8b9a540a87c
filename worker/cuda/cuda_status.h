// CUDA, NCCL and cuDNN-frontend results turned into absl::Status with context
// (the operation, the peer, the bytes). The one place in the project that
// knows these libraries' error types; every call in worker/cuda goes through
// one of these helpers.
#ifndef FLASHCP_WORKER_CUDA_CUDA_STATUS_H_
#define FLASHCP_WORKER_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace flashcp::worker::cuda {

// OK for cudaSuccess; otherwise a Status whose code says what kind of failure
// it is (ResourceExhausted for allocation, FailedPrecondition for a missing or
// unusable device, Internal otherwise) and whose message names `context` and
// CUDA's own error name and string.
absl::Status CudaStatus(cudaError_t err, absl::string_view context);

// Checks the launch configuration of the kernel launched last on this thread
// (cudaGetLastError); the kernel's own faults show at the next synchronizing
// call, which is checked there.
absl::Status CudaLaunchStatus(absl::string_view kernel);

// OK when at least one CUDA device is usable; FailedPrecondition naming why
// not (no driver, no device). GPU tests skip on it.
absl::Status CudaDeviceAvailable();

}  // namespace flashcp::worker::cuda

// FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...), "copy K to rank ", r);
// The context arguments are only formatted on failure.
#define FLASHCP_CUDA_RETURN_IF_ERROR(expr, ...)                                   \
  do {                                                                            \
    if (const cudaError_t flashcp_cuda_err_ = (expr);                             \
        flashcp_cuda_err_ != cudaSuccess)                                         \
      return ::flashcp::worker::cuda::CudaStatus(flashcp_cuda_err_,               \
                                                 ::absl::StrCat(__VA_ARGS__));    \
  } while (false)

#endif  // FLASHCP_WORKER_CUDA_CUDA_STATUS_H_
