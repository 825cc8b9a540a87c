// The attention mask as part of the model, in one place: its names, its
// validity rules, the workload a shard costs under it and the K/V each rank
// needs under it (SPEC "Beyond the causal document mask"; docs/bdlm.md).
// Analysis (core/analysis.h), the planners and the tests call these; nothing
// else restates the block-diffusion rules.
//
// Block diffusion (block size b), within one document only:
//   | query \ key          | noisy key, block k | clean key, block k |
//   | noisy query, block j | iff k == j         | iff k < j          |
//   | clean query, block j | never              | iff k <= j         |
// with block(pos) = pos / b over the token's position in its document.
#ifndef FLASHCP_CORE_MASK_H_
#define FLASHCP_CORE_MASK_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/mask_rule.h"
#include "core/types.h"

namespace flashcp::core {

// The wire and command-line spelling: "causal_document", "block_diffusion".
absl::string_view MaskKindName(MaskKind kind);
// "" and "causal_document": kCausalDocument; "block_diffusion". Otherwise
// InvalidArgument "attention_mask: unknown ...".
absl::StatusOr<MaskKind> ParseMaskKind(absl::string_view name);

// Largest block size accepted (a block longer than any batch is pointless,
// not wrong: kMaxTokens).
inline constexpr int64_t kMaxBlockSize = kMaxTokens;

// InvalidArgument naming the field: "block_size" must be in [1, 2^40] under
// block diffusion and 0 (unset) under the causal document mask (a block size
// there would be silently ignored).
absl::Status ValidateAttentionMask(const AttentionMask& mask);

inline bool IsBlockDiffusion(const AttentionMask& mask) {
  return mask.kind == MaskKind::kBlockDiffusion;
}

// The batch a plan under `mask` covers: `batch` itself under the causal
// mask; under block diffusion the 2C-token [noisy ; clean] sequence as 2n
// documents (types.h, Plan).
Batch PlanBatch(const Batch& batch, const AttentionMask& mask);

// Under block diffusion: whether plan document `doc` is a noisy copy
// (doc < n, n = doc_lens.size() / 2) and the batch document it copies.
inline bool IsNoisyDoc(const Plan& plan, int32_t doc) {
  return 2 * static_cast<size_t>(doc) < plan.doc_lens.size();
}
inline int32_t SourceDoc(const Plan& plan, int32_t doc) {
  const int32_t n = static_cast<int32_t>(plan.doc_lens.size() / 2);
  return doc < n ? doc : doc - n;
}

// (query, key) pairs of queries [start, start + len) of a document of
// `doc_len` tokens under block diffusion with block size b (>= 1), exact
// while below 2^53:
//  - noisy: a query of block j sees its own block (min(b, L - jb) keys) and
//    the clean keys [0, jb): a full noisy block j costs b*b + b*j*b;
//  - clean: a query of block j sees the clean keys [0, min((j+1)b, L)): a
//    full clean block j costs b*(j+1)*b, a partial last block of r tokens r*L.
double NoisyRangeWorkload(int64_t doc_len, int64_t b, int64_t start, int64_t len);
double CleanRangeWorkload(int64_t doc_len, int64_t b, int64_t start, int64_t len);
// Both copies of a whole document: L (L + b) when b divides L.
double BlockDiffusionDocWorkload(int64_t doc_len, int64_t b);

// The workload of shard `s` of `plan` under plan.mask: ShardWorkload (SPEC
// Eq. 3) under the causal mask, the ranges above under block diffusion. The
// one workload function of the project; the plan must be valid.
double MaskedShardWorkload(const Plan& plan, const Shard& s);

// A token range [begin, end) of plan document `doc`.
struct DocRange {
  int32_t doc = 0;
  int64_t begin = 0;
  int64_t end = 0;
  friend bool operator==(const DocRange&, const DocRange&) = default;
};

// The K/V shard `s`'s queries attend to under plan.mask, as ranges of plan
// documents (its own tokens included):
//  - causal: [0, end) of its document;
//  - block diffusion, noisy shard [a, e) of document d: the noisy blocks it
//    touches, [floor(a/b) b, min(ceil(e/b) b, L)), and the clean prefix of
//    its last block j = (e-1)/b, [0, j b) of the clean copy (none for j = 0);
//  - block diffusion, clean shard [a, e): [0, min(ceil(e/b) b, L)) of its
//    clean copy (block-causal: a cut clean block needs its later tokens too).
void AppendNeededKv(const Plan& plan, const Shard& s, std::vector<DocRange>& out);

// BlockDiffusionSees(b, q_noisy, q_pos, k_noisy, k_pos), the per-pair rule
// the kernels evaluate: core/mask_rule.h (usable from CUDA device code).

// Calls f(dest, shard, begin, end) for every part [begin, end) (document
// positions) of a shard owned by a rank other than `dest` that dest's
// queries attend to (AppendNeededKv over its shards, merged): each needed
// remote token exactly once per dest; dest ascending, then document and
// position ascending. The plan must be valid.
void ForEachNeededRemote(const Plan& plan,
                         const std::function<void(int32_t dest, int32_t shard, int64_t begin,
                                                  int64_t end)>& f);

// The K/V exchange under plan.mask, one phase (forward; backward returns the
// gradients the same way): every rank receives, once, each remote token some
// query of it attends to (AppendNeededKv over its shards, merged), and each
// owner sends each such token to every rank needing it. Under block
// diffusion tokens of noisy plan documents are noisy K/V, the rest clean.
struct MaskTraffic {
  std::vector<int64_t> sent_tokens, received_tokens;              // per rank
  std::vector<int64_t> clean_sent_tokens, clean_received_tokens;  // per rank, clean copies
  // Per rank: its tokens that at least one other rank needs (the compacted
  // all-gather buffer; under the causal mask its non-last shards' tokens).
  std::vector<int64_t> needed_elsewhere_tokens, clean_needed_elsewhere_tokens;
  std::vector<int64_t> pair_tokens;  // [src * N + dest], sent src -> dest
  // Per shard (index into Plan::shards): the ranks some of its K/V goes to,
  // ascending; empty where it stays.
  std::vector<std::vector<int32_t>> shard_dests;
};
// The plan must be valid (ValidatePlan; not checked). O(needed ranges x
// log pieces + overlapping pieces), N^2 memory.
MaskTraffic ComputeMaskTraffic(const Plan& plan);

// The mask's validity rules for a plan (ValidatePlan calls it after the
// general ones): the mask itself (ValidateAttentionMask) and, under block
// diffusion, an even number of plan documents whose two halves have equal
// lengths; InvalidArgument naming the field ("block_size", "doc_lens").
absl::Status ValidatePlanMask(const Plan& plan);

// Under block diffusion: the noisy blocks split between ranks (a shard of a
// noisy copy starting inside a block); 0 under the causal mask. The plan
// must be valid.
int64_t CutNoisyBlocks(const Plan& plan);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_MASK_H_
