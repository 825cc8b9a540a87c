// The block-diffusion oracle (core/mask.h; docs/bdlm.md): attention over one
// BDLM step's 2C rows, written plainly (per query an explicit list of the
// keys the mask lets it see, explicit softmax), O(n^2), single-threaded,
// accumulating in double, as attention_reference.h does for the causal mask.
// Rows [0, C) are the noisy copies of the packed documents `doc_lens`, rows
// [C, 2C) their clean copies in the same order; layout as attention_cpu.h
// ([rows][heads][head_dim] fp32, lse [rows][heads], natural log).
#ifndef FLASHCP_WORKER_MASK_REFERENCE_H_
#define FLASHCP_WORKER_MASK_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/attention_cpu.h"

namespace flashcp::worker {

// The rows query row `row` of the 2C-row step sees under block diffusion
// with block size b, ascending: a noisy row of block j, its document's noisy
// rows of block j and clean rows of blocks < j; a clean row of block j, its
// document's clean rows of blocks <= j. `row` in [0, 2C).
std::vector<int64_t> BlockDiffusionKeys(absl::Span<const int64_t> doc_lens, int64_t block_size,
                                        int64_t row);

// Forward over the 2C rows: writes o and lse. Every token array holds
// 2 * sum(doc_lens) rows. InvalidArgument naming the field for a size that
// does not match, a length below 1 or block_size below 1.
absl::Status BlockDiffusionReferenceForward(const AttentionShape& shape,
                                            absl::Span<const int64_t> doc_lens,
                                            int64_t block_size, absl::Span<const float> q,
                                            absl::Span<const float> k, absl::Span<const float> v,
                                            absl::Span<float> o, absl::Span<float> lse);

// Backward: given dout, writes dq, dk, dv (the softmax recomputed; dS_j =
// P_j (dP_j - D), D = sum_i P_i dP_i).
absl::Status BlockDiffusionReferenceBackward(
    const AttentionShape& shape, absl::Span<const int64_t> doc_lens, int64_t block_size,
    absl::Span<const float> q, absl::Span<const float> k, absl::Span<const float> v,
    absl::Span<const float> dout, absl::Span<float> dq, absl::Span<float> dk,
    absl::Span<float> dv);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_MASK_REFERENCE_H_
