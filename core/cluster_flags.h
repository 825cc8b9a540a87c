// The cluster flags of every program that predicts step time (flashcp-plan,
// plan_quality, paper_step_model): --cluster and the constants that
// override it (core/step_time.h), read through core/flags.h. Their own
// target (flashcp_cluster_flags), linked only by those programs.
#ifndef FLASHCP_CORE_CLUSTER_FLAGS_H_
#define FLASHCP_CORE_CLUSTER_FLAGS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "core/flags.h"
#include "core/step_time.h"

namespace flashcp::core {

// The step-time options the flags give, with `ranks_per_node` as the nodes
// (the program's own --ranks_per_node): nullopt unless --cluster or one of
// the constants was given (`line.given`); a constant without --cluster
// overrides the h200 preset's defaults. --rank_step_times sets per_rank.
// InvalidArgument naming the flag for an unknown preset or a constant out
// of range (core::ValidateClusterSpec's fields as --flags).
absl::StatusOr<std::optional<StepTimeOptions>> StepTimeFromFlags(const CommandLine& line,
                                                                 int32_t ranks_per_node);

// The same, always: the preset or h200 defaults when no flag was given.
absl::StatusOr<StepTimeOptions> StepTimeFromFlagsOrDefault(const CommandLine& line,
                                                           int32_t ranks_per_node);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_CLUSTER_FLAGS_H_
