// The `ilp` strategy's model constants and helpers (docs/ilp.md). PlanIlp
// itself is declared in strategies_internal.h beside the other planners.
#ifndef FLASHCP_CORE_INTERNAL_ILP_H_
#define FLASHCP_CORE_INTERNAL_ILP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/types.h"

namespace flashcp::core::internal {

// Most binary variables (blocks x ranks) the ILP accepts; a larger model is
// an InvalidArgument naming `ilp.granularity`. CBC proves optimality only on
// tiny models (tens of blocks); at this size it returns the best heuristic's
// plan or a little better, with its gap (docs/ilp.md).
inline constexpr int64_t kMaxIlpBinaryVars = 4096;

// The default comm weight, as a fraction: a plan whose every rank's tokens are
// all non-last (no comm saving) costs this much imbalance, i.e. the objective
// in units of the mean rank workload is
//   imbalance + kDefaultIlpCommFraction * (max non-last tokens / (C/N)).
// 0.02 equals the heuristics' default target imbalance (PlanOptions), so the
// ILP never gives up more than 0.02 of imbalance for any comm saving: balance
// dominates, comm breaks ties among (nearly) balanced plans.
inline constexpr double kDefaultIlpCommFraction = 0.02;

// ceil(total / (16 N)) tokens, at least 1: about 16 blocks per rank.
// `batch` must pass ValidateBatch.
int64_t DefaultIlpGranularity(const Batch& batch);

// kDefaultIlpCommFraction * (mean rank workload) / (C/N), in (query, key)
// pairs per token. `batch` must pass ValidateBatch.
double DefaultIlpCommWeight(const Batch& batch);

// The ILP objective of any valid plan: max_r W_r + comm_weight * max_r
// nonlast_r (SPEC Eq. 3 workloads, Eq. 5 non-last tokens). InvalidArgument if
// the plan is invalid.
absl::StatusOr<double> IlpObjective(const Plan& plan, double comm_weight);

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_ILP_H_
