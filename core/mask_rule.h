// The block-diffusion rule per (query, key), with no dependency but
// <cstdint>, so host code (core/mask.h re-exports it) and CUDA device code
// (worker/cuda/masked_attention_kernels.cu) evaluate the same function; see
// core/mask.h for the table.
#ifndef FLASHCP_CORE_MASK_RULE_H_
#define FLASHCP_CORE_MASK_RULE_H_

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHCP_HOST_DEVICE __host__ __device__
#else
#define FLASHCP_HOST_DEVICE
#endif

namespace flashcp::core {

// Whether a query sees a key under block diffusion with block size b (>= 1),
// both of one document at positions q_pos and k_pos within it. The one
// statement of the rule every kernel (CPU and CUDA) evaluates per pair.
FLASHCP_HOST_DEVICE constexpr bool BlockDiffusionSees(int64_t b, bool q_noisy, int64_t q_pos,
                                                      bool k_noisy, int64_t k_pos) {
  const int64_t j = q_pos / b, k = k_pos / b;
  if (q_noisy) return k_noisy ? k == j : k < j;
  return !k_noisy && k <= j;
}

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_MASK_RULE_H_
