#include "worker/daemon_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cost_model.h"
#include "core/flags.h"
#include "core/mask.h"
#include "core/status_macros.h"
#include "core/step_time.h"
#include "core/strategies.h"
#include "proto/convert.h"
#include "proto/rendezvous_limits.h"
#include "worker/rank_backend.h"

namespace flashcp::worker {

absl::Status ValidateDaemonOptions(const DaemonOptions& o) {
  if (o.world_size < 1 || o.world_size > proto::rendezvous::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("--world_size: must be in [1, ",
                                                   proto::rendezvous::kMaxWorldSize, "], got ",
                                                   o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--rank: must be in [0, ", o.world_size,
                                                   "), got ", o.rank));
  }
  FLASHCP_RETURN_IF_ERROR(ParseDevice(o.device).status());
  if (o.context < o.world_size || o.context > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("--context: must be in [world_size, 2^24], got ",
                                                   o.context));
  }
  if (!core::ParseStrategy(o.strategy).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--strategy: unknown \"", o.strategy, "\""));
  }
  if (absl::Status s = core::ValidateAttentionMask(o.attention_mask); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  if (!core::PlansMask(*core::ParseStrategy(o.strategy), o.attention_mask)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--strategy: \"", o.strategy, "\" does not plan --attention_mask=",
                     core::MaskKindName(o.attention_mask.kind)));
  }
  // The element size is the backend's (RankBackend::dtype_bytes), not a flag.
  FLASHCP_RETURN_IF_ERROR(
      core::ModelShapeFromFlags(o.heads, o.head_dim, core::ModelShape{}.dtype_bytes).status());
  // Written so that NaN fails too; the planner takes the same values.
  if (o.target_imbalance != 0 &&
      !(o.target_imbalance >= 1 && std::isfinite(o.target_imbalance))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target_imbalance: must be 0 (the planner's default) or a finite ratio >= 1, got ",
        o.target_imbalance));
  }
  if (o.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: must be >= 0, got ", o.steps));
  }
  if (!o.cluster.empty()) {
    if (absl::Status s = core::ClusterPreset(o.cluster).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cluster: ", s.message()));
    }
  }
  if (!o.cost_profile.empty()) {
    if (absl::Status s = core::CostProfile(o.cost_profile).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cost_profile: ", s.message()));
    }
  }
  if (o.report_every < 1 || o.report_every > proto::kMaxReportSteps) {
    return absl::InvalidArgumentError(absl::StrCat("--report_every: must be in [1, ",
                                                   proto::kMaxReportSteps, "], got ",
                                                   o.report_every));
  }
  if (o.rank_speed_window < 0 || o.rank_speed_window > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank_speed_window: must be in [0, 1024], got ", o.rank_speed_window));
  }
  if (o.prefetch < 1 || o.prefetch > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefetch: must be in [1, 1024], got ", o.prefetch));
  }
  // The group's rendezvous waits (AwaitMembers, Gloo's store) take this
  // timeout, and the planner refuses waits beyond its limit.
  if (o.timeout < absl::Seconds(1) || o.timeout > proto::rendezvous::kMaxTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout_s: must be in [1, ", absl::ToInt64Seconds(proto::rendezvous::kMaxTimeout),
        "] (the planner's rendezvous wait limit), got ", absl::ToDoubleSeconds(o.timeout)));
  }
  if (o.threads < 1 || o.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: must be in [1, 1024], got ", o.threads));
  }
  return absl::OkStatus();
}

}  // namespace flashcp::worker
