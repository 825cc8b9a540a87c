// The pipeline checkpoint programme on CBC (core/ilp/pipeline_ckpt.h).
// Rows are scaled by their largest coefficient and the objective by its
// largest cost, so CBC's tolerances see numbers near 1 rather than bytes
// (~1e10) and seconds (~1e-4).
#include "core/ilp/pipeline_ckpt.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <new>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coin/CbcEventHandler.hpp"
#include "coin/CbcModel.hpp"
#include "coin/CoinError.hpp"
#include "coin/CoinPackedMatrix.hpp"
#include "coin/OsiClpSolverInterface.hpp"
#include "core/status_macros.h"

namespace flashcp::core::ilp {
namespace {

// Ends CBC's search at its next event once `stop` says stop.
class StopHandler final : public CbcEventHandler {
 public:
  explicit StopHandler(const StopToken* stop) : stop_(stop) {}
  CbcAction event(CbcEvent /*which*/) override {
    return stop_->Check().ok() ? CbcAction::noAction : CbcAction::stop;
  }
  CbcEventHandler* clone() const override { return new StopHandler(*this); }

 private:
  const StopToken* stop_;
};

// Relative slack CBC's integer solutions may show on a scaled row.
constexpr double kRowTolerance = 1e-9;

bool Feasible(const CkptProblem& p, const std::vector<int32_t>& c) {
  for (const CkptRow& row : p.rows) {
    double lhs = 0, scale = 0;
    for (const auto& [j, a] : row.terms) {
      lhs += a * c[j];
      scale = std::max(scale, std::abs(a));
    }
    if (lhs < row.rhs - kRowTolerance * std::max(1.0, scale)) return false;
  }
  return true;
}

double Objective(const CkptProblem& p, const std::vector<int32_t>& c) {
  double o = 0;
  for (int32_t j = 0; j < p.vars; ++j) o += p.cost[j] * c[j];
  return o;
}

absl::Status ValidateCkptInput(const CkptProblem& problem, const std::vector<int32_t>& start,
                               const CkptSolveOptions& options) {
  const int32_t n = problem.vars;
  if (n < 0 || problem.cost.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError("problem.cost: not one cost per variable");
  }
  if (problem.max_value < 0) return absl::InvalidArgumentError("problem.max_value: negative");
  for (size_t i = 0; i < problem.rows.size(); ++i) {
    for (const auto& [j, a] : problem.rows[i].terms) {
      if (j < 0 || j >= n || !std::isfinite(a)) {
        return absl::InvalidArgumentError(absl::StrCat("problem.rows[", i, "]: bad term"));
      }
    }
  }
  if (start.size() != static_cast<size_t>(n) ||
      std::any_of(start.begin(), start.end(),
                  [&](int32_t v) { return v < 0 || v > problem.max_value; }) ||
      !Feasible(problem, start)) {
    return absl::InvalidArgumentError("start: not a feasible solution of the problem");
  }
  if (!std::isfinite(options.time_limit_seconds) || options.time_limit_seconds < 0) {
    return absl::InvalidArgumentError("ckpt.time_limit_seconds: must be finite and >= 0");
  }
  return absl::OkStatus();
}

// Loads the problem, each row scaled by its largest coefficient and the
// costs by cost_scale, into `solver`; returns the number of rows loaded
// (rows with no nonzero coefficient are left out).
size_t LoadScaledProblem(const CkptProblem& problem, double cost_scale,
                         OsiClpSolverInterface& solver) {
  const int32_t n = problem.vars;
  std::vector<int> ri, ci;
  std::vector<double> el, rlb, rub;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (const CkptRow& row : problem.rows) {
    double scale = 0;
    for (const auto& [j, a] : row.terms) scale = std::max(scale, std::abs(a));
    if (scale == 0) continue;
    const int r = static_cast<int>(rlb.size());
    for (const auto& [j, a] : row.terms) {
      ri.push_back(r);
      ci.push_back(j);
      el.push_back(a / scale);
    }
    rlb.push_back(row.rhs / scale);
    rub.push_back(kInf);
  }
  std::vector<double> lb(n, 0.0), ub(n, problem.max_value), obj(n);
  for (int32_t j = 0; j < n; ++j) obj[j] = problem.cost[j] / cost_scale;
  // A variable in no row is 0 at the optimum (costs are >= 0).
  CoinPackedMatrix matrix(false, ri.data(), ci.data(), el.data(),
                          static_cast<CoinBigIndex>(el.size()));
  // Triplets size the matrix by the largest index seen: a variable in no
  // row would have no column.
  matrix.setDimensions(static_cast<int>(rlb.size()), n);
  solver.loadProblem(matrix, lb.data(), ub.data(), obj.data(), rlb.data(), rub.data());
  return rlb.size();
}

// Branch and bound from `best` (the start); keeps CBC's solution where it is
// feasible and no worse, and sets the gap and optimality.
absl::Status RunBranchAndBound(const CkptProblem& problem, const CkptSolveOptions& options,
                               const StopToken& stop, double cost_scale,
                               OsiClpSolverInterface& solver, CkptSolution& best) {
  const int32_t n = problem.vars;
  for (int32_t j = 0; j < n; ++j) solver.setInteger(j);
  CbcModel model(solver);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  model.solver()->messageHandler()->setLogLevel(0);
  model.setUseElapsedTime(true);
  model.setMaximumSeconds(options.time_limit_seconds);
  model.setAllowableFractionGap(std::max(options.relative_gap, 1e-9));
  model.setAllowableGap(1e-9);
  model.setNumberThreads(0);
  const StopHandler handler(&stop);
  model.passInEventHandler(&handler);
  model.initialSolve();
  std::vector<double> start_d(best.values.begin(), best.values.end());
  model.setBestSolution(start_d.data(), n, best.objective / cost_scale, /*check=*/true);
  model.branchAndBound();
  FLASHCP_RETURN_IF_ERROR(stop.Check());
  const double bound = model.getBestPossibleObjValue() * cost_scale;
  if (const double* sol = model.bestSolution(); sol != nullptr) {
    std::vector<int32_t> c(n);
    for (int32_t j = 0; j < n; ++j) {
      c[j] = std::clamp(static_cast<int32_t>(std::lround(sol[j])), 0, problem.max_value);
    }
    const double o = Objective(problem, c);
    if (Feasible(problem, c) && o <= best.objective) {
      best.values = std::move(c);
      best.objective = o;
    }
  }
  best.gap = best.objective > 0 ? std::max(0.0, (best.objective - bound) / best.objective) : 0.0;
  // Proven means within the allowed gap; optimal when that gap is 0, or
  // when no LP node could beat the incumbent (secondary status 1: CBC then
  // leaves the root LP's value as its bound, so the gap above is stale).
  best.optimal = model.isProvenOptimal() &&
                 (options.relative_gap <= 1e-9 || best.gap <= 1e-9 || model.secondaryStatus() == 1);
  if (best.optimal) best.gap = 0;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CkptSolution> SolvePipelineCkpt(const CkptProblem& problem,
                                               const std::vector<int32_t>& start,
                                               const CkptSolveOptions& options,
                                               const StopToken& stop) {
  FLASHCP_RETURN_IF_ERROR(ValidateCkptInput(problem, start, options));
  FLASHCP_RETURN_IF_ERROR(stop.Check());
  const int32_t n = problem.vars;
  CkptSolution best;
  best.values = start;
  best.objective = Objective(problem, start);
  if (n == 0 || best.objective == 0) {  // nothing to lower
    best.optimal = true;
    return best;
  }
  double cost_scale = 0;
  for (double c : problem.cost) cost_scale = std::max(cost_scale, c);
  if (cost_scale <= 0) cost_scale = 1;
  try {
    OsiClpSolverInterface solver;
    solver.messageHandler()->setLogLevel(0);
    solver.setHintParam(OsiDoReducePrint, true, OsiHintTry);
    if (LoadScaledProblem(problem, cost_scale, solver) == 0) {
      // No row: the empty matrix has no columns CBC knows of; all zero is optimal.
      best.values.assign(n, 0);
      best.objective = 0;
      best.optimal = true;
      return best;
    }
    FLASHCP_RETURN_IF_ERROR(RunBranchAndBound(problem, options, stop, cost_scale, solver, best));
    return best;
  } catch (const CoinError& e) {
    return absl::InternalError(absl::StrCat("pipeline ckpt: CBC failed in ", e.className(),
                                            "::", e.methodName(), ": ", e.message()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("pipeline ckpt: out of memory in CBC");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("pipeline ckpt: CBC threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("pipeline ckpt: CBC threw an unknown exception");
  }
}

}  // namespace flashcp::core::ilp
