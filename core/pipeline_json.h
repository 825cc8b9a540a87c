// Text formats of the pipeline mode (core/pipeline.h): one plan as a JSON
// line and as an SVG picture. Pure string functions; callers do the I/O.
#ifndef FLASHCP_CORE_PIPELINE_JSON_H_
#define FLASHCP_CORE_PIPELINE_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/pipeline.h"

namespace flashcp::core {

// One JSON object, one line: batch_id, planning_seconds, the plan's strategy,
// chunks ({kind, slices: [{doc, start, len}]}), pipelines ({forward,
// backward}), ckpt ([stage][chunk]), slice_count, ckpt_solver, ckpt_gap,
// ckpt_optimal and prediction {iteration_s, bubble_share, recompute_s,
// stage_peak_bytes}: the field names of flashcp.v1.PipelinePlan
// (proto/flashcp/v1/pipeline.proto). Doubles as the shortest decimal that
// reads back exactly.
std::string PipelinePlanToJson(const PipelinePlan& plan, uint64_t batch_id,
                               double planning_seconds);

// The plan's replay drawn as stages x time: one row per stage, each op a box
// coloured by chunk (forward light, backward dark), the recompute part of a
// backward hatched. InvalidArgument for a plan with no ops.
absl::StatusOr<std::string> PipelinePlanToSvg(const PipelinePlan& plan);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_PIPELINE_JSON_H_
