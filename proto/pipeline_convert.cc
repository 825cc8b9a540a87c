#include "proto/pipeline_convert.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flashcp::proto {

absl::StatusOr<PipelineInput> PipelineRequestFromProto(const v1::PlanPipelineRequest& request,
                                                       const core::BatchLimits& limits) {
  PipelineInput in;
  in.batch_id = request.batch_id();
  core::PipelineRequest& r = in.request;
  if (request.doc_lens_size() > limits.max_docs) {
    return absl::ResourceExhaustedError(absl::StrCat("doc_lens: ", request.doc_lens_size(),
                                                     " documents, above this server's ",
                                                     limits.max_docs));
  }
  int64_t total = 0;
  for (int64_t len : request.doc_lens()) {
    if (len >= 1 && len <= limits.max_tokens) total += len;
    if (total > limits.max_tokens) {
      return absl::ResourceExhaustedError(
          absl::StrCat("doc_lens: more than this server's ", limits.max_tokens, " tokens"));
    }
  }
  r.doc_lens.assign(request.doc_lens().begin(), request.doc_lens().end());
  if (request.pp_size() != 0) r.pp_size = request.pp_size();
  if (request.sp_size() != 0) r.sp_size = request.sp_size();
  if (request.memory_budget_bytes() != 0) r.memory_budget_bytes = request.memory_budget_bytes();
  const v1::PipelineModelShape& m = request.model();
  if (m.layers() != 0) r.model.layers = m.layers();
  if (m.hidden() != 0) r.model.hidden = m.hidden();
  if (m.kv_hidden() != 0) r.model.kv_hidden = m.kv_hidden();
  if (m.ffn_hidden() != 0) r.model.ffn_hidden = m.ffn_hidden();
  if (m.vocab() != 0) r.model.vocab = m.vocab();
  if (m.bytes_per_element() != 0) r.model.bytes_per_element = m.bytes_per_element();
  const std::string profile =
      request.profile().empty() ? std::string(core::kDefaultPipelineProfile) : request.profile();
  absl::StatusOr<core::PipelineProfile> named = core::NamedPipelineProfile(profile);
  if (!named.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", named.status().message()));
  }
  r.profile = *named;
  const v1::PipelineCoefficients& c = request.coefficients();
  core::PipelineProfile& p = r.profile;
  const std::pair<double, double*> fields[] = {
      {c.fwd_pair_s(), &p.fwd_pair_s},
      {c.fwd_token_s(), &p.fwd_token_s},
      {c.fwd_chunk_s(), &p.fwd_chunk_s},
      {c.bwd_pair_s(), &p.bwd_pair_s},
      {c.bwd_token_s(), &p.bwd_token_s},
      {c.bwd_chunk_s(), &p.bwd_chunk_s},
      {c.a2a_bytes_per_s(), &p.a2a_bytes_per_s},
      {c.a2a_latency_s(), &p.a2a_latency_s},
      {c.p2p_bytes_per_s(), &p.p2p_bytes_per_s},
      {c.p2p_latency_s(), &p.p2p_latency_s},
      {c.act_token_bytes(), &p.act_token_bytes},
      {c.ckpt_token_bytes(), &p.ckpt_token_bytes},
      {c.kv_token_bytes(), &p.kv_token_bytes},
      {c.logits_token_bytes(), &p.logits_token_bytes},
      {c.state_bytes_per_param(), &p.state_bytes_per_param},
  };
  for (const auto& [v, dst] : fields) {
    if (v != 0) *dst = v;
  }
  if (!request.strategy().empty()) {
    absl::StatusOr<core::PipelineStrategy> s = core::ParsePipelineStrategy(request.strategy());
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("strategy: ", s.status().message()));
    in.options.strategy = *s;
  }
  in.options.slice_count = request.slice_count();
  return in;
}

v1::PipelinePlan PipelinePlanToProto(const core::PipelinePlan& plan, uint64_t batch_id,
                                     double planning_seconds) {
  v1::PipelinePlan out;
  out.set_batch_id(batch_id);
  out.set_strategy(std::string(core::PipelineStrategyName(plan.strategy)));
  for (const core::PipelineChunk& c : plan.chunks) {
    v1::PipelineChunk* pc = out.add_chunks();
    pc->set_kind(std::string(core::ChunkKindName(c.kind)));
    for (const core::PipelineSlice& s : c.slices) {
      v1::PipelineSlice* ps = pc->add_slices();
      ps->set_doc(s.doc);
      ps->set_start(s.start);
      ps->set_len(s.len);
    }
  }
  for (const core::PipelineGroup& g : plan.pipelines) {
    v1::PipelineOrder* o = out.add_pipelines();
    o->mutable_forward()->Add(g.forward.begin(), g.forward.end());
    o->mutable_backward()->Add(g.backward.begin(), g.backward.end());
  }
  for (const auto& stage : plan.ckpt) {
    out.add_ckpt()->mutable_layers()->Add(stage.begin(), stage.end());
  }
  out.set_slice_count(plan.slice_count);
  out.set_ckpt_solver(plan.ckpt_solver);
  out.set_ckpt_gap(plan.ckpt_gap);
  out.set_ckpt_optimal(plan.ckpt_optimal);
  v1::PipelinePrediction* p = out.mutable_prediction();
  p->set_iteration_s(plan.prediction.iteration_s);
  p->set_bubble_share(plan.prediction.bubble_share);
  p->set_recompute_s(plan.prediction.recompute_s);
  p->mutable_stage_peak_bytes()->Add(plan.prediction.stage_peak_bytes.begin(),
                                     plan.prediction.stage_peak_bytes.end());
  out.set_planning_seconds(planning_seconds);
  return out;
}

absl::StatusOr<core::PipelinePlan> PipelinePlanFromProto(const v1::PipelinePlan& plan) {
  core::PipelinePlan out;
  FLASHCP_ASSIGN_OR_RETURN(out.strategy, core::ParsePipelineStrategy(plan.strategy()));
  for (const v1::PipelineChunk& pc : plan.chunks()) {
    core::PipelineChunk c;
    bool known = false;
    for (core::ChunkKind k : {core::ChunkKind::kPacked, core::ChunkKind::kSplit,
                              core::ChunkKind::kHybrid, core::ChunkKind::kMixed}) {
      if (core::ChunkKindName(k) == pc.kind()) {
        c.kind = k;
        known = true;
      }
    }
    if (!known) return absl::InvalidArgumentError(absl::StrCat("chunks.kind: unknown ", pc.kind()));
    for (const v1::PipelineSlice& s : pc.slices()) c.slices.push_back({s.doc(), s.start(), s.len()});
    out.chunks.push_back(std::move(c));
  }
  for (const v1::PipelineOrder& o : plan.pipelines()) {
    out.pipelines.push_back({{o.forward().begin(), o.forward().end()},
                             {o.backward().begin(), o.backward().end()}});
  }
  for (const v1::StageCheckpoints& s : plan.ckpt()) out.ckpt.emplace_back(s.layers().begin(), s.layers().end());
  out.slice_count = plan.slice_count();
  out.ckpt_solver = plan.ckpt_solver();
  out.ckpt_gap = plan.ckpt_gap();
  out.ckpt_optimal = plan.ckpt_optimal();
  out.prediction.iteration_s = plan.prediction().iteration_s();
  out.prediction.bubble_share = plan.prediction().bubble_share();
  out.prediction.recompute_s = plan.prediction().recompute_s();
  out.prediction.stage_peak_bytes.assign(plan.prediction().stage_peak_bytes().begin(),
                                         plan.prediction().stage_peak_bytes().end());
  return out;
}

}  // namespace flashcp::proto
