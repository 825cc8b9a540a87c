// The wire/core edge of the global-batch mode (issue 27): flashcp.v1.
// PlanGlobalBatchRequest and GlobalBatchPlan (proto/flashcp/v1/
// global_batch.proto) <-> core/global_batch.h. The planning step is
// proto/global_batch.h.
#ifndef FLASHCP_PROTO_GLOBAL_BATCH_CONVERT_H_
#define FLASHCP_PROTO_GLOBAL_BATCH_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/global_batch.h"
#include "core/types.h"
#include "flashcp/v1/global_batch.pb.h"
#include "proto/convert.h"

namespace flashcp::proto {

// Most replicas one request may name (dp_size): each is one MakePlan.
inline constexpr int32_t kMaxGlobalBatchReplicas = 4096;

struct GlobalBatchInput {
  uint64_t batch_id = 0;
  std::vector<int64_t> doc_lens;
  int32_t dp_size = 1;
  int64_t context = 0;
  // The replicas' plan request (`plan`) as RequestFromProto made it; its
  // batch is a placeholder ({context} over cp_size ranks).
  PlanInput replica;
};

// Checks, in this order: plan.doc_lens empty and plan's unsupported fields
// unset (include_layout, choose_schemes, choose_by_step_time, cluster,
// cluster_spec), dp_size (1..kMaxGlobalBatchReplicas), doc_lens (non-empty;
// more than limits.max_docs: ResourceExhausted; each >= 1, "doc_lens[i]"),
// context (>= 1; above limits.max_tokens: ResourceExhausted, so that every
// replica's batch is within the limits; at least plan.cp_size), then `plan` through
// RequestFromProto with `resolve` (its errors' messages prefixed "plan.").
// InvalidArgument naming the field unless noted. core::PlanGlobalBatch
// checks the rest (the tokens fit dp_size x context, first fit places them).
absl::StatusOr<GlobalBatchInput> GlobalBatchRequestFromProto(
    const v1::PlanGlobalBatchRequest& request, const core::BatchLimits& limits,
    const CostResolver& resolve = nullptr);

// An upper bound on the serialized GlobalBatchPlan answering `input`, from
// the request alone (no planning, nothing of the pieces' size made): the P
// pieces counted, and the dp_size replicas, the i-th largest bounded as
// Plan's answer (MaxResponseBytes) for min(documents, context, P / i)
// documents of the longest piece's length over cp_size ranks.
int64_t MaxGlobalBatchResponseBytes(const GlobalBatchInput& input);

// The request for a global batch; `plan` is the replicas' PlanRequest
// (RequestToProto's, doc_lens and batch_id cleared here).
v1::PlanGlobalBatchRequest GlobalBatchRequestToProto(uint64_t batch_id,
                                                     const std::vector<int64_t>& doc_lens,
                                                     int32_t dp_size, int64_t context,
                                                     v1::PlanRequest plan);

// The answer back in core form, for clients: the pieces, each replica's
// pieces, doc_lens, workload and plan (ResponseFromProto's, its errors with
// "replicas[r].plan: "), the imbalances. InvalidArgument where piece_doc and
// piece_lens differ in length, a replica's piece index is out of range, or
// its doc_lens are not its pieces' lengths.
absl::StatusOr<core::GlobalBatchPlan> GlobalBatchPlanFromProto(const v1::GlobalBatchPlan& plan);

}  // namespace flashcp::proto

#endif  // FLASHCP_PROTO_GLOBAL_BATCH_CONVERT_H_
