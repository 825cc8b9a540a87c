#include "proto/global_batch_convert.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashcp::proto {
namespace {

absl::Status Unsupported(absl::string_view field) {
  return absl::InvalidArgumentError(absl::StrCat(
      "plan.", field, ": not supported by PlanGlobalBatch; leave it unset"));
}

}  // namespace

absl::StatusOr<GlobalBatchInput> GlobalBatchRequestFromProto(
    const v1::PlanGlobalBatchRequest& request, const core::BatchLimits& limits,
    const CostResolver& resolve) {
  const v1::PlanRequest& plan = request.plan();
  if (!plan.doc_lens().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan.doc_lens: ", plan.doc_lens_size(),
        " documents; must be empty (the global batch's documents go in doc_lens)"));
  }
  if (plan.include_layout()) return Unsupported("include_layout");
  if (plan.choose_schemes()) return Unsupported("choose_schemes");
  if (plan.choose_by_step_time()) return Unsupported("choose_by_step_time");
  if (!plan.cluster().empty()) return Unsupported("cluster");
  if (plan.has_cluster_spec()) return Unsupported("cluster_spec");
  if (request.dp_size() < 1 || request.dp_size() > kMaxGlobalBatchReplicas) {
    return absl::InvalidArgumentError(absl::StrCat("dp_size: ", request.dp_size(),
                                                   "; must be in [1, ",
                                                   kMaxGlobalBatchReplicas, "]"));
  }
  if (request.doc_lens().empty()) {
    return absl::InvalidArgumentError("doc_lens: no documents");
  }
  if (request.doc_lens_size() > limits.max_docs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "doc_lens: ", request.doc_lens_size(), " documents, above this server's --max_docs (",
        limits.max_docs, ")"));
  }
  for (int i = 0; i < request.doc_lens_size(); ++i) {
    if (request.doc_lens(i) < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "doc_lens[", i, "]: ", request.doc_lens(i), "; every length must be >= 1"));
    }
  }
  if (request.context() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("context: ", request.context(), "; must be >= 1"));
  }
  if (request.context() > limits.max_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "context: ", request.context(), " tokens, above this server's --max_tokens (",
        limits.max_tokens, ")"));
  }
  if (plan.cp_size() >= 1 && request.context() < plan.cp_size()) {
    return absl::InvalidArgumentError(absl::StrCat("context: ", request.context(),
                                                   " tokens; must be at least plan.cp_size (",
                                                   plan.cp_size(), ")"));
  }
  // The replicas' options validated once, as Plan validates them, on a
  // placeholder batch of one context-long document.
  v1::PlanRequest replica = plan;
  replica.set_batch_id(request.batch_id());
  replica.add_doc_lens(request.context());
  absl::StatusOr<PlanInput> in = RequestFromProto(replica, limits, resolve);
  if (!in.ok()) {
    return absl::Status(in.status().code(), absl::StrCat("plan.", in.status().message()));
  }
  GlobalBatchInput out;
  out.batch_id = request.batch_id();
  out.doc_lens.assign(request.doc_lens().begin(), request.doc_lens().end());
  out.dp_size = request.dp_size();
  out.context = request.context();
  out.replica = *std::move(in);
  return out;
}

v1::PlanGlobalBatchRequest GlobalBatchRequestToProto(uint64_t batch_id,
                                                     const std::vector<int64_t>& doc_lens,
                                                     int32_t dp_size, int64_t context,
                                                     v1::PlanRequest plan) {
  v1::PlanGlobalBatchRequest out;
  out.set_batch_id(batch_id);
  out.mutable_doc_lens()->Add(doc_lens.begin(), doc_lens.end());
  out.set_dp_size(dp_size);
  out.set_context(context);
  plan.clear_doc_lens();
  plan.clear_batch_id();
  *out.mutable_plan() = std::move(plan);
  return out;
}

absl::StatusOr<core::GlobalBatchPlan> GlobalBatchPlanFromProto(const v1::GlobalBatchPlan& plan) {
  if (plan.piece_doc_size() != plan.piece_lens_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "piece_doc: ", plan.piece_doc_size(), " entries; piece_lens has ",
        plan.piece_lens_size()));
  }
  core::GlobalBatchPlan out;
  out.pieces.lens.assign(plan.piece_lens().begin(), plan.piece_lens().end());
  out.pieces.doc.assign(plan.piece_doc().begin(), plan.piece_doc().end());
  for (int r = 0; r < plan.replicas_size(); ++r) {
    const v1::GlobalBatchReplica& in = plan.replicas(r);
    core::ReplicaBatch rb;
    rb.pieces.assign(in.pieces().begin(), in.pieces().end());
    rb.doc_lens.assign(in.doc_lens().begin(), in.doc_lens().end());
    bool match = rb.pieces.size() == rb.doc_lens.size();
    for (size_t i = 0; match && i < rb.pieces.size(); ++i) {
      const int32_t p = rb.pieces[i];
      match = p >= 0 && p < plan.piece_lens_size() && plan.piece_lens(p) == rb.doc_lens[i];
    }
    if (!match) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replicas[", r, "].doc_lens: not the lengths of its pieces (indices into piece_lens)"));
    }
    rb.workload = in.workload();
    absl::StatusOr<PlanResult> result = ResponseFromProto(in.plan());
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat("replicas[", r, "].plan: ",
                                                               result.status().message()));
    }
    rb.plan = std::move(result->plan);
    out.replicas.push_back(std::move(rb));
  }
  out.imbalance = plan.imbalance();
  out.first_fit_imbalance = plan.first_fit_imbalance();
  return out;
}

}  // namespace flashcp::proto
