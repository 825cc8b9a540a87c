// Document-masked causal attention on the CPU, forward and backward:
// flash-attention style (blocked, online softmax, fp32 accumulation, the
// probabilities recomputed from the log-sum-exp in backward). The oracle is
// attention_reference.h; attention_cpu_test.cc states the tolerances.
//
// Layout: every token array is [rows][heads][head_dim] fp32, row-major, so a
// (row, head) vector of head_dim floats is contiguous (stride heads*head_dim
// between rows of one head). Log-sum-exps are [rows][heads], natural log.
//
// A document as one rank sees it (DocAttention): the K and V of its positions
// [0, kv_len) in one buffer, and some of its queries, in ranges of rows of the
// rank's query-side arrays. Query at document position t sees keys 0..t (the
// bottom-right causal mask: a shard of length s with prefix p = pos has query
// i see keys 0..p+i). The softmax scale is `scale` (1/sqrt(head_dim) in the
// engine).
#ifndef FLASHCP_WORKER_ATTENTION_CPU_H_
#define FLASHCP_WORKER_ATTENTION_CPU_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/thread_pool.h"

namespace flashcp::worker {

struct AttentionShape {
  int32_t heads = 1;     // H
  int32_t head_dim = 1;  // D
  float scale = 1.0f;    // softmax scale, applied to q.k
};

// Rows [row, row + len) of the query-side arrays (q, o, lse, dout, dq) hold
// the queries at document positions [pos, pos + len).
struct QueryRange {
  int64_t row = 0;
  int64_t pos = 0;
  int64_t len = 0;
};

struct DocAttention {
  const float* k = nullptr;  // [kv_len][H][D]: document positions [0, kv_len)
  const float* v = nullptr;  // [kv_len][H][D]
  int64_t kv_len = 0;
  std::vector<QueryRange> queries;  // disjoint, each pos + len <= kv_len
  float* dk = nullptr;  // backward output [kv_len][H][D], overwritten
  float* dv = nullptr;  // backward output [kv_len][H][D], overwritten
};

// InvalidArgument naming the field for a bad shape, a null pointer, a query
// range outside [0, kv_len) or outside [0, q_rows), or (backward) missing
// dk/dv. Rows of the query-side arrays that no document names are untouched.
absl::Status ValidateDocs(const AttentionShape& shape, absl::Span<const DocAttention> docs,
                          int64_t q_rows, bool backward);

// o[row] = softmax(scale * q[row] . K^T) V over the keys the row sees;
// lse[row][h] = log(sum_j exp(scale * q . k_j)). q, o: [q_rows][H][D];
// lse: [q_rows][H]. Parallel over (document, query block, head).
absl::Status AttentionForwardCpu(const AttentionShape& shape, absl::Span<const DocAttention> docs,
                                 int64_t q_rows, const float* q, float* o, float* lse,
                                 ThreadPool& pool);

// Given dout = dL/do, writes dq (overwritten on the named rows) and each
// document's dk, dv (overwritten on [0, kv_len); keys no query sees get 0).
// Two parallel passes, race-free and deterministic: dk, dv over (document,
// head, key block); dq over (document, query block, head).
absl::Status AttentionBackwardCpu(const AttentionShape& shape,
                                  absl::Span<const DocAttention> docs, int64_t q_rows,
                                  const float* q, const float* o, const float* lse,
                                  const float* dout, float* dq, ThreadPool& pool);

// Attention workload of the named queries: (query, key) pairs under the mask
// (SPEC Eq. 3 summed); FLOPs are 4 * H * D * this forward, 2.5x backward.
double AttentionPairs(absl::Span<const DocAttention> docs);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_ATTENTION_CPU_H_
