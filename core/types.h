// The FlashCP model's plain types: a batch, a shard, a plan (SPEC.md, "Batch,
// shard, rank"). Pure data; validation lives in ValidateBatch / ValidatePlan.
#ifndef FLASHCP_CORE_TYPES_H_
#define FLASHCP_CORE_TYPES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace flashcp::core {

// One packed training sequence split across a CP group.
struct Batch {
  std::vector<int64_t> doc_lens;  // tokens per document, each >= 1, in packing order
  int32_t cp_size = 1;            // N, ranks in the CP group
};

// The attention mask a step trains with (SPEC "Beyond the causal document
// mask"; the functions of it are in core/mask.h).
enum class MaskKind {
  kCausalDocument = 0,  // a token sees earlier tokens of its own document (SPEC Eq. 3)
  kBlockDiffusion = 1,  // BDLM: the 2C-token [noisy ; clean] sequence, blocks of block_size
};

struct AttentionMask {
  MaskKind kind = MaskKind::kCausalDocument;
  int64_t block_size = 0;  // b, tokens per block; >= 1 under kBlockDiffusion, 0 otherwise

  friend bool operator==(const AttentionMask&, const AttentionMask&) = default;
};

// A contiguous token range [start, start + len) of document `doc`, held by
// `rank`. Its attention prefix is p = start (SPEC Eq. 3).
struct Shard {
  int32_t doc = 0;
  int64_t start = 0;
  int64_t len = 0;
  int32_t rank = 0;

  friend bool operator==(const Shard&, const Shard&) = default;
};

// A sharding plan. Invariants (checked by ValidatePlan):
//  - shards are listed by rank ascending and, within a rank, in that rank's
//    token order (the order its tokens are laid out in memory);
//  - the shards of each document tile [0, doc_len) exactly once;
//  - no two shards of one document that touch ([a,b) and [b,c)) sit on the
//    same rank (they would be one shard);
//  - rank r holds exactly RankRealTokens(total, N, r) real tokens, and
//    `padding` = N * TokensPerRank(total, N) - total masked padding tokens,
//    one on each of the last `padding` ranks.
// Under the block-diffusion mask the plan covers the 2C-token sequence
// [noisy ; clean] of a batch of n documents as 2n plan documents: plan
// document d < n is the noisy copy of batch document d, plan document n + d
// its clean copy (doc_lens[d] == doc_lens[n + d]); every rule above then
// holds over the 2C tokens (each rank 2C/N, padding as for 2C tokens).
struct Plan {
  int32_t cp_size = 1;
  std::vector<int64_t> doc_lens;
  int64_t padding = 0;  // masked padding tokens, 0 <= padding < cp_size
  std::vector<Shard> shards;
  AttentionMask mask;   // the causal document mask unless set
};

// Absolute bounds: a batch above these is malformed, not merely large.
inline constexpr int64_t kMaxDocs = 1'000'000;
inline constexpr int64_t kMaxTokens = int64_t{1} << 40;
inline constexpr int32_t kMaxCpSize = 65'536;

// Operator-set bounds on untrusted input (a service's flags), at most the
// absolute ones; every allocation sized by a batch is bounded by these.
struct BatchLimits {
  int64_t max_docs = kMaxDocs;
  int64_t max_tokens = kMaxTokens;
  int32_t max_cp_size = kMaxCpSize;
};

// Total real tokens; the caller guarantees no overflow (ValidateBatch does).
int64_t TotalTokens(const std::vector<int64_t>& doc_lens);

// C/N: tokens every rank holds, padding included: ceil(total / n).
inline int64_t TokensPerRank(int64_t total, int32_t n) { return (total + n - 1) / n; }

// Padding tokens the batch needs so that N divides it: N * ceil(total/N) - total.
inline int64_t PaddingTokens(int64_t total, int32_t n) {
  return TokensPerRank(total, n) * n - total;
}

// Real (non-padding) tokens rank r holds: the canonical layout puts one
// padding token on each of the last PaddingTokens() ranks.
inline int64_t RankRealTokens(int64_t total, int32_t n, int32_t r) {
  const int64_t pad = PaddingTokens(total, n);
  return TokensPerRank(total, n) - (r >= n - pad ? 1 : 0);
}

// InvalidArgument naming the field for: no documents, a length < 1, cp_size < 1
// or above the token count, and sizes above the absolute bounds (which also
// rules out overflowing totals); ResourceExhausted where the batch is within
// the absolute bounds but above the operator's `limits`.
absl::Status ValidateBatch(const Batch& batch, const BatchLimits& limits = {});

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_TYPES_H_
