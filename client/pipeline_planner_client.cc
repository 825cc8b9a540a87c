#include "client/pipeline_planner_client.h"

#include <chrono>
#include <string>

#include "absl/time/time.h"
#include "proto/pipeline_convert.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::client {

absl::StatusOr<v1::PipelinePlan> PipelinePlannerClient::PlanPipeline(
    const v1::PlanPipelineRequest& request, const CallOptions& options) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.timeout));
  context.set_wait_for_ready(options.wait_for_ready);
  v1::PipelinePlan plan;
  const grpc::Status s = stub_->PlanPipeline(&context, request, &plan);
  if (!s.ok()) return proto::rpc::FromGrpcStatus(s);
  return plan;
}

absl::StatusOr<core::PipelinePlan> PipelinePlannerClient::PlanPipeline(
    const core::PipelineRequest& request, core::PipelineStrategy strategy,
    const CallOptions& options) const {
  v1::PlanPipelineRequest r;
  r.mutable_doc_lens()->Add(request.doc_lens.begin(), request.doc_lens.end());
  r.set_pp_size(request.pp_size);
  r.set_sp_size(request.sp_size);
  r.set_memory_budget_bytes(request.memory_budget_bytes);
  v1::PipelineModelShape* m = r.mutable_model();
  m->set_layers(request.model.layers);
  m->set_hidden(request.model.hidden);
  m->set_kv_hidden(request.model.kv_hidden);
  m->set_ffn_hidden(request.model.ffn_hidden);
  m->set_vocab(request.model.vocab);
  m->set_bytes_per_element(request.model.bytes_per_element);
  const core::PipelineProfile& p = request.profile;
  v1::PipelineCoefficients* c = r.mutable_coefficients();
  c->set_fwd_pair_s(p.fwd_pair_s);
  c->set_fwd_token_s(p.fwd_token_s);
  c->set_fwd_chunk_s(p.fwd_chunk_s);
  c->set_bwd_pair_s(p.bwd_pair_s);
  c->set_bwd_token_s(p.bwd_token_s);
  c->set_bwd_chunk_s(p.bwd_chunk_s);
  c->set_a2a_bytes_per_s(p.a2a_bytes_per_s);
  c->set_a2a_latency_s(p.a2a_latency_s);
  c->set_p2p_bytes_per_s(p.p2p_bytes_per_s);
  c->set_p2p_latency_s(p.p2p_latency_s);
  c->set_act_token_bytes(p.act_token_bytes);
  c->set_ckpt_token_bytes(p.ckpt_token_bytes);
  c->set_kv_token_bytes(p.kv_token_bytes);
  c->set_logits_token_bytes(p.logits_token_bytes);
  c->set_state_bytes_per_param(p.state_bytes_per_param);
  r.set_strategy(std::string(core::PipelineStrategyName(strategy)));
  absl::StatusOr<v1::PipelinePlan> plan = PlanPipeline(r, options);
  if (!plan.ok()) return plan.status();
  return proto::PipelinePlanFromProto(*plan);
}

}  // namespace flashcp::client
