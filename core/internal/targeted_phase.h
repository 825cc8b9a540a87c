// One phase's targeted-exchange tokens per rank (SPEC "Targeted exchange, per
// phase") over a plan's shards grouped by document: the counting behind
// AnalyzePlan, TargetedPhaseBottleneck and TargetedPairTokens. Pure functions
// over plain data.
#ifndef FLASHCP_CORE_INTERNAL_TARGETED_PHASE_H_
#define FLASHCP_CORE_INTERNAL_TARGETED_PHASE_H_

#include <array>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace flashcp::core::internal {

// Shards grouped by document, each group sorted by start: a CSR table, so a
// batch of a million documents costs two flat arrays, not a million vectors.
struct DocIndex {
  std::vector<int32_t> begin;   // size n_docs + 1; group of doc d is [begin[d], begin[d+1])
  std::vector<int32_t> shards;  // shard indices
};

DocIndex IndexByDoc(const Plan& plan);

// One phase's targeted tokens per rank, from a valid plan's shards grouped by
// document (`index`: IndexByDoc(plan)).
// With `inter` set, also the tokens sent to ranks on other nodes (node of
// rank r: r / ranks_per_node; ranks_per_node 0: one node), summed over ranks;
// with `pairs` set (N x N, zeroed by the caller), the tokens each rank sends
// each other one, pairs[src * N + dest]; with `rank_inter` set (and
// `inter`), per rank the tokens sent to ([0]) and received from ([1]) ranks
// on other nodes.
void TargetedPhase(const Plan& plan, const DocIndex& index, std::vector<int64_t>& fwd_sent,
                   std::vector<int64_t>& fwd_recv, int32_t ranks_per_node = 0,
                   int64_t* inter = nullptr, std::vector<int64_t>* pairs = nullptr,
                   std::array<std::vector<int64_t>, 2>* rank_inter = nullptr);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_TARGETED_PHASE_H_
