// The `ilp` strategy: an exact MILP over block-to-rank assignments, solved by
// CBC with a time limit (docs/ilp.md has the model, its linearization and
// measured solve times).
//
// Blocks. Every document is cut at multiples of the granularity g (its last
// block may be shorter) and, in addition, at every shard boundary of the Ring
// and Llama3 plans (at most 3N - 2 extra cuts in all) and of the best other
// heuristic plan that keeps the model within kMaxBinaryVars. Variables
// x[b][r] in {0,1} put block b on rank r.
//
// Exact equal tokens. Each rank's token row is an equality over integers,
//   sum_b len_b * x[b][r] = RankRealTokens(total, N, r),
// so every plan the model admits meets the invariant exactly, with no repair
// step and nothing left out of the reported objective. A plain g-grid may
// admit no such plan (docs [6, 6, 6] on 4 ranks at g = 6 needs 5, 5, 4, 4
// tokens); the Ring and Llama3 cut points make those two plans representable,
// so the model is always feasible. The price: at g > 1 a plan can only cut a
// document on the grid or at those points; at g = 1 every plan is
// representable and the optimum is the true optimum.
//
// Objective (SPEC Eq. 3 and Eq. 5), minimized:
//   max_r W_r + comm_weight * max_r nonlast_r
// A block's workload W_b = (2 start + len + 1) len / 2 is a constant, and W is
// additive over a document's blocks, so W_r = sum_b W_b x[b][r] is linear. A
// block is in the last shard of its document iff it and every later block of
// the document sit on one rank. With z[b][r] in [0,1] for each non-final block
//   z[b][r] <= x[b][r],  z[b][r] <= z[b+1][r]   (z of a final block is x)
// nonlast_r = sum_b len_b (x[b][r] - z[b][r]). Only upper bounds on z are
// needed: the objective pushes z up on the rank with the most non-last tokens,
// where z then equals the indicator; on other ranks a z below its indicator
// only overstates a non-binding row. The plan's objective is recomputed from
// the plan itself (Objective), never read off z.
//
// Incumbent. CBC starts from the best, by that objective, of every other
// strategy's plan the blocks can represent (the best one always is, when it
// fits the bound), so the ILP is never worse than any heuristic, even when
// stopped at once. Past tiny instances CBC rarely improves on it: the LP
// relaxation spreads every block evenly over the ranks, which is perfectly
// balanced and has no non-last tokens, so its bound stays at 1 (docs/ilp.md).
//
// Scaling. Rows are in pairs and tokens; the objective is divided by the mean
// rank workload, so it reads imbalance + comm_weight * max nonlast / mean W,
// and the reported gap is relative to it.
#include "core/ilp/ilp.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coin/CbcEventHandler.hpp"
#include "coin/CbcModel.hpp"
#include "coin/ClpEventHandler.hpp"
#include "coin/CoinError.hpp"
#include "coin/CoinPackedMatrix.hpp"
#include "coin/OsiClpSolverInterface.hpp"
#include "core/analysis.h"
#include "core/ilp/model.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::ilp {

using internal::FinishPlan;
using internal::PlanLlama3;
using internal::PlanRing;

namespace {

// CBC's cutoff increment, in units of the mean rank workload: a solution must
// beat the incumbent by this much to be searched for. CBC's default (1e-5)
// would hide improvements of a few pairs on a 10^5-pair batch.
constexpr double kCutoffIncrement = 1e-7;

struct CbcResult {
  std::optional<std::vector<int32_t>> owners;  // CBC's best solution, if any
  bool proven_optimal = false;
  double bound = -std::numeric_limits<double>::infinity();  // in mean workloads
};

// Whether the call is stopped or its time is up (IlpOptions::seconds_left).
// Both point at the caller's objects, which outlive the solve.
struct StopOrTimeUp {
  const StopToken* stop;
  const std::function<double()>* seconds_left;
  bool operator()() const {
    return !stop->Check().ok() || (*seconds_left && (*seconds_left)() <= 0);
  }
};

// Ends CBC's search at its next event (nodes, solutions) once StopOrTimeUp.
// CBC keeps a clone.
class CbcStop final : public CbcEventHandler {
 public:
  explicit CbcStop(StopOrTimeUp stopped) : stopped_(stopped) {}
  CbcAction event(CbcEvent /*which*/) override {
    return stopped_() ? CbcAction::stop : CbcAction::noAction;
  }
  CbcEventHandler* clone() const override { return new CbcStop(*this); }

 private:
  StopOrTimeUp stopped_;
};

// Ends an LP solve at its next simplex iteration once StopOrTimeUp: CBC's
// first LP and the check of the incumbent are simplex runs of seconds on
// large models, outside CBC's events and time limit. The stopped LP leaves
// CBC without a solution of its own; Solve then keeps the incumbent.
class ClpStop final : public ClpEventHandler {
 public:
  explicit ClpStop(StopOrTimeUp stopped) : stopped_(stopped) {}
  int event(Event which) override { return which == endOfIteration && stopped_() ? 0 : -1; }
  ClpEventHandler* clone() const override { return new ClpStop(*this); }

 private:
  StopOrTimeUp stopped_;
};

// Runs CBC, silenced, with `start` as its first incumbent, for at most
// options.time_limit_seconds (less what options.seconds_left says is left).
// No exception leaves.
absl::StatusOr<CbcResult> SolveWithCbc(const Model& m, const std::vector<double>* start,
                                       double start_obj, const IlpOptions& options,
                                       const StopToken& stop) {
  double time_limit_seconds = options.time_limit_seconds;
  if (options.seconds_left) {
    time_limit_seconds = std::max(0.0, std::min(time_limit_seconds, options.seconds_left()));
  }
  try {
    OsiClpSolverInterface solver;
    solver.messageHandler()->setLogLevel(0);
    solver.setHintParam(OsiDoReducePrint, true, OsiHintTry);
    const StopOrTimeUp stopped{&stop, &options.seconds_left};
    const ClpStop lp_stop(stopped);
    solver.getModelPtr()->passInEventHandler(&lp_stop);  // cloned, also into CBC's copy
    const CoinPackedMatrix matrix(false, m.row_idx.data(), m.col_idx.data(), m.elems.data(),
                                  static_cast<CoinBigIndex>(m.elems.size()));
    solver.loadProblem(matrix, m.col_lb.data(), m.col_ub.data(), m.obj.data(), m.row_lb.data(),
                       m.row_ub.data());
    for (size_t b = 0; b < m.blocks.size(); ++b) {
      for (int32_t r = 0; r < m.ranks; ++r) solver.setInteger(m.X(b, r));
    }
    if (m.w_integral) solver.setInteger(m.w_col);
    if (m.m_integral) solver.setInteger(m.m_col);

    CbcModel model(solver);
    model.setLogLevel(0);
    model.messageHandler()->setLogLevel(0);
    model.solver()->messageHandler()->setLogLevel(0);
    // No CbcStrategyDefault: its cut generators and heuristics made the
    // small-instance proofs slower (docs/ilp.md), and the heuristics' plans
    // already give CBC a good incumbent.
    model.setUseElapsedTime(true);
    model.setMaximumSeconds(time_limit_seconds);
    model.setAllowableGap(1e-9);
    model.setAllowableFractionGap(1e-9);
    model.setCutoffIncrement(kCutoffIncrement);
    model.setNumberThreads(0);
    const CbcStop search_stop(stopped);
    model.passInEventHandler(&search_stop);

    model.initialSolve();
    if (model.solver()->isProvenPrimalInfeasible()) {
      return absl::InternalError(
          "ilp: the LP relaxation is infeasible, though the Ring plan should be feasible");
    }
    if (start != nullptr) {
      model.setBestSolution(start->data(), m.num_cols, start_obj, /*check=*/true);
    }
    model.branchAndBound();

    CbcResult result;
    result.proven_optimal = model.isProvenOptimal();
    result.bound = model.getBestPossibleObjValue();
    if (const double* sol = model.bestSolution(); sol != nullptr) {
      result.owners = OwnersFromSolution(m, sol);
    }
    return result;
  } catch (const CoinError& e) {
    return absl::InternalError(absl::StrCat("ilp: CBC failed in ", e.className(),
                                            "::", e.methodName(), ": ", e.message()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("ilp: out of memory in CBC");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ilp: CBC threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("ilp: CBC threw an unknown exception");
  }
}

double TotalWorkload(const Batch& batch) {
  double w = 0.0;
  for (int64_t len : batch.doc_lens) w += ShardWorkload(0, len);
  return w;
}

}  // namespace

int64_t DefaultGranularity(const Batch& batch) {
  const int64_t total = TotalTokens(batch.doc_lens);
  const int64_t per = int64_t{16} * batch.cp_size;
  return std::max<int64_t>(1, (total + per - 1) / per);
}

double DefaultCommWeight(const Batch& batch) {
  const int64_t total = TotalTokens(batch.doc_lens);
  const double mean_work = TotalWorkload(batch) / batch.cp_size;
  return kDefaultCommFraction * mean_work /
         static_cast<double>(TokensPerRank(total, batch.cp_size));
}

absl::StatusOr<double> Objective(const Plan& plan, double comm_weight) {
  FLASHCP_ASSIGN_OR_RETURN(const CommLayout layout, BuildCommLayout(plan));
  double max_work = 0.0;
  int64_t max_nonlast = 0;
  for (const RankLayout& rank : layout.ranks) {
    double work = 0.0;
    for (int32_t s : rank.shards) work += ShardWorkload(plan.shards[s].start, plan.shards[s].len);
    max_work = std::max(max_work, work);
    max_nonlast = std::max(max_nonlast, rank.send_tokens);
  }
  return max_work + comm_weight * static_cast<double>(max_nonlast);
}

namespace {

absl::Status CheckOptions(const IlpOptions& options) {
  if (!(options.granularity >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ilp.granularity: must be >= 0 tokens (0 picks ceil(C / 16N)), got ",
        options.granularity));
  }
  if (!std::isfinite(options.time_limit_seconds) || options.time_limit_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ilp.time_limit_seconds: must be a finite number of seconds >= 0, got ",
        options.time_limit_seconds));
  }
  if (!std::isfinite(options.comm_weight) || options.comm_weight < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ilp.comm_weight: must be finite and >= 0 (0 picks the default), got ",
        options.comm_weight));
  }
  return absl::OkStatus();
}

absl::Status TooBig(int64_t g, int64_t blocks, int32_t n) {
  return absl::InvalidArgumentError(absl::StrCat(
      "ilp.granularity: ", g, " tokens gives ", blocks, " blocks x ", n, " ranks = ", blocks * n,
      " binary variables, above the ILP's limit of ", kMaxBinaryVars,
      "; raise the granularity or plan a smaller batch"));
}

// One rank: every document whole on it is the only plan.
absl::StatusOr<Plan> OneRankPlan(const Batch& batch, double weight, int64_t g, PlanInfo* info) {
  std::vector<Shard> pieces;
  for (size_t d = 0; d < batch.doc_lens.size(); ++d) {
    pieces.push_back(Shard{static_cast<int32_t>(d), 0, batch.doc_lens[d], 0});
  }
  Plan plan = FinishPlan(batch, std::move(pieces));
  FLASHCP_ASSIGN_OR_RETURN(const double objective, Objective(plan, weight));
  if (info != nullptr) {
    info->ilp_gap = 0.0;
    info->ilp_optimal = true;
    info->ilp_objective = objective;
    info->ilp_granularity = g;
  }
  return plan;
}

// Blocks: the grid, the Ring and Llama3 cut points (always), and the cut
// points of the best other strategy's plan (by the objective) whose cuts
// keep the model within the bound, so the ILP starts from, and is never
// worse than, every heuristic here. Every plan whose cuts are all block
// boundaries is a candidate incumbent: into `candidates`.
absl::StatusOr<std::vector<Block>> SeedBlocks(const Batch& batch, int64_t g, double weight,
                                              const StopToken& stop,
                                              std::vector<Plan>& candidates) {
  const int32_t n = batch.cp_size;
  candidates = {PlanRing(batch), PlanLlama3(batch)};
  std::vector<Block> blocks = MakeBlocks(batch, g, candidates);
  if (static_cast<int64_t>(blocks.size()) > kMaxBinaryVars / n) {
    return TooBig(g, static_cast<int64_t>(blocks.size()), n);
  }
  std::vector<std::pair<double, Plan>> others;
  for (Strategy s : AllStrategies()) {
    // magi is a comparison baseline, not a seed: the ILP's model stays as it was.
    if (s == Strategy::kIlp || s == Strategy::kRing || s == Strategy::kLlama3 ||
        s == Strategy::kMagi || s == Strategy::kBasp) {
      continue;
    }
    PlanOptions heuristic;
    heuristic.stop = stop;
    absl::StatusOr<Plan> p = MakePlan(s, batch, heuristic);
    FLASHCP_RETURN_IF_ERROR(stop.Check());
    FLASHCP_RETURN_IF_ERROR(p.status());  // a heuristic fails only on a bad batch
    FLASHCP_ASSIGN_OR_RETURN(const double obj, Objective(*p, weight));
    others.emplace_back(obj, *std::move(p));
  }
  std::stable_sort(others.begin(), others.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [obj, p] : others) {
    std::vector<Block> more = MakeBlocks(batch, g, {candidates[0], candidates[1], p});
    if (static_cast<int64_t>(more.size()) <= kMaxBinaryVars / n) {
      blocks = std::move(more);
      candidates.push_back(std::move(p));
      break;
    }
  }
  for (auto& [obj, p] : others) {
    if (!p.shards.empty()) candidates.push_back(std::move(p));  // representable or not
  }
  return blocks;
}

// The incumbent: the best representable candidate by its true objective,
// and its column vector (empty where none is representable).
struct Incumbent {
  std::optional<Plan> plan;
  double objective = std::numeric_limits<double>::infinity();
  std::vector<double> start;
};
absl::StatusOr<Incumbent> BestIncumbent(const Model& model, const std::vector<Plan>& candidates,
                                        double weight) {
  Incumbent best;
  for (const Plan& p : candidates) {
    std::optional<std::vector<int32_t>> owners = OwnersOf(p, model.blocks);
    if (!owners) continue;
    Canonicalize(model, *owners);
    FLASHCP_ASSIGN_OR_RETURN(const double obj, Objective(p, weight));
    if (obj < best.objective) {
      best.plan = p;
      best.objective = obj;
      best.start = SolutionOf(model, *owners);
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<Plan> Solve(const Batch& batch, const IlpOptions& options, const StopToken& stop,
                           PlanInfo* info) {
  FLASHCP_RETURN_IF_ERROR(CheckOptions(options));
  const int32_t n = batch.cp_size;
  const int64_t g = options.granularity > 0 ? options.granularity : DefaultGranularity(batch);
  const double weight = options.comm_weight > 0 ? options.comm_weight : DefaultCommWeight(batch);

  // Bound the model before allocating it: grid blocks alone, then exactly.
  int64_t grid_blocks = 0;
  for (int64_t len : batch.doc_lens) grid_blocks += (len + g - 1) / g;
  if (grid_blocks > kMaxBinaryVars / n) return TooBig(g, grid_blocks, n);
  if (n == 1) return OneRankPlan(batch, weight, g, info);

  std::vector<Plan> candidates;
  FLASHCP_ASSIGN_OR_RETURN(std::vector<Block> blocks,
                           SeedBlocks(batch, g, weight, stop, candidates));
  const double mean_work = TotalWorkload(batch) / n;
  const Model model = BuildModel(batch, std::move(blocks), mean_work, weight);
  FLASHCP_ASSIGN_OR_RETURN(Incumbent best, BestIncumbent(model, candidates, weight));
  FLASHCP_RETURN_IF_ERROR(stop.Check());
  FLASHCP_ASSIGN_OR_RETURN(
      const CbcResult solved,
      SolveWithCbc(model, best.start.empty() ? nullptr : &best.start, best.objective / mean_work,
                   options, stop));
  FLASHCP_RETURN_IF_ERROR(stop.Check());
  // CBC's proof covers the returned plan when CBC's solution is no worse than
  // the incumbent it was given (equal up to summation order when it is that
  // incumbent relabeled).
  const double start_obj = best.objective;
  bool optimal = false;
  if (solved.owners) {
    Plan plan = PlanOfOwners(batch, model, *solved.owners);
    if (absl::Status valid = ValidatePlan(plan); !valid.ok()) {
      return absl::InternalError(
          absl::StrCat("ilp: CBC's solution is not a valid plan: ", valid.message()));
    }
    FLASHCP_ASSIGN_OR_RETURN(const double obj, Objective(plan, weight));
    optimal = solved.proven_optimal && obj <= start_obj * (1 + 1e-12);
    if (obj < best.objective) {
      best.plan = std::move(plan);
      best.objective = obj;
    }
  }
  if (!best.plan) {
    return absl::DeadlineExceededError(absl::StrCat(
        "ilp: no feasible plan within ilp.time_limit_seconds = ", options.time_limit_seconds));
  }
  // Workload >= its mean on some rank, so 1 (in mean workloads) bounds any plan.
  const double obj_units = best.objective / mean_work;
  const double bound = std::max(1.0, solved.bound);
  if (info != nullptr) {
    info->ilp_optimal = optimal;
    info->ilp_gap = optimal ? 0.0 : std::max(0.0, (obj_units - bound) / obj_units);
    info->ilp_objective = best.objective;
    info->ilp_granularity = g;
  }
  return *std::move(best.plan);
}

}  // namespace flashcp::core::ilp
