// The edge between the wire and the core (STYLE item 2): the one file that
// knows both the flashcp.v1 protos and the core structs. Everything else in
// the service and the clients works on one side only.
#ifndef FLASHCP_PROTO_CONVERT_H_
#define FLASHCP_PROTO_CONVERT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/analysis.h"
#include "core/cost_model.h"
#include "core/step_time.h"
#include "core/group_schemes.h"
#include "core/strategies.h"
#include "core/types.h"
#include "flashcp/v1/planner.pb.h"

namespace flashcp::proto {

// What a zero-valued PlanRequest field means (planner.proto's comments):
// the strategy, and otherwise core's defaults (core::PlanOptions{},
// core::ModelShape{}), never restated here.
using core::kDefaultStrategy;  // core/strategies.h
// PlanRequest.min_shard_tokens that turns the rule off (core's 0).
inline constexpr int64_t kMinShardTokensOff = -1;
// Longest PlanRequest.cost_profile / ReportStepTimesRequest.cost_profile.
inline constexpr int64_t kMaxCostProfileBytes = 64;
// ReportStepTimesRequest bounds (planner.proto): steps, and rank entries in all.
inline constexpr int64_t kMaxReportSteps = 64;
inline constexpr int64_t kMaxReportRanks = 4096;
// Above every valid ReportStepTimesRequest: kMaxReportRanks entries of five
// doubles (47 bytes each with tag and length), kMaxReportSteps step headers
// and the profile name come to about 197 KiB.
inline constexpr int64_t kMaxReportBytes = 256 * 1024;

// A PlanRequest as the core sees it, defaults applied and every field checked.
struct PlanInput {
  uint64_t batch_id = 0;
  core::Batch batch;
  core::Strategy strategy = kDefaultStrategy;
  core::PlanOptions options;
  core::ModelShape shape;
  bool include_layout = false;
  // The cost profile named (kPairsProfile when none); empty when the request
  // gave coefficients, which are then in options.cost. A named profile's
  // shipped coefficients are in options.cost; the service replaces them with
  // its calibrated fit where it has one (cost_calibrated).
  std::string cost_profile = std::string(core::kPairsProfile);
  bool cost_calibrated = false;
  // The step-time model's inputs when the request named a cluster
  // (cluster or cluster_spec); its cluster's ranks_per_node is
  // options.ranks_per_node.
  std::optional<core::StepTimeOptions> step_time;
  bool choose_by_step_time = false;  // flashcp only; needs step_time
  // PlanRequest.choose_schemes and inter_node_weight (0 on the wire: the default).
  bool choose_schemes = false;
  double inter_node_weight = core::kDefaultInterNodeWeight;
};

// Applies the defaults and validates, in this order: the batch against
// `limits` (core::ValidateBatch: InvalidArgument naming doc_lens / doc_lens[i]
// / cp_size, ResourceExhausted above the limits), then strategy,
// target_imbalance (finite and >= 1 once defaulted), min_shard_tokens (-1:
// off, core 0; 0: core's default; else in [1, 2^40]), ranks_per_node
// (0: one node; else <= 65536), heads, head_dim and dtype_bytes, then the
// query_heads (core::ValidateModelShape), inter_node_weight (0: 8; else
// core::ValidateInterNodeWeight), then the
// cost (cost_profile at most kMaxCostProfileBytes and a known profile, not
// both it and cost, cost's coefficients core::ValidateCostCoefficients,
// "cost.<field>: ..."), rank_speed (core::ValidateRankSpeeds), query_heads
// (>= 0), then the step time: cluster (a core::ClusterPreset, at most
// kMaxCostProfileBytes), cluster_spec (overrides; core::ValidateClusterSpec,
// "cluster_spec.<field>: ..."), layers (0: 1; core::ValidateStepShape with
// the shape) and choose_by_step_time (needs a cluster); every error is InvalidArgument unless noted and its
// message starts with the field's name.
// `resolve`, when given, supplies a named profile's coefficients (and whether
// they are a calibrated fit, cost_calibrated) in place of the shipped ones,
// before rank_speed is validated against them: a request is validated once,
// against the coefficients it will be planned with.
using CostResolver = std::function<absl::StatusOr<std::pair<core::CostCoefficients, bool>>(
    absl::string_view profile)>;
absl::StatusOr<PlanInput> RequestFromProto(const v1::PlanRequest& request,
                                           const core::BatchLimits& limits,
                                           const CostResolver& resolve = nullptr);

// The largest PlanRequest that can pass RequestFromProto under `limits`, in
// bytes: max_docs documents of max_tokens each, every field at its widest
// encoding (unpacked doc_lens included), the longest strategy name. A larger
// message is refused unparsed.
int64_t MaxRequestBytes(const core::BatchLimits& limits);

// The inverse for clients: fills every field explicitly (no zero defaults;
// options.min_shard_tokens = 0, the rule off, goes out as -1). A non-empty
// `cost_profile` is sent by name; otherwise options.cost goes out as
// coefficients unless it is the pairs model (then neither is set).
v1::PlanRequest RequestToProto(uint64_t batch_id, const core::Batch& batch,
                               core::Strategy strategy, const core::PlanOptions& options,
                               const core::ModelShape& shape, bool include_layout,
                               absl::string_view cost_profile = "");

// A successful plan as a response, with its plan_hash (core::PlanHash) and
// planner_version (core::PlannerVersion). `layout` is optional (null: no layout).
// `planning_seconds` is the server's time spent planning and analysing. `ilp`
// (null: unset) fills PlanResponse.ilp (MakePlan's PlanInfo, strategy ilp).
// `cost` (null: unset): the cost model the plan balanced and its prediction.
v1::PlanResponse ResponseToProto(uint64_t batch_id, core::Strategy strategy,
                                 const core::Plan& plan, const core::PlanMetrics& metrics,
                                 const core::CommLayout* layout, double planning_seconds,
                                 const core::PlanInfo* ilp = nullptr,
                                 const core::PlanCostReport* cost = nullptr);

// Sets the response's groups, chosen_bytes and plan_source (PlanRequest.
// choose_schemes) from `chosen`.
void GroupSchemesToProto(const core::GroupSchemePlan& chosen, v1::PlanResponse* out);

// An upper bound on the serialized bytes of ResponseToProto's answer to
// `input` (its layout too when input.include_layout) for any valid plan of at
// most `max_shards` shards (core::MaxPlanShards), from the request alone in
// O(documents): each field at the widest varint its bound allows (the ilp
// field for strategy ilp; the groups with input.choose_schemes), and under
// the layout each non-last shard sent to at most N - 1 ranks.
int64_t MaxResponseBytes(const PlanInput& input, int64_t max_shards);

// The step-time report into `metrics` (fields predicted_*), each rank's
// times too when `per_rank`.
void StepTimeToProto(const core::StepTimeReport& report, bool per_rank, v1::PlanMetrics* metrics);

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
  // Empty rank costs from a server that predates the cost model.
  core::PlanCostReport cost;
  // As the server sent them (not recomputed): empty from a server that
  // predates them. core::PlanHash(plan) is the plan's own.
  std::string plan_hash;
  std::string planner_version;
};

// The item's error (ErrorFromProto) when `error` is set; otherwise the plan
// and metrics. Bytes entries of a scheme this build does not know are skipped
// (a newer server); missing schemes stay zero (empty per-rank lists).
// INVALID_ARGUMENT naming the field unless every per-rank list that is there
// (rank_tokens, rank_workload, rank_nonlast_tokens, rank_segments,
// rank_predicted_cost, and
// sent_bytes and received_bytes of each bytes entry of a known scheme) has
// exactly cp_size entries,
// so that indexing them by rank is safe. The plan itself is not re-validated:
// callers that distrust the server run core::ValidatePlan.
absl::StatusOr<PlanResult> ResponseFromProto(const v1::PlanResponse& response);

// A ReportStepTimesRequest as the calibrator takes it.
struct StepTimesReport {
  std::string cost_profile;
  std::vector<core::CostSample> samples;  // every step's ranks, in order
};

// Checks, in this order: cost_profile (non-empty, at most
// kMaxCostProfileBytes, not "pairs": INVALID_ARGUMENT; unknown: NOT_FOUND),
// the sizes (more than kMaxReportSteps steps or kMaxReportRanks rank entries:
// RESOURCE_EXHAUSTED), then each step (cp_size >= 1 and exactly cp_size rank
// entries, "steps[i].ranks: ...") and each entry (core::ValidateCostSample,
// "steps[i].ranks[j].seconds: ..."): INVALID_ARGUMENT.
absl::StatusOr<StepTimesReport> StepTimesFromProto(const v1::ReportStepTimesRequest& request);

// The request for `samples` of steps of `cp_size` ranks each (a multiple).
v1::ReportStepTimesRequest StepTimesToProto(absl::string_view cost_profile, int32_t cp_size,
                                            const std::vector<core::CostSample>& samples);

// The answer to an accepted report of `accepted` samples.
v1::ReportStepTimesResponse StepTimesResponseToProto(int64_t accepted,
                                                     const core::CostCalibrator::State& state);

void CostToProto(const core::CostCoefficients& c, v1::CostCoefficients* out);
core::CostCoefficients CostFromProto(const v1::CostCoefficients& c);

}  // namespace flashcp::proto

#endif  // FLASHCP_PROTO_CONVERT_H_
