// The pipeline mode's checkpoint programme (DPP Eq. 15-20; core/pipeline.h's
// CkptProblem) on CBC: a CkptSolver. Programs that plan pipelines with the
// ILP set it once:
//   options.ckpt_solver = core::ilp::SolvePipelineCkpt;
#ifndef FLASHCP_CORE_ILP_PIPELINE_CKPT_H_
#define FLASHCP_CORE_ILP_PIPELINE_CKPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/pipeline.h"

namespace flashcp::core::ilp {

// Minimizes sum_j cost[j] c[j] over integers c[j] in [0, max_value] subject to
// every row, starting from the feasible `start`. CBC stops at
// options.time_limit_seconds or options.relative_gap (the returned gap is
// relative to the objective; 0 when proven optimal) and at `stop`, whose
// status is then returned. InvalidArgument naming the field for a malformed
// problem or a `start` that violates a row; never worse than `start`.
absl::StatusOr<CkptSolution> SolvePipelineCkpt(const CkptProblem& problem,
                                               const std::vector<int32_t>& start,
                                               const CkptSolveOptions& options,
                                               const StopToken& stop);

}  // namespace flashcp::core::ilp

#endif  // FLASHCP_CORE_ILP_PIPELINE_CKPT_H_
