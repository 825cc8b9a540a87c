// The exchange layout (core/analysis.h, CommLayout) under a non-causal mask:
// what BuildCommLayout answers for a block-diffusion plan. Kept beside the
// causal builder, not in it, so the causal layout's code stays untouched.
#ifndef FLASHCP_CORE_MASK_LAYOUT_H_
#define FLASHCP_CORE_MASK_LAYOUT_H_

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/types.h"

namespace flashcp::core {

// Under block diffusion, for a valid plan (not checked; BuildCommLayout
// validates first):
//  - docs, and each rank's shards, shard_offset and doc_pos as under the
//    causal mask; every DocPiece::send_index is -1 (a shard may have several
//    send ranges);
//  - a rank's send ranges are the parts of its shards some other rank needs
//    (ForEachNeededRemote), cut where the set of ranks needing them changes,
//    in local token order (SendRange::skip: tokens of the shard before it);
//    send_tokens is MaskTraffic::needed_elsewhere_tokens;
//  - targeted[dest] lists exactly the ranges dest needs, so a rank receives
//    each remote token its queries attend to once, and nothing else:
//    targeted tokens equal ComputeMaskTraffic's pair_tokens.
absl::StatusOr<CommLayout> BuildMaskCommLayout(const Plan& plan);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_MASK_LAYOUT_H_
