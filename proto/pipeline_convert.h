// The wire/core edge of the pipeline mode: flashcp.v1.PlanPipelineRequest
// and PipelinePlan (proto/flashcp/v1/pipeline.proto) <-> core/pipeline.h.
#ifndef FLASHCP_PROTO_PIPELINE_CONVERT_H_
#define FLASHCP_PROTO_PIPELINE_CONVERT_H_

#include "absl/status/statusor.h"
#include "core/pipeline.h"
#include "core/types.h"
#include "flashcp/v1/pipeline.pb.h"

namespace flashcp::proto {

struct PipelineInput {
  uint64_t batch_id = 0;
  core::PipelineRequest request;
  core::PipelineOptions options;  // strategy and slice_count set; no solver, no stop
};

// Zeros take the documented defaults. InvalidArgument naming the field
// (strategy, profile, doc_lens ...; the rest core::CompletePipelineRequest
// checks when planning); ResourceExhausted above `limits` (max_docs,
// max_tokens).
absl::StatusOr<PipelineInput> PipelineRequestFromProto(const v1::PlanPipelineRequest& request,
                                                       const core::BatchLimits& limits);

v1::PipelinePlan PipelinePlanToProto(const core::PipelinePlan& plan, uint64_t batch_id,
                                     double planning_seconds);

// The core plan back from the wire (chunks, pipelines, ckpt, strategy and
// the prediction's summary; no ops or timeline). InvalidArgument for an
// unknown strategy or chunk kind.
absl::StatusOr<core::PipelinePlan> PipelinePlanFromProto(const v1::PipelinePlan& plan);

}  // namespace flashcp::proto

#endif  // FLASHCP_PROTO_PIPELINE_CONVERT_H_
