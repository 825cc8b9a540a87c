#include "worker/cuda/cuda_status.h"

namespace flashcp::worker::cuda {

absl::Status CudaStatus(cudaError_t err, absl::string_view context) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(context, ": CUDA error ", cudaGetErrorName(err), " (",
                                           cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaLaunchStatus(absl::string_view kernel) {
  return CudaStatus(cudaGetLastError(), absl::StrCat("launch ", kernel));
}

absl::Status CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return absl::FailedPreconditionError(absl::StrCat("no usable CUDA device: cudaGetDeviceCount: ",
                                                      cudaGetErrorName(err), " (",
                                                      cudaGetErrorString(err), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device: cudaGetDeviceCount = 0");
  return absl::OkStatus();
}

}  // namespace flashcp::worker::cuda
