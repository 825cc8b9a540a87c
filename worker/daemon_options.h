// What one flashcp-worker rank is asked to do (its flags, as plain values).
#ifndef FLASHCP_WORKER_DAEMON_OPTIONS_H_
#define FLASHCP_WORKER_DAEMON_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/mask.h"
#include "core/strategies.h"

namespace flashcp::worker {

struct DaemonOptions {
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string group = "g0";          // [A-Za-z0-9._-]{1,64}
  std::string device = "cpu";        // "cpu" or "cuda:K" (the backend is made for it)
  core::Dataset dataset = core::Dataset::kPile;
  int64_t context = 16384;           // tokens per batch (C)
  // A planner strategy name.
  std::string strategy = std::string(core::StrategyName(core::kDefaultStrategy));
  core::CommScheme scheme = core::CommScheme::kAllGather;
  // The attention mask the plans and steps run under (--attention_mask,
  // --block_size): the causal document mask by default; block diffusion
  // plans and steps the 2C rows [noisy ; clean] of each C-token batch.
  core::AttentionMask attention_mask;
  double target_imbalance = 0.0;     // 0: the planner's default
  int32_t heads = 4;                 // H
  int32_t head_dim = 64;             // D
  int64_t steps = 100;               // first run's steps; 0: wait for StartRun
  int32_t prefetch = 4;              // plans in flight ahead of the step (K)
  absl::Duration timeout = absl::Seconds(30);  // group formation and every collective
  int32_t threads = 1;               // kernel threads of this rank
  uint64_t seed = 1;                 // batches and Q, K, V data
  bool linger = false;               // after a run: stay (control, metrics) until SIGTERM
  uint64_t incarnation = 0;          // this process's identity for Join/Leave
  // The job's rendezvous credential (JoinRequest.job_secret; the launcher's
  // FLASHCP_JOB_SECRET): the group's namespace on the planner; "" the open one.
  std::string job_secret;
  int64_t progress_every = 0;        // driver logs progress every N steps; 0: never
  std::string gloo_hostname = "127.0.0.1";  // address this rank's Gloo transport listens on
  // The cost profile the plans balance (core::CostProfileNames; "" or
  // "pairs": SPEC Eq. 3, no reports). Any other: the driver reports every
  // rank's measured attention time with its plan features to the planner
  // (ReportStepTimes) every `report_every` steps (1..64), so the planner
  // calibrates the profile (docs/workers.md, "Calibration").
  std::string cost_profile;
  int32_t report_every = 8;
  // With such a profile: the driver also fits per-rank speeds (measured over
  // predicted time, core::FitRankSpeeds) over its last `rank_speed_window`
  // steps planned on the calibrated fit, once it holds at least half of
  // them, and sends them with every later plan request (PlanRequest.rank_speed).
  // 0 turns it off; at most 1024.
  int32_t rank_speed_window = 16;
  // A cluster preset (core::ClusterPresetNames): the driver's plan requests
  // ask for the step-time model's prediction on it (PlanRequest.cluster), which
  // every rank exports beside its measured step. "": none.
  std::string cluster;
};

// InvalidArgument naming the flag. Whether a cuda:K device can be used is the
// backend's to say (MakeRankBackend).
absl::Status ValidateDaemonOptions(const DaemonOptions& options);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_DAEMON_OPTIONS_H_
