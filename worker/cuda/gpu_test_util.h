// GPU tests skip, with the reason, where no device is usable (CI compiles
// them but has no GPU). Label such tests "gpu" in CMake.
#ifndef FLASHCP_WORKER_CUDA_GPU_TEST_UTIL_H_
#define FLASHCP_WORKER_CUDA_GPU_TEST_UTIL_H_

#include <string>

#include "gtest/gtest.h"
#include "worker/cuda/cuda_status.h"

#define FLASHCP_SKIP_WITHOUT_GPU()                                                          \
  do {                                                                                      \
    if (const absl::Status flashcp_gpu_ = ::flashcp::worker::cuda::CudaDeviceAvailable();   \
        !flashcp_gpu_.ok())                                                                 \
      GTEST_SKIP() << "needs a CUDA device: " << std::string(flashcp_gpu_.message());       \
  } while (false)

#endif  // FLASHCP_WORKER_CUDA_GPU_TEST_UTIL_H_
