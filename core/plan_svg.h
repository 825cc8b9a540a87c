// A plan drawn as SVG: one row per rank along its local tokens (C/N wide),
// each shard a rectangle coloured by its document, the shards whose KV some
// other rank receives under the targeted exchange (SPEC "Targeted exchange,
// per phase") hatched and outlined, each rank's workload (Eq. 3) beside its
// row. Several plans of one batch (e.g. two strategies) are drawn side by
// side, left to right. Pure: it returns the document as a string.
//
// The output is deterministic for given panels, and its structure is part of
// the contract (tests and tools read it):
//  - each panel is <g class="panel" data-title="...">, each rank's row in it
//    <g class="rank" data-rank="r">, with one <rect class="shard"> per shard
//    in the rank's token order (class "shard kv-moves" for a shard whose KV
//    travels, followed by its <rect class="hatch">), a <rect class="padding">
//    on a rank holding a padding token, and one <text class="workload">;
//  - a shard's rect carries data-doc, data-start and data-len (tokens) and a
//    <title> naming the ranks its KV goes to.
#ifndef FLASHCP_CORE_PLAN_SVG_H_
#define FLASHCP_CORE_PLAN_SVG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/types.h"

namespace flashcp::core {

// One drawing: a plan and the title above it (e.g. the strategy's name).
struct PlanPanel {
  std::string title;
  Plan plan;
};

// The panels side by side in one SVG document. InvalidArgument for no
// panels, a plan that fails ValidatePlan (the message names the panel), or
// panels of different batches (doc_lens or cp_size differ): colours and
// rows must mean the same thing in every panel.
absl::StatusOr<std::string> PlansToSvg(const std::vector<PlanPanel>& panels);

// The label beside a rank's row: its workload in (query, key) pairs and
// relative to the mean over ranks, e.g. "1.074e+09 pairs, 1.003 x mean".
std::string WorkloadLabel(double workload, double mean_workload);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_PLAN_SVG_H_
