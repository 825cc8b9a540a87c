// The edge between the wire and the core (STYLE item 2): the one file that
// knows both the flashcp.v1 protos and the core structs. Everything else in
// the service and the clients works on one side only.
#ifndef FLASHCP_PROTO_CONVERT_H_
#define FLASHCP_PROTO_CONVERT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/analysis.h"
#include "core/strategies.h"
#include "core/types.h"
#include "flashcp/v1/planner.pb.h"

namespace flashcp::proto {

// What a zero-valued PlanRequest field means (planner.proto's comments).
inline constexpr core::Strategy kDefaultStrategy = core::Strategy::kFlashCp;
inline constexpr double kDefaultTargetImbalance = 1.02;
inline constexpr int32_t kDefaultHeads = 32;
inline constexpr int32_t kDefaultHeadDim = 128;
inline constexpr int32_t kDefaultDtypeBytes = 2;  // bf16
inline constexpr int64_t kDefaultMinShardTokens = 128;
// PlanRequest.min_shard_tokens that turns the rule off (core's 0).
inline constexpr int64_t kMinShardTokensOff = -1;

// A PlanRequest as the core sees it, defaults applied and every field checked.
struct PlanInput {
  uint64_t batch_id = 0;
  core::Batch batch;
  core::Strategy strategy = kDefaultStrategy;
  core::PlanOptions options;
  core::ModelShape shape;
  bool include_layout = false;
};

// Applies the defaults and validates, in this order: the batch against
// `limits` (core::ValidateBatch: InvalidArgument naming doc_lens / doc_lens[i]
// / cp_size, ResourceExhausted above the limits), then strategy,
// target_imbalance (finite and >= 1 once defaulted), min_shard_tokens (-1:
// off, core 0; 0: kDefaultMinShardTokens; else in [1, 2^40]), ranks_per_node
// (0: one node; else <= 65536), heads, head_dim and dtype_bytes; every error is InvalidArgument unless noted and its message
// starts with the field's name.
absl::StatusOr<PlanInput> RequestFromProto(const v1::PlanRequest& request,
                                           const core::BatchLimits& limits);

// The largest PlanRequest that can pass RequestFromProto under `limits`, in
// bytes: max_docs documents of max_tokens each, every field at its widest
// encoding (unpacked doc_lens included), the longest strategy name. A larger
// message is refused unparsed.
int64_t MaxRequestBytes(const core::BatchLimits& limits);

// The inverse for clients: fills every field explicitly (no zero defaults;
// options.min_shard_tokens = 0, the rule off, goes out as -1).
v1::PlanRequest RequestToProto(uint64_t batch_id, const core::Batch& batch,
                               core::Strategy strategy, const core::PlanOptions& options,
                               const core::ModelShape& shape, bool include_layout);

// A successful plan as a response. `layout` is optional (null: no layout).
// `planning_seconds` is the server's time spent planning and analysing. `ilp`
// (null: unset) fills PlanResponse.ilp (MakePlan's PlanInfo, strategy ilp).
v1::PlanResponse ResponseToProto(uint64_t batch_id, core::Strategy strategy,
                                 const core::Plan& plan, const core::PlanMetrics& metrics,
                                 const core::CommLayout* layout, double planning_seconds,
                                 const core::PlanInfo* ilp = nullptr);

// An upper bound on the serialized bytes of ResponseToProto's answer to
// `input` (its layout too when input.include_layout) for any valid plan of at
// most `max_shards` shards (core::MaxPlanShards), from the request alone in
// O(documents): each field at the widest varint its bound allows (the ilp
// field for strategy ilp), and under
// the layout each non-last shard sent to at most N - 1 ranks.
int64_t MaxResponseBytes(const PlanInput& input, int64_t max_shards);

// A failed item: only batch_id and error are set. `status` must not be OK.
v1::PlanResponse ErrorResponseToProto(uint64_t batch_id, const absl::Status& status);

// The per-item error as a Status: same code (google.rpc.Code numbering) and
// message; a code outside 1..16 becomes UNKNOWN with the number in the message.
absl::Status ErrorFromProto(const v1::Error& error);

// A response back in core form, for clients.
struct PlanResult {
  uint64_t batch_id = 0;
  std::string strategy;
  core::Plan plan;
  core::PlanMetrics metrics;  // max_nonlast_tokens derived from rank_nonlast_tokens
  double planning_seconds = 0.0;
};

// The item's error (ErrorFromProto) when `error` is set; otherwise the plan
// and metrics. Bytes entries of a scheme this build does not know are skipped
// (a newer server); missing schemes stay zero (empty per-rank lists).
// INVALID_ARGUMENT naming the field unless every per-rank list that is there
// (rank_tokens, rank_workload, rank_nonlast_tokens, rank_segments, and
// sent_bytes and received_bytes of each bytes entry of a known scheme) has
// exactly cp_size entries,
// so that indexing them by rank is safe. The plan itself is not re-validated:
// callers that distrust the server run core::ValidatePlan.
absl::StatusOr<PlanResult> ResponseFromProto(const v1::PlanResponse& response);

}  // namespace flashcp::proto

#endif  // FLASHCP_PROTO_CONVERT_H_
