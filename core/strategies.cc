#include "core/strategies.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/analysis.h"
#include "core/echo.h"
#include "core/cost_model.h"
#include "core/mask.h"
#include "core/internal/bdlm.h"
#include "core/internal/recut.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core {

namespace {

using PlanFn = absl::StatusOr<Plan> (*)(const Batch& batch, const PlanOptions& options,
                                        PlanInfo* info);
// The bound MaxPlanShards states for the strategy, from n documents, N ranks
// and P = sum_d min(len_d, 2N).
using ShardBoundFn = int64_t (*)(int64_t n, int64_t ranks, int64_t per_doc);

// What MakePlan does with a strategy's plan for a cost model other than pairs
// (PlanOptions::cost): re-cut it (BalanceOnCost) or keep its cuts.
enum class CostRecut {
  kNever,     // the cuts are the strategy's definition (equal chunks, zigzags)
  kAnyPiece,  // cut points chosen by balance; re-cut pieces keep >= 1 token
  kMinShard,  // the same, keeping PlanOptions::min_shard_tokens (flashcp's rule)
};

struct StrategyRow {
  Strategy id;
  absl::string_view name;
  absl::string_view description;
  bool in_all;
  CostRecut cost_recut;
  PlanFn plan;
  ShardBoundFn max_shards;
};

// The registry: one row per strategy, in id order (checked below).
constexpr StrategyRow kStrategyTable[] = {
    {Strategy::kLlama3, "llama3",
     "Llama3 CP: the packed sequence in 2N chunks, chunks k and 2N-1-k to rank k", true, CostRecut::kNever,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanLlama3(b);
     },
     // Each chunk boundary cuts one document once.
     [](int64_t n, int64_t ranks, int64_t) { return n + 2 * ranks - 1; }},
    {Strategy::kPerDoc, "per_doc", "Per-Doc CP (WLB-LLM): every document in 2N chunks, zigzag",
     true, CostRecut::kNever,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanPerDoc(b);
     },
     [](int64_t, int64_t, int64_t per_doc) { return per_doc; }},
    {Strategy::kRing, "ring", "Ring-Attn: the packed sequence in N contiguous chunks", true,
     CostRecut::kNever,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanRing(b);
     },
     [](int64_t n, int64_t ranks, int64_t) { return n + ranks - 1; }},
    {Strategy::kZigzag, "zigzag", "Ring-Attn zigzag: every document in 2N chunks, zigzag", true,
     CostRecut::kNever,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanPerDoc(b);  // the same sharding as per_doc
     },
     [](int64_t, int64_t, int64_t per_doc) { return per_doc; }},
    {Strategy::kWholeDoc, "whole_doc",
     "Whole-Doc: documents kept whole, placed by workload, cut only to equalize tokens", true,
     CostRecut::kAnyPiece,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanWholeDoc(b);
     },
     // One cut per rank boundary.
     [](int64_t n, int64_t ranks, int64_t) { return n + ranks - 1; }},
    {Strategy::kFlashCpPaper, "flashcp_paper",
     "FlashCP as the paper's Algorithm 1 states it, to target_imbalance", true,
     CostRecut::kAnyPiece,
     [](const Batch& b, const PlanOptions& o, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanFlashCpPaper(b, o.target_imbalance);
     },
     // Per-Doc pieces of some documents, Whole-Doc for the rest.
     [](int64_t, int64_t ranks, int64_t per_doc) { return per_doc + ranks; }},
    {Strategy::kFlashCp, "flashcp",
     "FlashCP: Whole-Doc plus Per-Doc for the documents that stop balance, to "
     "target_imbalance",
     true, CostRecut::kMinShard,
     [](const Batch& b, const PlanOptions& o, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanFlashCp(b, o);
     },
     [](int64_t, int64_t ranks, int64_t per_doc) { return per_doc + ranks; }},
    {Strategy::kIlp, "ilp", "Exact MILP at a fixed granularity (CBC); small batches only",
     /*in_all=*/false,  // slow
     CostRecut::kNever,
     [](const Batch& b, const PlanOptions& o, PlanInfo* info) -> absl::StatusOr<Plan> {
       if (o.ilp.solver == nullptr) {
         return absl::FailedPreconditionError(
             "strategy: ilp needs the ILP solver: build with FLASHCP_BUILD_ILP, link flashcp_ilp "
             "(core/ilp/ilp.h) and set PlanOptions.ilp.solver = core::ilp::Solve");
       }
       return o.ilp.solver(b, o.ilp, o.stop, info);
     },
     // One of the others' plans or one at a coarser grid.
     [](int64_t, int64_t ranks, int64_t per_doc) { return per_doc + ranks; }},
    {Strategy::kMagi, "magi",
     "MagiAttention's default dispatch: the packed sequence in chunks of ceil(C / 8N), "
     "dealt by a min-heap on causal area, equal chunks per rank",
     true, CostRecut::kNever,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanMagi(b);
     },
     // At most 16 chunks a rank (the chunk is at least half of ceil(C/8N));
     // each chunk boundary splits at most one document.
     [](int64_t n, int64_t ranks, int64_t) { return n + 16 * ranks - 1; }},
    {Strategy::kCsbp, "csbp",
     "CSBP (Turbo-dLLM) for block diffusion: noisy blocks dual-end paired, the clean copy in "
     "2N chunks; under the causal mask its clean layout alone, llama3's plan",
     /*in_all=*/false,  // under the causal mask a copy of llama3
     CostRecut::kNever,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanLlama3(b);  // block diffusion: internal::PlanCsbp (MakePlan)
     },
     [](int64_t n, int64_t ranks, int64_t) { return n + 2 * ranks - 1; }},
    {Strategy::kBasp, "basp",
     "BASP: B equal-length documents, B | N, document i zigzagged in 2K chunks on ranks "
     "[iK, (i+1)K), K = N / B; any other batch is refused",
     /*in_all=*/false,  // refuses most batches
     CostRecut::kNever,
     [](const Batch& b, const PlanOptions&, PlanInfo*) -> absl::StatusOr<Plan> {
       return internal::PlanBasp(b);
     },
     // Each document in at most 2K <= 2N pieces.
     [](int64_t, int64_t, int64_t per_doc) { return per_doc; }},
};
constexpr size_t kNumStrategies = std::size(kStrategyTable);

constexpr bool TableInIdOrder() {
  for (size_t i = 1; i < kNumStrategies; ++i) {
    if (kStrategyTable[i - 1].id >= kStrategyTable[i].id) return false;
  }
  return true;
}
static_assert(TableInIdOrder(), "kStrategyTable: rows by id ascending");
constexpr size_t kIdBound = static_cast<size_t>(kStrategyTable[kNumStrategies - 1].id) + 1;

constexpr std::array<Strategy, kNumStrategies> kIds = [] {
  std::array<Strategy, kNumStrategies> ids{};
  for (size_t i = 0; i < kNumStrategies; ++i) ids[i] = kStrategyTable[i].id;
  return ids;
}();

// The row of `strategy`; an id outside the table (a cast from a bad
// integer) is a programming error, caught here rather than read past the end.
const StrategyRow* Row(Strategy strategy) {
  for (const StrategyRow& row : kStrategyTable) {
    if (row.id == strategy) return &row;
  }
  return nullptr;
}

// Re-cuts `plan` (internal::RecutPieces: same pieces, ranks and order, cut
// points moved) so that the cost model's heaviest rank is as light as the
// program finds; keeps `plan` unless that lowers the model's maximum.
Plan BalanceOnCost(CostRecut recut, const Batch& batch, Plan plan, const PlanOptions& options) {
  const CostPrediction before = PredictPlanCost(options.cost, plan, options.rank_speed);
  const double max_before = *std::max_element(before.rank_cost.begin(), before.rank_cost.end());
  // The re-cut keeps every piece of a cut document at >= keep + 1 tokens:
  // the minimum shard (kMinShard) where the plan has none shorter (so it
  // makes no new sliver), 1 for the strategies without the rule.
  int64_t shortest = std::numeric_limits<int64_t>::max();
  {
    std::vector<int32_t> pieces_of(batch.doc_lens.size(), 0);
    for (const Shard& s : plan.shards) ++pieces_of[s.doc];
    for (const Shard& s : plan.shards) {
      if (pieces_of[s.doc] > 1) shortest = std::min(shortest, s.len);
    }
  }
  const int64_t rule = recut == CostRecut::kMinShard ? options.min_shard_tokens : 1;
  const int64_t keep = std::max<int64_t>(1, std::min(rule, shortest - 1));
  std::vector<Shard> pieces = plan.shards;
  if (!internal::RecutPieces(batch, pieces, keep, kCostRecutRounds,
                             max_before, options.cost, options.rank_speed)
           .has_value()) {
    return plan;
  }
  return internal::FinishPlan(batch, std::move(pieces));
}

}  // namespace

absl::Span<const Strategy> AllStrategies() { return kIds; }

size_t StrategyIdBound() { return kIdBound; }

absl::string_view StrategyName(Strategy strategy) {
  const StrategyRow* row = Row(strategy);
  return row != nullptr ? row->name : "unknown";
}

absl::string_view StrategyDescription(Strategy strategy) {
  const StrategyRow* row = Row(strategy);
  return row != nullptr ? row->description : "";
}

bool InAllList(Strategy strategy) {
  const StrategyRow* row = Row(strategy);
  return row != nullptr && row->in_all;
}

std::string StrategyNames() {
  std::vector<absl::string_view> names;
  for (const StrategyRow& row : kStrategyTable) names.push_back(row.name);
  return absl::StrJoin(names, ", ");
}

bool PlansMask(Strategy strategy, const AttentionMask& mask) {
  if (!IsBlockDiffusion(mask)) return true;
  switch (strategy) {
    case Strategy::kLlama3:
    case Strategy::kPerDoc:
    case Strategy::kZigzag:
    case Strategy::kRing:
    case Strategy::kCsbp:
    case Strategy::kFlashCp:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<Strategy> ParseStrategy(absl::string_view name) {
  for (const StrategyRow& row : kStrategyTable) {
    if (row.name == name) return row.id;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("strategy: unknown strategy ", Echo(name), " (", StrategyNames(), ")"));
}

absl::StatusOr<Plan> MakePlan(Strategy strategy, const Batch& batch, const PlanOptions& options,
                              PlanInfo* info) {
  FLASHCP_RETURN_IF_ERROR(ValidateBatch(batch));
  if (!(options.target_imbalance >= 1.0) || !std::isfinite(options.target_imbalance)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_imbalance: must be a finite ratio >= 1, got ", options.target_imbalance));
  }
  if (options.min_shard_tokens < 0 || options.min_shard_tokens > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_shard_tokens: must be in [0, 2^40], got ", options.min_shard_tokens));
  }
  FLASHCP_RETURN_IF_ERROR(ValidateRanksPerNode(options.ranks_per_node));
  if (absl::Status s = ValidateCostCoefficients(options.cost); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cost.", s.message()));
  }
  FLASHCP_RETURN_IF_ERROR(ValidateRankSpeeds(options.rank_speed, batch.cp_size, options.cost));
  FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  const StrategyRow* row = Row(strategy);
  if (row == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy: unknown strategy id ", static_cast<int>(strategy)));
  }
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionMask(options.attention_mask));
  if (IsBlockDiffusion(options.attention_mask)) {
    if (!IsPairsModel(options.cost)) {
      return absl::InvalidArgumentError(
          "cost: only the pairs model with attention_mask block_diffusion");
    }
    absl::StatusOr<Plan> plan = internal::PlanBlockDiffusion(strategy, batch, options);
    if (plan.ok()) FLASHCP_RETURN_IF_ERROR(options.stop.Check());
    return plan;
  }
  absl::StatusOr<Plan> plan = row->plan(batch, options, info);
  if (plan.ok() && row->cost_recut != CostRecut::kNever && !IsPairsModel(options.cost)) {
    FLASHCP_RETURN_IF_ERROR(options.stop.Check());
    plan = BalanceOnCost(row->cost_recut, batch, *std::move(plan), options);
  }
  // A stop that came while a short planner ran: the caller no longer wants it.
  if (plan.ok()) FLASHCP_RETURN_IF_ERROR(options.stop.Check());
  return plan;
}

int64_t MaxPlanShards(Strategy strategy, const Batch& batch, const AttentionMask& mask) {
  if (IsBlockDiffusion(mask)) {
    return std::min(2 * MaxPlanShards(strategy, batch) + 2 * int64_t{batch.cp_size},
                    2 * TotalTokens(batch.doc_lens));
  }
  const int64_t n = static_cast<int64_t>(batch.doc_lens.size());
  const int64_t ranks = batch.cp_size;
  int64_t per_doc = 0;  // P
  for (int64_t len : batch.doc_lens) per_doc += std::min(len, 2 * ranks);
  const StrategyRow* row = Row(strategy);
  const int64_t bound = row != nullptr ? row->max_shards(n, ranks, per_doc) : per_doc + ranks;
  return std::min(bound, TotalTokens(batch.doc_lens));
}

}  // namespace flashcp::core
