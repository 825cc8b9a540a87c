// Launch shape of the grid-stride kernels (comm_kernels.cu, a2a_kernels.cu):
// each loops over its elements with the grid's stride, so a capped grid
// covers any count.
#ifndef FLASHCP_WORKER_CUDA_GRID_STRIDE_H_
#define FLASHCP_WORKER_CUDA_GRID_STRIDE_H_

#include <cstdint>

namespace flashcp::worker::cuda::grid_stride {

inline constexpr int kThreads = 256;

// Blocks for `count` elements: one per kThreads, at most 65536 * 4.
inline unsigned Blocks(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 * 4 ? b : 65536 * 4);
}

}  // namespace flashcp::worker::cuda::grid_stride

#endif  // FLASHCP_WORKER_CUDA_GRID_STRIDE_H_
