// The pipeline planner's chunkings (core/pipeline.h; docs/pipeline.md,
// "Planner"): Algorithm 1 (workload-balanced chunking) and the token-capped
// chunking of kDppNoWbc, which the search (pipeline_plan.cc) groups.
#ifndef FLASHCP_CORE_INTERNAL_PIPELINE_CHUNKING_H_
#define FLASHCP_CORE_INTERNAL_PIPELINE_CHUNKING_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "core/pipeline.h"

namespace flashcp::core::internal {

// A chunking: its chunks and the units the DP groups (a split document's
// chunks in forward order, or one packed chunk), with each unit's longest
// document (the 1F1B order puts longer first).
struct Chunking {
  std::vector<PipelineChunk> chunks;
  std::vector<std::vector<int32_t>> units;
  std::vector<int64_t> unit_key;
};

// Algorithm 1 (workload-balanced chunking) for slice count K of the longest
// document, with token capacity C (0: none); with `per_doc_mesh` every cut
// document shorter than the longest gets its own mesh. Empty when K leaves a
// mesh slice empty.
std::optional<Chunking> ChunkBalanced(const PipelineRequest& r, int32_t k, int64_t capacity,
                                      bool per_doc_mesh);

// DPP without balanced chunking: slices of ceil(lmax / K) tokens. Empty when
// K exceeds lmax.
std::optional<Chunking> ChunkTokenCap(const PipelineRequest& r, int32_t k);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_PIPELINE_CHUNKING_H_
