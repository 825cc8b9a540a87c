// Text formats at the edge of the core: batch lines in, plan JSON out. Pure
// string functions; the callers do the I/O.
#ifndef FLASHCP_CORE_PLAN_JSON_H_
#define FLASHCP_CORE_PLAN_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/analysis.h"
#include "core/cost_model.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core {

// Parses one batch line: document lengths separated by commas and/or
// whitespace. InvalidArgument naming the 0-based token position for anything
// that is not a positive integer below 2^40, or for an empty line.
absl::StatusOr<std::vector<int64_t>> ParseBatchLine(absl::string_view line);

// What a plan's JSON carries beyond core::Plan and PlanMetrics.
struct PlanJsonFields {
  uint64_t batch_id = 0;         // flashcp-plan: the 0-based batch index
  absl::string_view strategy;    // StrategyName, or the server's name
  double planning_seconds = 0.0;
  const PlanInfo* ilp = nullptr;  // written as "ilp" when set (strategy ilp)
  // Written into "metrics" (cost_profile .. predicted_cost_imbalance) when
  // set, as the service does for every plan.
  const PlanCostReport* cost = nullptr;
  // Written into "metrics" (predicted_step_seconds .. predicted_cluster,
  // rank_predicted_times only with step_per_rank) when set, as
  // proto::StepTimeToProto does.
  const StepTimeReport* step = nullptr;
  bool step_per_rank = false;
  // "planner_version": the planner that made the plan where another process
  // did (flashcp-client: the server's); null: this build's PlannerVersion().
  const std::string* planner_version = nullptr;
};

// One JSON object, one line, no trailing newline: flashcp.v1.PlanResponse
// (proto/flashcp/v1/planner.proto) in protobuf's JSON mapping with the proto
// field names, fields in field-number order, every field of Plan, PlanMetrics
// and `fields` written even when zero, plan_hash (PlanHash) and
// planner_version (PlannerVersion) from core/plan_hash.h, no "error" and no
// "layout". Two
// choices within the mapping: 64-bit integers are JSON numbers (its parsers
// accept numbers or strings; its printer writes strings), and doubles are the
// shortest decimal that reads back exactly, "NaN" / "Infinity" / "-Infinity"
// for non-finite values. google::protobuf::util::JsonStringToMessage of it is
// exactly proto::ResponseToProto of the same plan (proto/plan_json_test.cc).
std::string PlanToJson(const Plan& plan, const PlanMetrics& metrics,
                       const PlanJsonFields& fields);

// `s` as a JSON string literal, quotes included; control characters escaped,
// other bytes (UTF-8 included) copied.
std::string JsonString(absl::string_view s);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_PLAN_JSON_H_
