// BuildCpRankLayout under block diffusion (cp_layout.h, the block_size
// fields): every shard stages exactly the K/V core::AppendNeededKv says its
// queries attend to, from local rows or from what the scheme received. Kept
// apart from the causal builder, whose layouts stay byte-identical.
#ifndef FLASHCP_WORKER_CP_LAYOUT_MASK_H_
#define FLASHCP_WORKER_CP_LAYOUT_MASK_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/types.h"
#include "worker/cp_layout.h"

namespace flashcp::worker {

// The plan is valid and under block diffusion, `layout` its
// core::BuildCommLayout (BuildCpRankLayout checks both). Schemes:
//  - full_kv: every rank's local rows all-gathered;
//  - allgather: every rank's send ranges (the parts other ranks need),
//    all-gathered in blocks padded to the largest;
//  - targeted: each send range only to the ranks that need it;
//  - all_to_all: Unimplemented (the plan's rank groups split a document's
//    noisy and clean copies; core reports it not applicable).
absl::StatusOr<CpRankLayout> BuildMaskedCpRankLayout(const core::Plan& plan,
                                                     const core::CommLayout& layout,
                                                     int32_t rank, core::CommScheme scheme);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_CP_LAYOUT_MASK_H_
