// The oracle: document-masked causal attention over one whole packed batch,
// written plainly (per document, head and query: explicit scores, explicit
// softmax), O(n^2), single-threaded, accumulating in double. Layout as in
// attention_cpu.h: [tokens][heads][head_dim] fp32, lse [tokens][heads] in
// natural log. Token t of document d sees the tokens of d at or before it.
#ifndef FLASHCP_WORKER_ATTENTION_REFERENCE_H_
#define FLASHCP_WORKER_ATTENTION_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/attention_cpu.h"

namespace flashcp::worker {

// Forward over the batch packed as `doc_lens`: writes o and lse. Every array
// holds sum(doc_lens) rows; InvalidArgument if a size does not match or a
// length is below 1.
absl::Status ReferenceForward(const AttentionShape& shape, absl::Span<const int64_t> doc_lens,
                              absl::Span<const float> q, absl::Span<const float> k,
                              absl::Span<const float> v, absl::Span<float> o,
                              absl::Span<float> lse);

// Backward: given dout, writes dq, dk, dv (each recomputes the softmax).
// dS_j = P_j (dP_j - D) with D = sum_i P_i dP_i, which equals dout . o for
// the exact output o. With `o_stored` (the forward's output as a kernel
// stores it, e.g. rounded to bf16; the same size as q), D = dout . o_stored
// instead, as every kernel computes it: where dP_j - D cancels (one query
// over a few keys) the storage rounding of O alone moves dS by more than
// bf16 tolerances, and the reference should not charge a kernel for it.
absl::Status ReferenceBackward(const AttentionShape& shape, absl::Span<const int64_t> doc_lens,
                               absl::Span<const float> q, absl::Span<const float> k,
                               absl::Span<const float> v, absl::Span<const float> dout,
                               absl::Span<float> dq, absl::Span<float> dk, absl::Span<float> dv,
                               absl::Span<const float> o_stored = {});

// The error measure every test and flashcp-cpstep report: the largest
// absolute difference relative to the largest reference magnitude, floored,
//   max_i |got_i - want_i| / max(max_i |want_i|, kRelErrFloor).
// The floor keeps outputs that are mathematically zero (dq and dk of
// one-token documents: P = 1, so dS = dP - delta = 0) judged by absolute
// error at the inputs' scale (|x| < 1) instead of by rounding noise over 0.
// Sizes must match (else returns +infinity); a NaN gives +infinity.
inline constexpr double kRelErrFloor = 1e-2;
double MaxRelError(absl::Span<const float> got, absl::Span<const float> want);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_ATTENTION_REFERENCE_H_
