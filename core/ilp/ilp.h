// The `ilp` strategy (docs/ilp.md): an exact MILP over block-to-rank
// assignments, solved by CBC. The only target that links CBC: core's
// MakePlan reaches it through PlanOptions::ilp.solver, so programs that never
// plan with the ILP (the C++ client, the worker) do not link it. A program
// that does sets the solver once:
//   options.ilp.solver = core::ilp::Solve;
#ifndef FLASHCP_CORE_ILP_ILP_H_
#define FLASHCP_CORE_ILP_ILP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core::ilp {

// Most binary variables (blocks x ranks) the ILP accepts; a larger model is
// an InvalidArgument naming `ilp.granularity`. CBC proves optimality only on
// tiny models (tens of blocks); at this size it returns the best heuristic's
// plan or a little better, with its gap (docs/ilp.md).
inline constexpr int64_t kMaxBinaryVars = 4096;

// The default comm weight, as a fraction: a plan whose every rank's tokens are
// all non-last (no comm saving) costs this much imbalance, i.e. the objective
// in units of the mean rank workload is
//   imbalance + kDefaultCommFraction * (max non-last tokens / (C/N)).
// 0.02 equals the heuristics' default target imbalance (PlanOptions), so the
// ILP never gives up more than 0.02 of imbalance for any comm saving: balance
// dominates, comm breaks ties among (nearly) balanced plans.
inline constexpr double kDefaultCommFraction = 0.02;

// ceil(total / (16 N)) tokens, at least 1: about 16 blocks per rank.
// `batch` must pass ValidateBatch.
int64_t DefaultGranularity(const Batch& batch);

// kDefaultCommFraction * (mean rank workload) / (C/N), in (query, key)
// pairs per token. `batch` must pass ValidateBatch.
double DefaultCommWeight(const Batch& batch);

// The ILP objective of any valid plan: max_r W_r + comm_weight * max_r
// nonlast_r (SPEC Eq. 3 workloads, Eq. 5 non-last tokens). InvalidArgument if
// the plan is invalid.
absl::StatusOr<double> Objective(const Plan& plan, double comm_weight);

// The ILP planner (an IlpSolver): `batch` must pass ValidateBatch (MakePlan
// checks it). Returns `stop`'s status once it says stop; IlpOptions's time
// limits end CBC early with the best plan so far; `info` (may be null) gets
// the gap, optimality, objective and granularity.
absl::StatusOr<Plan> Solve(const Batch& batch, const IlpOptions& options, const StopToken& stop,
                           PlanInfo* info);

}  // namespace flashcp::core::ilp

#endif  // FLASHCP_CORE_ILP_ILP_H_
