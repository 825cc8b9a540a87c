#include "core/cluster_flags.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/cost_model.h"
#include "core/status_macros.h"

ABSL_FLAG(std::string, cluster, "",
          "predict step time on this cluster preset (h100-sxm, h200); the constants below "
          "override it (docs/step_time.md)");
ABSL_FLAG(int32_t, layers, 1,
          "transformer layers, in [1, 100000]: of the predicted step (default 1); with --pipeline "
          "the model's, a multiple of --pp (default: the pipeline model's, 32)");
ABSL_FLAG(double, nvlink_gbytes_per_s, flashcp::core::ClusterSpec{}.nvlink_bytes_per_second / 1e9,
          "NVLink bandwidth per GPU and direction, GB/s (10^9 bytes)");
ABSL_FLAG(absl::Duration, nvlink_latency,
          absl::Seconds(flashcp::core::ClusterSpec{}.nvlink_latency_seconds),
          "NVLink latency per message");
ABSL_FLAG(double, nic_gbytes_per_s, flashcp::core::ClusterSpec{}.nic_bytes_per_second / 1e9,
          "NIC bandwidth per GPU and direction, GB/s; a node's NICs are shared by its GPUs");
ABSL_FLAG(absl::Duration, nic_latency,
          absl::Seconds(flashcp::core::ClusterSpec{}.nic_latency_seconds),
          "NIC latency per message");
ABSL_FLAG(std::string, compute_profile, "h200-cudnn",
          "the cost profile (seconds, forward + backward) of the attention compute");
ABSL_FLAG(int32_t, profile_query_heads, flashcp::core::ClusterSpec{}.profile_query_heads,
          "query heads the compute profile was measured at");
ABSL_FLAG(int32_t, profile_head_dim, flashcp::core::ClusterSpec{}.profile_head_dim,
          "head dimension the compute profile was measured at");
ABSL_FLAG(double, compute_scale, flashcp::core::ClusterSpec{}.compute_scale,
          "this GPU's attention time over the profile's GPU's");
ABSL_FLAG(double, forward_fraction, flashcp::core::ClusterSpec{}.forward_fraction,
          "forward's share of a shard's forward + backward time, in (0, 1)");
ABSL_FLAG(double, hbm_gbytes_per_s, flashcp::core::ClusterSpec{}.hbm_bytes_per_second / 1e9,
          "HBM bandwidth, GB/s, for ring attention's merges of partial outputs (0: free)");
ABSL_FLAG(double, merge_passes, flashcp::core::ClusterSpec{}.merge_passes,
          "fp32 passes over a rank's output per ring hop");
ABSL_FLAG(bool, overlap_whole_shards, flashcp::core::ClusterSpec{}.overlap_whole_shards,
          "the CUDA engine's overlap of whole shards with the exchange; false: in sequence "
          "(the CPU engine)");
ABSL_FLAG(bool, rank_step_times, false, "also each rank's predicted times (JSON output)");

namespace flashcp::core {
namespace {

constexpr const char* kConstants[] = {
    "nvlink_gbytes_per_s", "nvlink_latency",   "nic_gbytes_per_s", "nic_latency",
    "compute_profile",     "profile_query_heads", "profile_head_dim", "compute_scale",
    "forward_fraction",    "hbm_gbytes_per_s", "merge_passes",     "overlap_whole_shards"};

// ValidateClusterSpec's field names as the flags that set them.
absl::Status AsClusterFlagError(const absl::Status& s) {
  if (s.ok()) return s;
  const std::string m(s.message());
  const std::pair<const char*, const char*> renames[] = {
      {"nvlink_bytes_per_second", "--nvlink_gbytes_per_s (bytes/s)"},
      {"nic_bytes_per_second", "--nic_gbytes_per_s (bytes/s)"},
      {"hbm_bytes_per_second", "--hbm_gbytes_per_s (bytes/s)"},
      {"nvlink_latency_seconds", "--nvlink_latency (s)"},
      {"nic_latency_seconds", "--nic_latency (s)"},
      {"compute.", "--compute_profile: "},
  };
  for (const auto& [field, flag] : renames) {
    if (m.rfind(field, 0) == 0) {
      return absl::Status(s.code(), absl::StrCat(flag, m.substr(std::string(field).size())));
    }
  }
  return absl::Status(s.code(), absl::StrCat("--", m));
}

}  // namespace

absl::StatusOr<StepTimeOptions> StepTimeFromFlagsOrDefault(const CommandLine& line,
                                                           int32_t ranks_per_node) {
  StepTimeOptions o;
  const std::string preset = absl::GetFlag(FLAGS_cluster);
  if (!preset.empty()) {
    absl::StatusOr<ClusterSpec> c = ClusterPreset(preset);
    if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("--cluster: ", c.status().message()));
    o.cluster = *c;
    o.cluster_name = preset;
  }
  ClusterSpec& c = o.cluster;
  const auto given = [&](const char* name) { return line.given.count(name) > 0; };
  if (given("nvlink_gbytes_per_s")) c.nvlink_bytes_per_second = 1e9 * absl::GetFlag(FLAGS_nvlink_gbytes_per_s);
  if (given("nic_gbytes_per_s")) c.nic_bytes_per_second = 1e9 * absl::GetFlag(FLAGS_nic_gbytes_per_s);
  if (given("hbm_gbytes_per_s")) c.hbm_bytes_per_second = 1e9 * absl::GetFlag(FLAGS_hbm_gbytes_per_s);
  if (given("nvlink_latency")) c.nvlink_latency_seconds = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_nvlink_latency));
  if (given("nic_latency")) c.nic_latency_seconds = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_nic_latency));
  if (given("compute_profile")) {
    const std::string name = absl::GetFlag(FLAGS_compute_profile);
    if (name == kPairsProfile) {
      return FlagValueError("compute_profile", "a profile in seconds, not pairs", name);
    }
    absl::StatusOr<CostCoefficients> p = CostProfile(name);
    if (!p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--compute_profile: ", p.status().message()));
    }
    c.compute = *p;
  }
  if (given("profile_query_heads")) c.profile_query_heads = absl::GetFlag(FLAGS_profile_query_heads);
  if (given("profile_head_dim")) c.profile_head_dim = absl::GetFlag(FLAGS_profile_head_dim);
  if (given("compute_scale")) c.compute_scale = absl::GetFlag(FLAGS_compute_scale);
  if (given("forward_fraction")) c.forward_fraction = absl::GetFlag(FLAGS_forward_fraction);
  if (given("merge_passes")) c.merge_passes = absl::GetFlag(FLAGS_merge_passes);
  if (given("overlap_whole_shards")) c.overlap_whole_shards = absl::GetFlag(FLAGS_overlap_whole_shards);
  c.ranks_per_node = ranks_per_node;
  FLASHCP_RETURN_IF_ERROR(AsClusterFlagError(ValidateClusterSpec(c)));
  FLASHCP_ASSIGN_OR_RETURN(const int64_t layers,
                           IntFlagIn("layers", absl::GetFlag(FLAGS_layers), 1, 100000));
  o.layers = static_cast<int32_t>(layers);
  o.per_rank = absl::GetFlag(FLAGS_rank_step_times);
  return o;
}

absl::StatusOr<std::optional<StepTimeOptions>> StepTimeFromFlags(const CommandLine& line,
                                                                 int32_t ranks_per_node) {
  bool any = line.given.count("cluster") > 0;
  for (const char* name : kConstants) any = any || line.given.count(name) > 0;
  if (!any) {
    // With --pipeline, --layers is the pipeline model's (core/cli_args.cc).
    const bool step_layers = line.given.count("layers") > 0 && line.given.count("pipeline") == 0;
    if (step_layers || line.given.count("rank_step_times") > 0) {
      return absl::InvalidArgumentError(
          "--layers and --rank_step_times need --cluster (or a cluster constant)");
    }
    return std::nullopt;
  }
  FLASHCP_ASSIGN_OR_RETURN(StepTimeOptions o, StepTimeFromFlagsOrDefault(line, ranks_per_node));
  return o;
}

}  // namespace flashcp::core
