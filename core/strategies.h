// Sharding strategies (SPEC "Strategies the paper compares"): each a pure
// function from a batch and options to a valid Plan.
#ifndef FLASHCP_CORE_STRATEGIES_H_
#define FLASHCP_CORE_STRATEGIES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/cost_model.h"
#include "core/types.h"

namespace flashcp::core {

// Ids of the strategies in the registry table (strategies.cc, one row each:
// name, description, planner, shard bound). Adding a strategy: its planner's
// file, an id here and its row in the table.
enum class Strategy {
  kLlama3 = 0,       // packed sequence in 2N chunks; chunks k and 2N-1-k to rank k
  kPerDoc = 1,       // every document in 2N chunks, same zigzag (WLB-LLM)
  kRing = 2,         // packed sequence in N contiguous chunks
  kZigzag = 3,       // every document in 2N chunks, zigzag (Ring-Attn zigzag sharding)
  kWholeDoc = 4,     // whole documents by workload, cut only to equalize tokens
  kFlashCpPaper = 5, // Algorithm 1 as the paper states it
  kFlashCp = 6,      // our planner (docs/planner.md); the default
  kIlp = 7,          // exact MILP at a fixed granularity (CBC), small batches only
  kMagi = 8,         // MagiAttention's default dispatch: equal chunks by min-heap on causal area
  kCsbp = 9,         // CSBP (Turbo-dLLM) under block diffusion; llama3's plan under the causal mask
  kBasp = 10,        // BASP: B equal documents, B | N, document i zigzagged on ranks [iK, (i+1)K)
};

// The strategy a caller gets without naming one (flashcp-plan, the service's
// empty PlanRequest.strategy).
inline constexpr Strategy kDefaultStrategy = Strategy::kFlashCp;

// Every strategy in id order. Ids are allocated per issue, so the list may
// skip one; index per-strategy tables by id below StrategyIdBound().
absl::Span<const Strategy> AllStrategies();
// One more than the largest id.
size_t StrategyIdBound();

// The registry row's name ("llama3", "per_doc", ...: the wire and command-line
// spelling) and one-line description.
absl::string_view StrategyName(Strategy strategy);
absl::string_view StrategyDescription(Strategy strategy);
// False for a strategy too slow for "every strategy" lists (the CLI's "all"):
// the ILP.
bool InAllList(Strategy strategy);
// Whether MakePlan plans `mask` with the strategy: every one under the
// causal mask; llama3, per_doc, zigzag, ring, csbp and flashcp under block
// diffusion.
bool PlansMask(Strategy strategy, const AttentionMask& mask);
// InvalidArgument "strategy: unknown strategy NAME (llama3, per_doc, ...)".
absl::StatusOr<Strategy> ParseStrategy(absl::string_view name);
// The names in id order, joined with ", ".
std::string StrategyNames();

// A cooperative stop for long plans: the planners ask it between steps
// (flashcp's candidates and fallbacks, the ILP's setup and CBC's nodes). Core
// reads no clock, so the caller decides (a cancelled call, a passed
// deadline). The predicate must be cheap, thread-compatible and monotone
// (once it says stop, it keeps saying so).
class StopToken {
 public:
  StopToken() = default;  // never stops
  explicit StopToken(std::function<absl::Status()> check) : check_(std::move(check)) {}
  // OK: go on. Otherwise the plan stops and MakePlan returns this status
  // (e.g. Cancelled, DeadlineExceeded).
  absl::Status Check() const { return check_ ? check_() : absl::OkStatus(); }

 private:
  std::function<absl::Status()> check_;
};

struct IlpOptions;
struct PlanInfo;
// The ILP planner MakePlan calls for Strategy::kIlp: core::ilp::Solve
// (core/ilp/ilp.h, the one target that links CBC).
using IlpSolver = absl::StatusOr<Plan> (*)(const Batch& batch, const IlpOptions& options,
                                           const StopToken& stop, PlanInfo* info);

struct IlpOptions {
  // Null: MakePlan(kIlp) is FailedPrecondition saying how to link the ILP.
  IlpSolver solver = nullptr;
  int64_t granularity = 0;        // tokens per block; 0 picks C / (16 N) rounded up
  double time_limit_seconds = 10; // CBC wall-clock limit
  double comm_weight = 0.0;       // objective: max workload + weight * max nonlast tokens; 0 picks a default
  // The whole call's time limit, on the caller's clock (core reads none):
  // seconds left, asked before CBC starts and at its events; at <= 0 CBC
  // stops and the best plan so far is returned. Null: time_limit_seconds
  // counts from CBC's start only (model setup not included).
  std::function<double()> seconds_left;
};

// What flashcp charges each cut shard shorter than min_shard_tokens (m) left
// in a plan, in non-last tokens per m: the score adds kSliverCostFactor * m
// per such shard, so one stays only where removing it costs more
// communication than that (docs/planner.md, "Scoring").
inline constexpr int64_t kSliverCostFactor = 8;

struct PlanOptions {
  double target_imbalance = 1.02;  // R for flashcp / flashcp_paper; >= 1
  // flashcp only: the minimum length m of a cut shard (a shard of a document
  // split into several). Best effort, not a guarantee: flashcp avoids cut
  // shards shorter than m and repairs those left (docs/planner.md, "Minimum
  // shard"), but ranks the imbalance target above it, so a plan may keep
  // such shards where no candidate meets the target, and where some do but
  // its repair, fallback and re-cut (heuristics, not an exact search) find no
  // plan without them that still meets it, or only one whose extra
  // communication outweighs them; the repair never takes a plan that meets
  // the target over it. The tests count such shards as needed (C/N < m, or a
  // workload bound showing that no plan without them meets the target: both
  // sufficient conditions), excused (the plan misses the target) or not shown
  // needed (all others; some of those are needed too, e.g. docs [476] at
  // N = 2, m = 128: docs/planner.md, "When a sliver is needed").
  // 128 = one query tile of the attention kernels (64-128 rows); 0 or 1
  // turns the rule off. 0 <= min_shard_tokens <= 2^40.
  int64_t min_shard_tokens = 128;
  // Topology: rank r is on node r / ranks_per_node (0: all N on one node).
  // flashcp's grouped cuts keep a document within one node where a node has
  // the ranks for it, and its last stage relabels ranks so that those
  // exchanging most share a node (not with rank speeds that differ); other
  // strategies ignore it. 0 <= ranks_per_node <= 65536.
  int32_t ranks_per_node = 0;
  IlpOptions ilp;
  // The rank cost the plan balances (core/cost_model.h; docs/planner.md,
  // "Cost model"). The pairs model (the default) is SPEC Eq. 3 and changes
  // nothing. Any other: whole_doc, flashcp_paper and flashcp plans are
  // re-cut (same pieces on the same ranks, cut points moved by the re-cut's
  // linear program) to lower the model's heaviest rank, kept only where it
  // falls; the other strategies' cuts are their definition and stay. Must
  // pass ValidateCostCoefficients.
  CostCoefficients cost;
  // Per-rank speeds (core::ValidateRankSpeeds; empty: all 1): rank r's cost
  // is rank_speed[r] times the model's, and the re-cut balances that. Only
  // with a cost model other than pairs.
  std::vector<double> rank_speed;
  // The mask the step trains with (core/mask.h). Block diffusion: the plan
  // covers the 2C-token [noisy ; clean] sequence (types.h, Plan); llama3,
  // per_doc, zigzag, ring, csbp and flashcp plan it, with the pairs cost
  // model only (docs/bdlm.md).
  AttentionMask attention_mask;
  StopToken stop;  // never stops by default
};

// Linearization rounds of the cost re-cut (internal::RecutPieces).
inline constexpr int32_t kCostRecutRounds = 8;

// Extra facts some strategies report (the ILP's optimality gap).
struct PlanInfo {
  double ilp_gap = 0.0;           // relative MIP gap at return; 0 when proven optimal
  bool ilp_optimal = false;
  double ilp_objective = 0.0;
  int64_t ilp_granularity = 0;
};

// Plans `batch` with `strategy`. InvalidArgument for a bad batch (ValidateBatch)
// or bad options (naming the field; cost.<field> for the cost model); options.stop's status once it says stop
// (asked before and after planning, and inside the long planners: flashcp,
// flashcp_paper's search is short); the returned plan always passes ValidatePlan.
absl::StatusOr<Plan> MakePlan(Strategy strategy, const Batch& batch,
                              const PlanOptions& options = {}, PlanInfo* info = nullptr);

// An upper bound on the shards MakePlan(strategy, batch, options) returns,
// from the batch alone, in O(documents), before planning (a service bounds
// its work with it). With n documents, N ranks, C tokens and
// P = sum_d min(len_d, 2N) (every document in at most 2N pieces):
//   ring: n + N - 1; llama3: n + 2N - 1 (each chunk boundary cuts one
//   document once); per_doc, zigzag: P; whole_doc: n + N - 1 (one cut per
//   rank boundary); magi: n + 16N - 1 (at most 16 chunks a rank, each
//   boundary cutting one document once); flashcp, flashcp_paper, ilp: P + N
//   (Per-Doc pieces of
//   some documents, Whole-Doc for the rest; the ILP returns one of the
//   others' plans or one at a coarser grid); every one at most C.
// Under the block-diffusion `mask` (the plan covers both copies): twice the
// bound above plus 2N (token moves between copies), at most 2C.
// `batch` must pass ValidateBatch.
int64_t MaxPlanShards(Strategy strategy, const Batch& batch, const AttentionMask& mask = {});

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_STRATEGIES_H_
