#include "proto/convert.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/plan_hash.h"
#include "core/mask.h"
#include "core/status_macros.h"

namespace flashcp::proto {
namespace {

// google.rpc.Code's error range; 0 (OK) is not an error.
constexpr int kMinErrorCode = 1;
constexpr int kMaxErrorCode = 16;

void SchemeBytesToProto(core::CommScheme scheme, const core::SchemeBytes& bytes,
                        v1::SchemeBytes* out) {
  out->set_scheme(std::string(core::CommSchemeName(scheme)));
  out->mutable_sent_bytes()->Add(bytes.sent.begin(), bytes.sent.end());
  out->mutable_received_bytes()->Add(bytes.received.begin(), bytes.received.end());
  out->set_bottleneck_bytes(bytes.bottleneck);
  const core::PhaseTraffic& phase = bytes.phase;
  out->mutable_phase_sent_tokens()->Add(phase.sent_tokens.begin(), phase.sent_tokens.end());
  out->mutable_phase_received_tokens()->Add(phase.received_tokens.begin(),
                                            phase.received_tokens.end());
  out->set_phase_max_sent_tokens(phase.max_sent_tokens);
  out->set_phase_max_received_tokens(phase.max_received_tokens);
  out->set_phase_bottleneck_tokens(phase.bottleneck_tokens);
  out->set_phase_max_sent_bytes(phase.max_sent_bytes);
  out->set_phase_max_received_bytes(phase.max_received_bytes);
  out->set_phase_bottleneck_bytes(phase.bottleneck_bytes);
  out->set_phase_intra_node_bytes(phase.intra_node_bytes);
  out->set_phase_inter_node_bytes(phase.inter_node_bytes);
  out->mutable_phase_inter_node_sent_bytes()->Add(phase.inter_node_sent_bytes.begin(),
                                                  phase.inter_node_sent_bytes.end());
  out->mutable_phase_inter_node_received_bytes()->Add(phase.inter_node_received_bytes.begin(),
                                                      phase.inter_node_received_bytes.end());
  out->set_phase_max_intra_node_bytes(phase.max_intra_node_bytes);
  out->set_phase_max_inter_node_bytes(phase.max_inter_node_bytes);
  out->mutable_phase_clean_received_tokens()->Add(phase.clean_received_tokens.begin(),
                                                  phase.clean_received_tokens.end());
  out->mutable_phase_noisy_received_tokens()->Add(phase.noisy_received_tokens.begin(),
                                                  phase.noisy_received_tokens.end());
  out->set_phase_max_clean_received_bytes(phase.max_clean_received_bytes);
  out->set_phase_max_noisy_received_bytes(phase.max_noisy_received_bytes);
}

void MetricsToProto(const core::PlanMetrics& m, double planning_seconds, v1::PlanMetrics* out) {
  out->set_imbalance_ratio(m.imbalance);
  out->set_comm_saving_ratio(m.comm_saving);
  out->set_targeted_saving_ratio(m.targeted_saving);
  out->set_tokens_per_rank(m.tokens_per_rank);
  out->mutable_rank_tokens()->Add(m.rank_tokens.begin(), m.rank_tokens.end());
  out->mutable_rank_workload()->Add(m.rank_workload.begin(), m.rank_workload.end());
  out->mutable_rank_nonlast_tokens()->Add(m.rank_nonlast_tokens.begin(),
                                          m.rank_nonlast_tokens.end());
  out->mutable_rank_segments()->Add(m.rank_segments.begin(), m.rank_segments.end());
  out->set_cut_docs(m.cut_docs);
  out->set_min_cut_shard_len(m.min_cut_shard_len);
  for (core::CommScheme scheme : core::kAllCommSchemes) {
    SchemeBytesToProto(scheme, m.bytes[static_cast<int>(scheme)], out->add_bytes());
  }
  out->set_planning_seconds(planning_seconds);
  out->set_cheaper_scheme(std::string(core::CommSchemeName(m.cheaper_scheme)));
  out->set_all_to_all_inapplicable(m.all_to_all_inapplicable);
  out->set_all_to_all_replicated_kv_heads(m.all_to_all_replicated_kv_heads);
  out->mutable_rank_noisy_tokens()->Add(m.rank_noisy_tokens.begin(), m.rank_noisy_tokens.end());
  out->set_cut_noisy_blocks(m.cut_noisy_blocks);
}

void LayoutToProto(const core::CommLayout& layout,
                   google::protobuf::RepeatedPtrField<v1::RankLayout>* out) {
  for (size_t r = 0; r < layout.ranks.size(); ++r) {
    const core::RankLayout& rank = layout.ranks[r];
    v1::RankLayout* p = out->Add();
    p->set_rank(static_cast<int32_t>(r));
    p->mutable_shards()->Add(rank.shards.begin(), rank.shards.end());
    for (const core::SendRange& send : rank.send) {
      v1::SendRange* s = p->add_sends();
      s->set_shard(send.shard);
      s->set_offset(send.offset);
      s->set_len(send.len);
      s->set_skip(send.skip);
    }
    p->set_send_tokens(rank.send_tokens);
    for (const core::TargetedSend& t : rank.targeted) {
      v1::TargetedSend* ts = p->add_targeted();
      ts->set_dest(t.dest);
      ts->mutable_send_indices()->Add(t.send_indices.begin(), t.send_indices.end());
      ts->set_tokens(t.tokens);
    }
  }
}

// The step-time options of a request; nullopt when it names no cluster.
absl::StatusOr<std::optional<core::StepTimeOptions>> StepTimeFromRequest(
    const v1::PlanRequest& request, int32_t ranks_per_node, const core::ModelShape& shape) {
  if (request.cluster().empty() && !request.has_cluster_spec()) {
    if (request.layers() != 0 || request.include_rank_step_times()) {
      return absl::InvalidArgumentError(
          "cluster: layers and include_rank_step_times need a cluster (cluster or cluster_spec)");
    }
    return std::nullopt;
  }
  core::StepTimeOptions o;
  if (static_cast<int64_t>(request.cluster().size()) > kMaxCostProfileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cluster: at most ", kMaxCostProfileBytes,
                                                   " bytes, got ", request.cluster().size()));
  }
  if (!request.cluster().empty()) {
    absl::StatusOr<core::ClusterSpec> preset = core::ClusterPreset(request.cluster());
    if (!preset.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cluster: ", preset.status().message()));
    }
    o.cluster = *preset;
    o.cluster_name = request.cluster();
  }
  const v1::ClusterSpec& spec = request.cluster_spec();
  core::ClusterSpec& c = o.cluster;
  if (spec.has_nvlink_bytes_per_second()) c.nvlink_bytes_per_second = spec.nvlink_bytes_per_second();
  if (spec.has_nvlink_latency_seconds()) c.nvlink_latency_seconds = spec.nvlink_latency_seconds();
  if (spec.has_nic_bytes_per_second()) c.nic_bytes_per_second = spec.nic_bytes_per_second();
  if (spec.has_nic_latency_seconds()) c.nic_latency_seconds = spec.nic_latency_seconds();
  if (spec.has_compute()) c.compute = CostFromProto(spec.compute());
  if (spec.has_profile_query_heads()) c.profile_query_heads = spec.profile_query_heads();
  if (spec.has_profile_head_dim()) c.profile_head_dim = spec.profile_head_dim();
  if (spec.has_compute_scale()) c.compute_scale = spec.compute_scale();
  if (spec.has_forward_fraction()) c.forward_fraction = spec.forward_fraction();
  if (spec.has_hbm_bytes_per_second()) c.hbm_bytes_per_second = spec.hbm_bytes_per_second();
  if (spec.has_merge_passes()) c.merge_passes = spec.merge_passes();
  if (spec.has_overlap_whole_shards()) c.overlap_whole_shards = spec.overlap_whole_shards();
  c.ranks_per_node = ranks_per_node;
  if (absl::Status s = core::ValidateClusterSpec(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cluster_spec.", s.message()));
  }
  o.layers = request.layers() == 0 ? 1 : request.layers();
  FLASHCP_RETURN_IF_ERROR(core::ValidateStepShape(shape, o.layers));
  if (request.cp_size() > core::kMaxStepTimeCpSize) {
    return absl::InvalidArgumentError(absl::StrCat("cluster: step time is predicted for at most ",
                                                   core::kMaxStepTimeCpSize, " ranks, cp_size is ",
                                                   request.cp_size()));
  }
  o.per_rank = request.include_rank_step_times();
  return o;
}

}  // namespace

absl::StatusOr<PlanInput> RequestFromProto(const v1::PlanRequest& request,
                                           const core::BatchLimits& limits,
                                           const CostResolver& resolve) {
  PlanInput in;
  in.batch_id = request.batch_id();
  in.batch.doc_lens.assign(request.doc_lens().begin(), request.doc_lens().end());
  in.batch.cp_size = request.cp_size();
  FLASHCP_RETURN_IF_ERROR(core::ValidateBatch(in.batch, limits));

  if (!request.strategy().empty()) {
    FLASHCP_ASSIGN_OR_RETURN(in.strategy, core::ParseStrategy(request.strategy()));
  }

  const core::PlanOptions defaults;
  const double r = request.target_imbalance();
  in.options.target_imbalance = r == 0.0 ? defaults.target_imbalance : r;
  // Written so that NaN fails too.
  if (!(in.options.target_imbalance >= 1.0) || !std::isfinite(in.options.target_imbalance)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_imbalance: must be a finite ratio >= 1 (0 means ",
                     defaults.target_imbalance, "), got ", r));
  }

  const int64_t m = request.min_shard_tokens();
  if (m < kMinShardTokensOff || m > core::kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_shard_tokens: must be -1 (off), 0 (the default ",
                     defaults.min_shard_tokens, ") or a token count in [1, 2^40], got ", m));
  }
  in.options.min_shard_tokens =
      m == 0 ? defaults.min_shard_tokens : m == kMinShardTokensOff ? 0 : m;
  in.options.ranks_per_node = request.ranks_per_node();
  FLASHCP_RETURN_IF_ERROR(core::ValidateRanksPerNode(in.options.ranks_per_node));
  FLASHCP_ASSIGN_OR_RETURN(in.options.attention_mask.kind,
                           core::ParseMaskKind(request.attention_mask()));
  in.options.attention_mask.block_size = request.block_size();
  FLASHCP_RETURN_IF_ERROR(core::ValidateAttentionMask(in.options.attention_mask));

  constexpr core::ModelShape kDefaultShape;
  in.shape.heads = request.heads() == 0 ? kDefaultShape.heads : request.heads();
  in.shape.head_dim = request.head_dim() == 0 ? kDefaultShape.head_dim : request.head_dim();
  in.shape.dtype_bytes =
      request.dtype_bytes() == 0 ? kDefaultShape.dtype_bytes : request.dtype_bytes();
  in.shape.query_heads = request.query_heads();
  FLASHCP_RETURN_IF_ERROR(core::ValidateModelShape(in.shape));
  in.choose_schemes = request.choose_schemes();
  in.inter_node_weight = request.inter_node_weight() == 0.0 ? core::kDefaultInterNodeWeight
                                                            : request.inter_node_weight();
  FLASHCP_RETURN_IF_ERROR(core::ValidateInterNodeWeight(in.inter_node_weight));
  FLASHCP_RETURN_IF_ERROR(core::ValidateModelShape(in.shape));

  in.include_layout = request.include_layout();

  if (static_cast<int64_t>(request.cost_profile().size()) > kMaxCostProfileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cost_profile: at most ", kMaxCostProfileBytes,
                                                   " bytes, got ", request.cost_profile().size()));
  }
  if (request.has_cost()) {
    if (!request.cost_profile().empty()) {
      return absl::InvalidArgumentError(
          "cost_profile: give a profile or cost coefficients, not both");
    }
    in.options.cost = CostFromProto(request.cost());
    if (absl::Status s = core::ValidateCostCoefficients(in.options.cost); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cost.", s.message()));
    }
    in.cost_profile.clear();
  } else if (!request.cost_profile().empty()) {
    const absl::StatusOr<core::CostCoefficients> shipped = core::CostProfile(request.cost_profile());
    if (!shipped.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cost_profile: ", shipped.status().message()));
    }
    const absl::StatusOr<std::pair<core::CostCoefficients, bool>> c =
        resolve != nullptr && request.cost_profile() != core::kPairsProfile
            ? resolve(request.cost_profile())
            : std::pair<core::CostCoefficients, bool>{*shipped, false};
    if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("cost_profile: ", c.status().message()));
    in.options.cost = c->first;
    in.cost_calibrated = c->second;
    in.cost_profile = request.cost_profile();
  }
  in.options.rank_speed.assign(request.rank_speed().begin(), request.rank_speed().end());
  FLASHCP_RETURN_IF_ERROR(
      core::ValidateRankSpeeds(in.options.rank_speed, in.batch.cp_size, in.options.cost));
  FLASHCP_ASSIGN_OR_RETURN(in.step_time, StepTimeFromRequest(request, in.options.ranks_per_node,
                                                             in.shape));
  in.choose_by_step_time = request.choose_by_step_time();
  if (in.choose_by_step_time && !in.step_time.has_value()) {
    return absl::InvalidArgumentError(
        "choose_by_step_time: needs a cluster (cluster or cluster_spec)");
  }
  return in;
}

v1::PlanRequest RequestToProto(uint64_t batch_id, const core::Batch& batch,
                               core::Strategy strategy, const core::PlanOptions& options,
                               const core::ModelShape& shape, bool include_layout,
                               absl::string_view cost_profile) {
  v1::PlanRequest request;
  request.set_batch_id(batch_id);
  request.mutable_doc_lens()->Add(batch.doc_lens.begin(), batch.doc_lens.end());
  request.set_cp_size(batch.cp_size);
  request.set_strategy(std::string(core::StrategyName(strategy)));
  request.set_target_imbalance(options.target_imbalance);
  request.set_min_shard_tokens(options.min_shard_tokens == 0 ? kMinShardTokensOff
                                                              : options.min_shard_tokens);
  request.set_ranks_per_node(options.ranks_per_node);
  if (core::IsBlockDiffusion(options.attention_mask)) {
    request.set_attention_mask(std::string(core::MaskKindName(options.attention_mask.kind)));
    request.set_block_size(options.attention_mask.block_size);
  }
  request.set_heads(shape.heads);
  request.set_head_dim(shape.head_dim);
  request.set_dtype_bytes(shape.dtype_bytes);
  request.set_query_heads(shape.query_heads);
  request.set_include_layout(include_layout);
  if (!cost_profile.empty()) {
    request.set_cost_profile(std::string(cost_profile));
  } else if (!core::IsPairsModel(options.cost)) {
    CostToProto(options.cost, request.mutable_cost());
  }
  request.mutable_rank_speed()->Add(options.rank_speed.begin(), options.rank_speed.end());
  return request;
}

v1::PlanResponse ResponseToProto(uint64_t batch_id, core::Strategy strategy,
                                 const core::Plan& plan, const core::PlanMetrics& metrics,
                                 const core::CommLayout* layout, double planning_seconds,
                                 const core::PlanInfo* ilp, const core::PlanCostReport* cost) {
  v1::PlanResponse response;
  response.set_batch_id(batch_id);
  response.set_strategy(std::string(core::StrategyName(strategy)));
  response.set_cp_size(plan.cp_size);
  response.mutable_doc_lens()->Add(plan.doc_lens.begin(), plan.doc_lens.end());
  response.set_padding(plan.padding);
  if (core::IsBlockDiffusion(plan.mask)) {
    response.set_attention_mask(std::string(core::MaskKindName(plan.mask.kind)));
    response.set_block_size(plan.mask.block_size);
  }
  response.mutable_shards()->Reserve(static_cast<int>(plan.shards.size()));
  for (const core::Shard& s : plan.shards) {
    v1::Shard* p = response.add_shards();
    p->set_doc(s.doc);
    p->set_start(s.start);
    p->set_len(s.len);
    p->set_rank(s.rank);
  }
  MetricsToProto(metrics, planning_seconds, response.mutable_metrics());
  if (cost != nullptr) {
    v1::PlanMetrics* m = response.mutable_metrics();
    m->set_cost_profile(cost->profile);
    CostToProto(cost->coefficients, m->mutable_cost());
    m->set_cost_calibrated(cost->calibrated);
    m->mutable_rank_predicted_cost()->Add(cost->prediction.rank_cost.begin(),
                                          cost->prediction.rank_cost.end());
    m->set_predicted_cost_imbalance(cost->prediction.imbalance);
    m->mutable_rank_speed()->Add(cost->prediction.rank_speed.begin(),
                                 cost->prediction.rank_speed.end());
  }
  if (layout != nullptr) LayoutToProto(*layout, response.mutable_layout());
  if (ilp != nullptr) {
    response.mutable_ilp()->set_optimal(ilp->ilp_optimal);
    response.mutable_ilp()->set_gap(ilp->ilp_gap);
    response.mutable_ilp()->set_granularity(ilp->ilp_granularity);
  }
  response.set_plan_hash(core::PlanHashHex(core::PlanHash(plan)));
  response.set_planner_version(std::string(core::PlannerVersion()));
  return response;
}

void GroupSchemesToProto(const core::GroupSchemePlan& chosen, v1::PlanResponse* out) {
  for (const core::ChosenGroup& g : chosen.choice.groups) {
    v1::SchemeGroup* p = out->add_groups();
    p->mutable_ranks()->Add(g.group.ranks.begin(), g.group.ranks.end());
    p->set_scheme(g.group.two_level ? std::string("two_level")
                                    : std::string(core::CommSchemeName(g.group.scheme)));
    p->set_weighted_bottleneck_bytes(g.weighted_bottleneck);
  }
  SchemeBytesToProto(core::CommScheme::kTargeted, chosen.choice.bytes, out->mutable_chosen_bytes());
  out->mutable_chosen_bytes()->set_scheme("chosen");
  out->set_plan_source(std::string(core::StrategyName(chosen.source)));
}

void StepTimeToProto(const core::StepTimeReport& report, bool per_rank, v1::PlanMetrics* m) {
  const core::StepTimePrediction& p = report.native();
  m->set_predicted_step_seconds(p.step_seconds);
  m->set_predicted_exchange(std::string(core::StepExchangeName(report.exchange)));
  m->set_predicted_forward_seconds(p.forward_seconds);
  m->set_predicted_backward_seconds(p.backward_seconds);
  m->set_predicted_exposed_exchange_seconds(p.exposed_exchange_seconds);
  m->set_predicted_compute_seconds(p.layers * p.compute_seconds);
  for (int e = 0; e < core::kNumStepExchanges; ++e) {
    const core::StepTimePrediction& x = report.all[e];
    v1::ExchangeStepTime* out = m->add_predicted_exchanges();
    out->set_exchange(std::string(core::StepExchangeName(static_cast<core::StepExchange>(e))));
    out->set_step_seconds(x.step_seconds);
    out->set_exposed_exchange_seconds(x.exposed_exchange_seconds);
    out->set_exchange_seconds(x.exchange_seconds);
    out->set_inapplicable(x.inapplicable);
  }
  if (per_rank) {
    for (const core::RankStepTime& r : p.ranks) {
      v1::RankPredictedTime* out = m->add_rank_predicted_times();
      out->set_forward_compute(r.forward_compute);
      out->set_backward_compute(r.backward_compute);
      out->set_exchange(r.exchange);
      out->set_forward(r.forward);
      out->set_backward(r.backward);
      out->set_exposed_exchange(r.exposed_exchange);
    }
  }
  m->set_predicted_cluster(report.cluster);
}

v1::PlanResponse ErrorResponseToProto(uint64_t batch_id, const absl::Status& status) {
  v1::PlanResponse response;
  response.set_batch_id(batch_id);
  response.mutable_error()->set_code(static_cast<int32_t>(status.code()));
  response.mutable_error()->set_message(std::string(status.message()));
  return response;
}

absl::Status ErrorFromProto(const v1::Error& error) {
  if (error.code() < kMinErrorCode || error.code() > kMaxErrorCode) {
    return absl::UnknownError(
        absl::StrCat("error code ", error.code(), ": ", error.message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(error.code()), error.message());
}

namespace {

// INVALID_ARGUMENT naming `field` unless it has one entry per rank.
absl::Status CheckPerRank(absl::string_view field, int size, int32_t cp_size) {
  if (size == cp_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("metrics.", field, ": want cp_size = ", cp_size,
                                                 " entries (one per rank), got ", size));
}

}  // namespace

absl::StatusOr<PlanResult> ResponseFromProto(const v1::PlanResponse& response) {
  if (response.has_error()) return ErrorFromProto(response.error());
  // Per-rank lists are indexed by rank downstream (wire data: check, not trust).
  const int32_t cp_size = response.cp_size();
  const v1::PlanMetrics& wire = response.metrics();
  FLASHCP_RETURN_IF_ERROR(CheckPerRank("rank_tokens", wire.rank_tokens_size(), cp_size));
  FLASHCP_RETURN_IF_ERROR(CheckPerRank("rank_workload", wire.rank_workload_size(), cp_size));
  FLASHCP_RETURN_IF_ERROR(
      CheckPerRank("rank_nonlast_tokens", wire.rank_nonlast_tokens_size(), cp_size));
  FLASHCP_RETURN_IF_ERROR(CheckPerRank("rank_segments", wire.rank_segments_size(), cp_size));
  if (wire.rank_predicted_cost_size() != 0) {  // absent from servers before the cost model
    FLASHCP_RETURN_IF_ERROR(
        CheckPerRank("rank_predicted_cost", wire.rank_predicted_cost_size(), cp_size));
  }
  if (wire.rank_speed_size() != 0) {  // only where the request gave speeds
    FLASHCP_RETURN_IF_ERROR(CheckPerRank("rank_speed", wire.rank_speed_size(), cp_size));
  }
  for (int i = 0; i < wire.bytes_size(); ++i) {
    const v1::SchemeBytes& b = wire.bytes(i);
    if (!core::ParseCommScheme(b.scheme()).ok()) continue;  // skipped below, unread
    FLASHCP_RETURN_IF_ERROR(CheckPerRank(absl::StrCat("bytes[", i, "].sent_bytes"),
                                         b.sent_bytes_size(), cp_size));
    FLASHCP_RETURN_IF_ERROR(CheckPerRank(absl::StrCat("bytes[", i, "].received_bytes"),
                                         b.received_bytes_size(), cp_size));
    // The per-phase lists are absent from servers older than them.
    if (b.phase_sent_tokens_size() != 0 || b.phase_received_tokens_size() != 0) {
      FLASHCP_RETURN_IF_ERROR(CheckPerRank(absl::StrCat("bytes[", i, "].phase_sent_tokens"),
                                           b.phase_sent_tokens_size(), cp_size));
      FLASHCP_RETURN_IF_ERROR(CheckPerRank(absl::StrCat("bytes[", i, "].phase_received_tokens"),
                                           b.phase_received_tokens_size(), cp_size));
    }
    // Absent from servers older than the per-rank link split.
    if (b.phase_inter_node_sent_bytes_size() != 0 ||
        b.phase_inter_node_received_bytes_size() != 0) {
      FLASHCP_RETURN_IF_ERROR(
          CheckPerRank(absl::StrCat("bytes[", i, "].phase_inter_node_sent_bytes"),
                       b.phase_inter_node_sent_bytes_size(), cp_size));
      FLASHCP_RETURN_IF_ERROR(
          CheckPerRank(absl::StrCat("bytes[", i, "].phase_inter_node_received_bytes"),
                       b.phase_inter_node_received_bytes_size(), cp_size));
    }
  }
  PlanResult out;
  out.batch_id = response.batch_id();
  out.strategy = response.strategy();
  out.plan_hash = response.plan_hash();
  out.planner_version = response.planner_version();
  out.plan.cp_size = response.cp_size();
  out.plan.doc_lens.assign(response.doc_lens().begin(), response.doc_lens().end());
  out.plan.padding = response.padding();
  {
    absl::StatusOr<core::MaskKind> kind = core::ParseMaskKind(response.attention_mask());
    if (!kind.ok()) return absl::InvalidArgumentError(kind.status().message());
    out.plan.mask = core::AttentionMask{*kind, response.block_size()};
    FLASHCP_RETURN_IF_ERROR(core::ValidateAttentionMask(out.plan.mask));
  }
  out.plan.shards.reserve(response.shards_size());
  for (const v1::Shard& s : response.shards()) {
    out.plan.shards.push_back(core::Shard{s.doc(), s.start(), s.len(), s.rank()});
  }
  const v1::PlanMetrics& m = response.metrics();
  core::PlanMetrics& cm = out.metrics;
  cm.tokens_per_rank = m.tokens_per_rank();
  cm.padding = response.padding();
  cm.rank_tokens.assign(m.rank_tokens().begin(), m.rank_tokens().end());
  cm.rank_workload.assign(m.rank_workload().begin(), m.rank_workload().end());
  cm.imbalance = m.imbalance_ratio();
  cm.rank_nonlast_tokens.assign(m.rank_nonlast_tokens().begin(), m.rank_nonlast_tokens().end());
  cm.max_nonlast_tokens = cm.rank_nonlast_tokens.empty()
                              ? 0
                              : *std::max_element(cm.rank_nonlast_tokens.begin(),
                                                  cm.rank_nonlast_tokens.end());
  cm.comm_saving = m.comm_saving_ratio();
  cm.targeted_saving = m.targeted_saving_ratio();
  for (const v1::SchemeBytes& b : m.bytes()) {
    absl::StatusOr<core::CommScheme> scheme = core::ParseCommScheme(b.scheme());
    if (!scheme.ok()) continue;  // a scheme newer than this build
    core::SchemeBytes& cb = cm.bytes[static_cast<int>(*scheme)];
    cb.sent.assign(b.sent_bytes().begin(), b.sent_bytes().end());
    cb.received.assign(b.received_bytes().begin(), b.received_bytes().end());
    cb.bottleneck = b.bottleneck_bytes();
    core::PhaseTraffic& phase = cb.phase;
    phase.sent_tokens.assign(b.phase_sent_tokens().begin(), b.phase_sent_tokens().end());
    phase.received_tokens.assign(b.phase_received_tokens().begin(),
                                 b.phase_received_tokens().end());
    phase.max_sent_tokens = b.phase_max_sent_tokens();
    phase.max_received_tokens = b.phase_max_received_tokens();
    phase.bottleneck_tokens = b.phase_bottleneck_tokens();
    phase.max_sent_bytes = b.phase_max_sent_bytes();
    phase.max_received_bytes = b.phase_max_received_bytes();
    phase.bottleneck_bytes = b.phase_bottleneck_bytes();
    phase.intra_node_bytes = b.phase_intra_node_bytes();
    phase.inter_node_bytes = b.phase_inter_node_bytes();
    phase.inter_node_sent_bytes.assign(b.phase_inter_node_sent_bytes().begin(),
                                       b.phase_inter_node_sent_bytes().end());
    phase.inter_node_received_bytes.assign(b.phase_inter_node_received_bytes().begin(),
                                           b.phase_inter_node_received_bytes().end());
    phase.max_intra_node_bytes = b.phase_max_intra_node_bytes();
    phase.max_inter_node_bytes = b.phase_max_inter_node_bytes();
    phase.clean_received_tokens.assign(b.phase_clean_received_tokens().begin(),
                                       b.phase_clean_received_tokens().end());
    phase.noisy_received_tokens.assign(b.phase_noisy_received_tokens().begin(),
                                       b.phase_noisy_received_tokens().end());
    phase.max_clean_received_bytes = b.phase_max_clean_received_bytes();
    phase.max_noisy_received_bytes = b.phase_max_noisy_received_bytes();
  }
  cm.rank_segments.assign(m.rank_segments().begin(), m.rank_segments().end());
  // Absent from older servers (and a scheme newer than this build): the default.
  if (absl::StatusOr<core::CommScheme> cheaper = core::ParseCommScheme(m.cheaper_scheme());
      cheaper.ok()) {
    cm.cheaper_scheme = *cheaper;
  }
  cm.all_to_all_inapplicable = m.all_to_all_inapplicable();
  cm.all_to_all_replicated_kv_heads = m.all_to_all_replicated_kv_heads();
  cm.cut_docs = m.cut_docs();
  cm.mask = out.plan.mask;
  cm.rank_noisy_tokens.assign(m.rank_noisy_tokens().begin(), m.rank_noisy_tokens().end());
  cm.cut_noisy_blocks = m.cut_noisy_blocks();
  cm.min_cut_shard_len = m.min_cut_shard_len();
  out.planning_seconds = m.planning_seconds();
  out.cost.profile = m.cost_profile();
  out.cost.coefficients = CostFromProto(m.cost());
  out.cost.calibrated = m.cost_calibrated();
  out.cost.prediction.rank_cost.assign(m.rank_predicted_cost().begin(),
                                       m.rank_predicted_cost().end());
  out.cost.prediction.imbalance = m.predicted_cost_imbalance();
  out.cost.prediction.rank_speed.assign(m.rank_speed().begin(), m.rank_speed().end());
  return out;
}

}  // namespace flashcp::proto
