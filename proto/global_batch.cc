#include "proto/global_batch.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/analysis.h"
#include "core/cost_model.h"
#include "core/global_batch.h"
#include "core/status_macros.h"
#include "core/strategies.h"

namespace flashcp::proto {

absl::StatusOr<int64_t> CheckGlobalBatchBounds(const GlobalBatchInput& input,
                                               const PlanBounds& bounds) {
  const int64_t bytes = MaxGlobalBatchResponseBytes(input);
  if (bytes > bounds.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "dp_size: ", input.dp_size, " replicas x cp_size ", input.replica.batch.cp_size, " x ",
        input.doc_lens.size(), " documents (context ", input.context,
        ") may make an answer of up to ", bytes, " bytes, above --max_response_bytes = ",
        bounds.max_response_bytes, "; plan fewer replicas or documents, or a longer context"));
  }
  return bytes;
}

absl::StatusOr<v1::GlobalBatchPlan> PlanGlobalBatchRequest(const GlobalBatchInput& input,
                                                           const core::Clock& clock) {
  const absl::Time start = clock.Now();
  const PlanInput& r = input.replica;
  core::GlobalBatchOptions options;
  options.dp_size = input.dp_size;
  options.cp_size = r.batch.cp_size;
  options.context = input.context;
  options.strategy = r.strategy;
  options.plan = r.options;
  FLASHCP_ASSIGN_OR_RETURN(core::GlobalBatchPlan g,
                           core::PlanGlobalBatch(input.doc_lens, options));
  v1::GlobalBatchPlan out;
  out.set_batch_id(input.batch_id);
  out.mutable_piece_lens()->Add(g.pieces.lens.begin(), g.pieces.lens.end());
  out.mutable_piece_doc()->Add(g.pieces.doc.begin(), g.pieces.doc.end());
  for (size_t i = 0; i < g.replicas.size(); ++i) {
    FLASHCP_RETURN_IF_ERROR(r.options.stop.Check());
    const core::ReplicaBatch& rb = g.replicas[i];
    absl::StatusOr<core::PlanMetrics> metrics =
        core::AnalyzePlan(rb.plan, r.shape, r.options.ranks_per_node);
    if (!metrics.ok()) {
      return absl::Status(metrics.status().code(),
                          absl::StrCat("replica ", i, ": ", metrics.status().message()));
    }
    const core::PlanCostReport cost{r.cost_profile, r.options.cost, r.cost_calibrated,
                                    core::PredictPlanCost(r.options.cost, rb.plan,
                                                          r.options.rank_speed)};
    v1::GlobalBatchReplica* o = out.add_replicas();
    o->mutable_pieces()->Add(rb.pieces.begin(), rb.pieces.end());
    o->mutable_doc_lens()->Add(rb.doc_lens.begin(), rb.doc_lens.end());
    o->set_workload(rb.workload);
    *o->mutable_plan() = ResponseToProto(input.batch_id, r.strategy, rb.plan, *metrics,
                                         /*layout=*/nullptr, /*planning_seconds=*/0.0,
                                         /*ilp=*/nullptr, &cost);
  }
  out.set_imbalance(g.imbalance);
  out.set_first_fit_imbalance(g.first_fit_imbalance);
  out.set_planning_seconds(absl::ToDoubleSeconds(clock.Now() - start));
  return out;
}

}  // namespace flashcp::proto
