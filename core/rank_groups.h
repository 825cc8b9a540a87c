// Rank groups of a plan and the schemes that run within them: the
// all-to-all (Ulysses) scheme's heads and traffic, and the traffic of a plan
// whose groups each run their own scheme (a mixed plan).
//
// A plan's rank groups are the ranks linked by the documents they share:
// two ranks are in one group where some document has shards on both
// (connected components). No attention reads KV outside its group, so any
// scheme can run within each group alone. A rank holding only whole
// documents is a group of one and moves nothing.
#ifndef FLASHCP_CORE_RANK_GROUPS_H_
#define FLASHCP_CORE_RANK_GROUPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/types.h"

namespace flashcp::core {

// The plan's rank groups, each's ranks ascending, groups by first rank. The
// plan must be valid (ValidatePlan; not checked). O(shards + N).
std::vector<std::vector<int32_t>> PlanRankGroups(const Plan& plan);

// Heads [first, first + count).
struct HeadRange {
  int32_t first = 0;
  int32_t count = 0;
  friend bool operator==(const HeadRange&, const HeadRange&) = default;
};

// Which heads each position j of a group of K ranks computes under the
// all-to-all: query heads [j Hq/K, (j+1) Hq/K), and the KV heads those read
// (GQA: query head h reads KV head h / (Hq / Hkv)). Where K > Hkv, some
// positions read the same KV head and each receives it: the head is
// replicated, `replicated_kv_heads` copies beyond the first summed over
// heads (sum of kv counts - Hkv).
struct AllToAllHeads {
  std::vector<HeadRange> query;  // per position
  std::vector<HeadRange> kv;     // per position
  int64_t kv_total = 0;          // sum of kv counts: Hkv plus the replicas
  int64_t replicated_kv_heads = 0;
};
// FailedPrecondition naming query_heads unless K divides Hq (the scheme does
// not apply to such a group); InvalidArgument for a bad shape or K < 1.
absl::StatusOr<AllToAllHeads> AllToAllGroupHeads(int32_t group_size, const ModelShape& shape);

// One phase of the all-to-all within each of `groups` (disjoint ranks in
// [0, N); ranks in none move nothing), per rank, in (token, head) rows of D *
// dtype bytes. Rank r at position j of a group of K, holding t_r of the
// group's S tokens, sends t_r rows of every other position's query and KV
// heads and returns the O rows of its query heads for the others' S - t_r
// tokens; it receives symmetrically:
//   sent_r = t_r (K-1) Hq/K + 2 t_r (kv_total - kv_j) + (S - t_r) Hq/K
//   recv_r = (S - t_r) Hq/K + 2 (S - t_r) kv_j + t_r (K-1) Hq/K.
// With t = C/N and K | Hkv both are t (2 Hq + 2 Hkv) (K-1)/K (the issue's
// formula). inter_* count the rows to and from ranks on other nodes.
// `tokens`: real tokens per rank (padding never travels).
struct AllToAllPhase {
  std::vector<int64_t> sent, received;              // per rank, rows
  std::vector<int64_t> inter_sent, inter_received;  // per rank, rows
  int64_t replicated_kv_heads = 0;                  // summed over groups
};
// InvalidArgument for groups not disjoint or outside [0, N) (N =
// tokens.size()) or a bad shape or ranks_per_node; FailedPrecondition naming
// query_heads and the group where a group's size does not divide Hq.
absl::StatusOr<AllToAllPhase> AllToAllTraffic(const std::vector<int64_t>& tokens,
                                              const std::vector<std::vector<int32_t>>& groups,
                                              const ModelShape& shape, int32_t ranks_per_node);

// Bytes of one (token, head) row of the all-to-all: D * dtype.
inline int64_t AllToAllRowBytes(const ModelShape& shape) {
  return int64_t{shape.head_dim} * shape.dtype_bytes;
}

// One phase of the all-to-all within `plan`'s rank groups (PlanRankGroups):
// AllToAllTraffic over the plan's real tokens per rank. The one source of
// PlanMetrics' bytes[kAllToAll] (AnalyzePlan) and of the step-time model's
// all_to_all exchange (core/step_time.h). FailedPrecondition where the scheme
// does not apply: block diffusion (a document's noisy and clean copies are
// two plan documents, so the plan's groups do not say which ranks a head
// split must span), or a group whose size does not divide Hq (naming
// query_heads and the group); other errors as AllToAllTraffic's. The plan
// must be valid (ValidatePlan; not checked).
absl::StatusOr<AllToAllPhase> PlanAllToAllPhase(const Plan& plan, const ModelShape& shape,
                                                int32_t ranks_per_node);
// The same for a caller that has the plan's groups already (PlanRankGroups).
absl::StatusOr<AllToAllPhase> PlanAllToAllPhase(const Plan& plan,
                                                const std::vector<std::vector<int32_t>>& groups,
                                                const ModelShape& shape, int32_t ranks_per_node);

// Sets phase's per-rank inter-node bytes and the busiest intra- and
// inter-node link from its sent_tokens / received_tokens (in units of
// `unit_bytes`) and the inter-node units per rank. OutOfRange on overflow.
absl::Status FillLinkSplit(const std::vector<int64_t>& inter_sent,
                           const std::vector<int64_t>& inter_received, int64_t unit_bytes,
                           PhaseTraffic& phase);

// Fills `out` from one phase per rank in units of `unit_bytes` (backward
// sends what forward received, as SchemeBytes says): sent, received and
// bottleneck (both phases), the phase maxima, and the intra/inter-node split
// from the inter-node units per rank. OutOfRange on int64 overflow.
absl::Status FillSchemeBytesFromUnits(const std::vector<int64_t>& phase_sent,
                                      const std::vector<int64_t>& phase_received,
                                      const std::vector<int64_t>& inter_sent,
                                      const std::vector<int64_t>& inter_received,
                                      int64_t unit_bytes, SchemeBytes& out);

// A group of ranks and the scheme it runs.
struct RankGroup {
  std::vector<int32_t> ranks;  // ascending
  CommScheme scheme = CommScheme::kTargeted;
  // With scheme all_to_all: the two-level scheme instead (core/two_level.h:
  // the all-to-all within each node's part of the group, a targeted KV
  // exchange across nodes). The CPU engine and flashcp.torch run it
  // (worker/two_level_layout.h).
  bool two_level = false;
  friend bool operator==(const RankGroup&, const RankGroup&) = default;
};

// One phase of one group running its scheme within itself, per position of
// group.ranks, in bytes (as GroupedSchemeBytes below). O(group size).
struct GroupPhaseBytes {
  std::vector<int64_t> sent, received, inter_sent, inter_received;
};
// `metrics` is AnalyzePlan's for the plan with the same shape and
// ranks_per_node; the group's ranks must be valid ranks of it and a union of
// the plan's rank groups (not checked here: GroupedSchemeBytes checks).
// FailedPrecondition naming query_heads for an all-to-all group whose size
// does not divide Hq.
absl::StatusOr<GroupPhaseBytes> GroupSchemePhase(const PlanMetrics& metrics,
                                                 const RankGroup& group, const ModelShape& shape,
                                                 int32_t ranks_per_node);

// The traffic of `plan` where each group runs its scheme within itself, in
// bytes (phase token lists empty: the schemes' rows differ): kFullKv and
// kAllGather are all-gathers among the group's ranks only (full C/N blocks,
// or compacted non-last blocks padded to the group's largest), kTargeted as
// AnalyzePlan's (it never leaves a group), kAllToAll as AllToAllTraffic, or
// with two_level as TwoLevelGroupPhase (core/two_level.h).
// `metrics` is AnalyzePlan(plan, shape, ranks_per_node). The groups must
// each be a union of PlanRankGroups' groups and together cover [0, N):
// InvalidArgument otherwise; FailedPrecondition for an all-to-all group whose
// size does not divide Hq.
absl::StatusOr<SchemeBytes> GroupedSchemeBytes(const Plan& plan, const PlanMetrics& metrics,
                                               const std::vector<RankGroup>& groups,
                                               const ModelShape& shape, int32_t ranks_per_node);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_RANK_GROUPS_H_
