// Plan analysis: the one implementation of SPEC.md's counting that every part
// of the project (planner, service, workers, tests, benchmarks) uses.
#ifndef FLASHCP_CORE_ANALYSIS_H_
#define FLASHCP_CORE_ANALYSIS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/types.h"

namespace flashcp::core {

// How K and V travel between ranks (SPEC "Sharding-aware communication").
enum class CommScheme {
  kFullKv = 0,     // all-gather of every rank's full KV (Llama3 CP, Per-Doc CP; Eq. 4)
  kAllGather = 1,  // all-gather of compacted non-last-shard KV, padded to the largest (Eq. 5)
  kTargeted = 2,   // each non-last shard's KV sent only to the ranks whose shards need it
  // Ulysses (SPEC "All-to-all scheme"; core/rank_groups.h): within each rank
  // group, an all-to-all gives every rank all the group's tokens of its share
  // of the heads, and a second returns the output. Moves Q, K, V and O, not
  // KV rows.
  kAllToAll = 3,
};
inline constexpr int kNumCommSchemes = 4;
inline constexpr std::array<CommScheme, kNumCommSchemes> kAllCommSchemes = {
    CommScheme::kFullKv, CommScheme::kAllGather, CommScheme::kTargeted, CommScheme::kAllToAll};
// The schemes that exchange K/V rows between ranks (all but all_to_all, which
// moves heads of Q, K, V and O: core/rank_groups.h).
inline constexpr int kNumKvCommSchemes = 3;
inline constexpr std::array<CommScheme, kNumKvCommSchemes> kKvCommSchemes = {
    CommScheme::kFullKv, CommScheme::kAllGather, CommScheme::kTargeted};

// "full_kv", "allgather", "targeted", "all_to_all"
absl::string_view CommSchemeName(CommScheme scheme);
absl::StatusOr<CommScheme> ParseCommScheme(absl::string_view name);

// The attention shape that turns tokens into bytes.
struct ModelShape {
  int32_t heads = 32;       // H, KV heads
  int32_t head_dim = 128;   // D
  int32_t dtype_bytes = 2;  // bytes per element (2 for bf16)
  int32_t query_heads = 0;  // Hq; 0: equal to heads
};
// Hq: query_heads, or heads where it is 0.
inline int32_t QueryHeads(const ModelShape& shape) {
  return shape.query_heads == 0 ? shape.heads : shape.query_heads;
}
// InvalidArgument naming the field unless 1 <= heads, head_dim <= 1024,
// dtype_bytes is 1, 2 or 4, and query_heads is 0 or a multiple of heads
// (GQA: query head h reads KV head h / (Hq / heads)) at most 1024.
absl::Status ValidateModelShape(const ModelShape& shape);

// Checks every Plan invariant (types.h) and the plan's batch; the Status names
// the first violation precisely (shard index, document, rank, token counts).
absl::Status ValidatePlan(const Plan& plan);

// Attention workload of a shard (SPEC Eq. 3): (2p + s + 1) * s / 2 (query, key)
// pairs. Exact as a double while the value is below 2^53. The project's one
// implementation of SPEC's workload: every planner, metric and engine calls
// it (or PrefixWorkload, its continuous form). Inline: the planners call it
// per piece in their inner loops.
inline double ShardWorkload(int64_t prefix, int64_t len) {
  // (2p + s + 1) * s is always even, so halving first keeps the intermediate small.
  const double a = 2.0 * static_cast<double>(prefix) + static_cast<double>(len) + 1.0;
  const double s = static_cast<double>(len);
  return (len % 2 == 0) ? a * (s / 2.0) : (a / 2.0) * s;
}

// SPEC Eq. 3 at a real-valued position: Q(x) = x (x + 1) / 2 pairs for a
// document's first x tokens, so tokens [a, e) have Q(e) - Q(a), which is
// ShardWorkload(a, e - a) at integer a and e. For programs over continuous
// cut points (recut.h); at integers use ShardWorkload (exact, no
// cancellation).
inline double PrefixWorkload(double x) { return x * (x + 1.0) * 0.5; }

// One entry of a rank's compacted send buffer: a non-last shard of this rank
// (under block diffusion: a part of a shard some other rank needs).
struct SendRange {
  int32_t shard = 0;   // index into Plan::shards
  int64_t offset = 0;  // first token's offset in the compacted buffer
  int64_t len = 0;     // tokens
  int64_t skip = 0;    // tokens of the shard before the range (0 under the causal mask)
};

// One shard of a document, as the exchange sees it.
struct DocPiece {
  int32_t shard = 0;       // index into Plan::shards
  int32_t rank = 0;        // owner
  int32_t send_index = -1; // index into the owner's RankLayout::send; -1 for the last shard
                           // (and under block diffusion, where a shard may have several)
};

// The ranks that need some of this rank's compacted ranges under kTargeted.
struct TargetedSend {
  int32_t dest = 0;                   // receiving rank, != the sender
  std::vector<int32_t> send_indices;  // into the sender's RankLayout::send, ascending
  int64_t tokens = 0;                 // sum of their lengths
};

struct RankLayout {
  std::vector<int32_t> shards;        // indices into Plan::shards, in token order
  std::vector<int64_t> shard_offset;  // each local shard's first token in local memory
  std::vector<int32_t> doc_pos;       // each local shard's position in CommLayout::docs[doc]
  std::vector<SendRange> send;        // compacted buffer: non-last shards, in token order
  int64_t send_tokens = 0;            // sum of `send` lengths (SPEC: non-last tokens)
  std::vector<TargetedSend> targeted; // by dest ascending; empty entries omitted
};

// Which KV each rank sends, and where each shard's prefix comes from: the
// prefix [0, start) of the shard at position k of a document is exactly the
// document's pieces 0..k-1, each a whole send range of its owner.
struct CommLayout {
  std::vector<std::vector<DocPiece>> docs;  // per document, its shards in document order
  std::vector<RankLayout> ranks;            // per rank
};

// Builds the layout; the plan must be valid (ValidatePlan), else InvalidArgument.
// Under block diffusion (core/mask.h, BuildMaskCommLayout) a send range is a
// part of a shard and a rank receives exactly the remote K/V its queries
// attend to (ComputeMaskTraffic).
absl::StatusOr<CommLayout> BuildCommLayout(const Plan& plan);

// What one phase moves under one scheme (SPEC "Targeted exchange, per
// phase"): forward sends K and V; backward returns dK and dV the same way,
// so both phases move the same tokens. Tokens count each token once per
// receiving rank; bytes = tokens * 2 * H * D * dtype (K and V, or dK and dV).
// kAllToAll counts (token, head) rows of Q, K, V and O instead (forward: Q, K,
// V in and O out; backward: dO in, dQ, dK, dV out, what forward received):
// bytes = tokens * D * dtype (core/rank_groups.h).
//  - kFullKv:    every rank sends and receives (C/N) * (N-1) tokens;
//  - kAllGather: every rank sends and receives max_j nonlast_j * (N-1) tokens;
//  - kTargeted:  rank r receives, per document, the remote tokens of the prefix
//                its furthest shard attends to, each once; it sends each of its
//                tokens once to every other rank whose furthest shard of that
//                document starts after it.
struct PhaseTraffic {
  std::vector<int64_t> sent_tokens;      // per rank
  std::vector<int64_t> received_tokens;  // per rank
  int64_t max_sent_tokens = 0;
  int64_t max_received_tokens = 0;
  int64_t bottleneck_tokens = 0;         // max over ranks of max(sent, received)
  int64_t max_sent_bytes = 0;
  int64_t max_received_bytes = 0;
  int64_t bottleneck_bytes = 0;
  // Bytes sent in the phase, summed over ranks, between ranks on one node and
  // on different nodes (AnalyzePlan's ranks_per_node; 0: all inter-node 0).
  int64_t intra_node_bytes = 0;
  int64_t inter_node_bytes = 0;
  // Per rank, one phase: of its sent and received bytes, those to and from
  // ranks on other nodes (its NIC); the rest stay on its node (NVLink).
  std::vector<int64_t> inter_node_sent_bytes;
  std::vector<int64_t> inter_node_received_bytes;
  // The busiest link of one phase: max over ranks of max(sent, received)
  // within the rank's node, and across nodes.
  int64_t max_intra_node_bytes = 0;
  int64_t max_inter_node_bytes = 0;
  // Block diffusion only (empty, 0 under the causal mask): of the tokens
  // received, per rank, those of clean and of noisy K/V (core/mask.h); they
  // sum to received_tokens less an all-gather's padding to the largest
  // buffer; their maxima over ranks in bytes.
  std::vector<int64_t> clean_received_tokens;
  std::vector<int64_t> noisy_received_tokens;
  int64_t max_clean_received_bytes = 0;
  int64_t max_noisy_received_bytes = 0;
};

// Bytes one rank moves per transformer layer, forward plus backward, under one
// scheme: logical payload bytes, what the rank's collectives carry for it,
// independent of the collective's algorithm. sent_r = 2*H*D*dtype * (tokens r
// sends forward + tokens whose gradients r returns backward), received
// symmetrically (Eq. 4 and Eq. 5 for the all-gathers).
struct SchemeBytes {
  std::vector<int64_t> sent;      // per rank
  std::vector<int64_t> received;  // per rank
  // Both phases' bottlenecks: 2 * phase.bottleneck_bytes. Not max(sent,
  // received), which adds a rank's forward receives to its backward sends and
  // so hides a phase's busiest direction.
  int64_t bottleneck = 0;
  PhaseTraffic phase;             // one phase
};

struct PlanMetrics {
  int64_t tokens_per_rank = 0;  // C/N, padding included
  int64_t padding = 0;
  std::vector<int64_t> rank_tokens;     // real tokens per rank
  std::vector<double> rank_workload;    // Eq. 3 summed per rank
  double imbalance = 1.0;               // max / mean workload
  std::vector<int64_t> rank_nonlast_tokens;
  int64_t max_nonlast_tokens = 0;
  double comm_saving = 0.0;             // 1 - max nonlast / (C/N): allgather vs full_kv
  double targeted_saving = 0.0;         // 1 - targeted / full_kv phase bottleneck
  std::array<SchemeBytes, kNumCommSchemes> bytes;  // indexed by CommScheme
  std::vector<int32_t> rank_segments;   // attention segments (shards) per rank
  int64_t cut_docs = 0;                 // documents split into more than one shard
  int64_t min_cut_shard_len = 0;        // shortest shard of a cut document; 0 if none
  // The sharding-aware exchange that moves less in one phase (its
  // phase.bottleneck_tokens; the all-gather on a tie, one collective):
  // kAllGather or kTargeted, never kFullKv (it never moves less than kAllGather).
  CommScheme cheaper_scheme = CommScheme::kAllGather;
  // bytes[kAllToAll] is the all-to-all within each of the plan's rank groups
  // (PlanRankGroups, core/rank_groups.h). Where a group's size does not
  // divide Hq it cannot run: this says which, and bytes[kAllToAll] is all 0.
  // Empty where the scheme applies.
  std::string all_to_all_inapplicable;
  // KV heads the all-to-all sends to more than one rank of a group, summed
  // over groups: the copies beyond the first (AllToAllHeads; 0 where every
  // group's size divides heads or the scheme does not apply).
  int64_t all_to_all_replicated_kv_heads = 0;
  // The plan's mask (Plan::mask). Under block diffusion the counts above are
  // over the 2C-token [noisy ; clean] sequence, the workload is the mask's
  // (MaskedShardWorkload), rank_nonlast_tokens are the tokens some other
  // rank needs (the compacted buffer), the targeted scheme sends exactly the
  // needed K/V (ComputeMaskTraffic) and cut_docs counts plan documents
  // (noisy and clean copies apart).
  AttentionMask mask;
  std::vector<int64_t> rank_noisy_tokens;  // block diffusion: noisy tokens per rank
  int64_t cut_noisy_blocks = 0;            // block diffusion: noisy blocks split between ranks
};

// PlanMetrics' bytes[kTargeted].phase.bottleneck_tokens without the rest, for
// planners scoring their candidates: the plan must be valid (ValidatePlan;
// not checked). O(shards log shards).
int64_t TargetedPhaseBottleneck(const Plan& plan);

// One phase of the targeted exchange between each pair of ranks: tokens
// rank a sends rank b at [a * N + b] (0 on the diagonal), the sends
// PlanMetrics' targeted bytes sum (row a sums to phase.sent_tokens[a]; the
// cells between nodes to inter_node_bytes / (2 H D dtype)) and
// BuildCommLayout's TargetedSend::tokens. The plan must be valid
// (ValidatePlan; not checked). O(shards log shards + the pieces of each
// document x the ranks it spans), N^2 memory.
std::vector<int64_t> TargetedPairTokens(const Plan& plan);

// A lower bound on the targeted exchange's phase bottleneck (SPEC "Targeted
// exchange, per phase", tokens) of every plan of `batch` whose ranks each
// keep at most `max_workload` pairs: the rank holding a document's last
// token receives every token of the document it does not hold, and it holds
// at most a of them, where a <= min(L, ceil(total / N)) and the cheapest a
// tokens with the last one, W(0, a - 1) + L pairs, plus its other
// floor(total / N) - a tokens at one pair each, fit max_workload. The
// maximum over documents of L - a. Where even a = 1 does not fit, L - 1 (no
// plan meets the bound). Send sides and documents sharing a rank are not
// counted, so real plans can need more; the bound is what no plan beats.
int64_t TargetedPhaseLowerBound(const Batch& batch, double max_workload);

// InvalidArgument naming the field unless 0 <= ranks_per_node <= kMaxCpSize.
// Rank r is on node r / ranks_per_node (the last node may be smaller); 0: all
// ranks on one node.
absl::Status ValidateRanksPerNode(int32_t ranks_per_node);

// Validates the plan, the shape and ranks_per_node, then computes every
// metric. OutOfRange if a byte count overflows int64.
absl::StatusOr<PlanMetrics> AnalyzePlan(const Plan& plan, const ModelShape& shape,
                                        int32_t ranks_per_node = 0);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_ANALYSIS_H_
