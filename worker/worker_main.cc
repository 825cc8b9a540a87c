// flashcp-worker: one rank of a FlashCP CP group (worker/daemon.h). Prints
//   WORKER rank=R control=HOST:PORT metrics=HOST:PORT
// to stdout once its endpoints are bound, forms the group through the
// planner's Rendezvous service, runs --steps steps (the driver, rank 0, also
// prints a `RUN {...}` summary line per run) and exits 0; a failure (an
// unwritable stdout included) exits 1 with the reason on stderr; a usage
// error (a bad flag or flag value, a positional argument) exits 2. SIGTERM or
// SIGINT: the group finishes the step in flight and every rank exits 0.
//
// --tls_ca (with --tls_cert/--tls_key for mTLS, --tls_server_name) makes the
// planner channel TLS, as flashcp-client's flags of the same names do; the
// rendezvous store and the plans share that one channel, or with
// --rendezvous (a rendezvous service of its own) use two, both TLS. The
// worker's own endpoints (--control, --metrics) and the Gloo transport stay
// plaintext; the control port also serves grpc.health.v1.Health (the pod's
// probes).
//
// --device cpu runs the CPU engine; --device cuda:K the CUDA backend
// (worker/cuda/cuda_rank_backend.h), linked only into a build with CUDA
// (FLASHCP_WORKER_CUDA, set by worker/CMakeLists.txt); without it cuda:K
// fails with FAILED_PRECONDITION "built without CUDA".
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "client/internal/tls_flags.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/mask.h"
#include "core/status_macros.h"
#include "core/strategies.h"
#include "prometheus/registry.h"
#include "core/runtime/metrics_endpoint/endpoint_flags.h"
#include "worker/run_worker.h"
#ifdef FLASHCP_WORKER_CUDA
#include "worker/cuda/cuda_rank_backend.h"
#endif

ABSL_FLAG(int32_t, rank, flashcp::worker::DaemonOptions{}.rank,
          "this process's rank in the group, 0 is the driver");
ABSL_FLAG(int32_t, world_size, flashcp::worker::DaemonOptions{}.world_size,
          "ranks in the CP group (N)");
ABSL_FLAG(std::string, group, flashcp::worker::DaemonOptions{}.group,
          "CP group name, [A-Za-z0-9._-]{1,64}");
ABSL_FLAG(std::string, planner, flashcp::worker::WorkerOptions{}.planner,
          "planner gRPC address HOST:PORT");
ABSL_FLAG(std::string, rendezvous, flashcp::worker::WorkerOptions{}.rendezvous,
          "address HOST:PORT of the flashcp.v1.Rendezvous that forms the group (a "
          "flashcp-planner --serve=rendezvous); empty: the --planner");
ABSL_FLAG(std::string, metrics, flashcp::worker::WorkerOptions{}.metrics,
          "Prometheus /metrics HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, control, flashcp::worker::WorkerOptions{}.control,
          "flashcp.v1.WorkerControl HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, device, flashcp::worker::DaemonOptions{}.device,
          "cpu, or cuda:K (a build with CUDA; K the device index)");
ABSL_FLAG(std::string, dataset,
          std::string(flashcp::core::DatasetName(flashcp::worker::DaemonOptions{}.dataset)),
          "document-length distribution: wlbllm, pile, redpajama");
ABSL_FLAG(int64_t, context, flashcp::worker::DaemonOptions{}.context, "tokens per batch (C)");
ABSL_FLAG(std::string, strategy, flashcp::worker::DaemonOptions{}.strategy, "planner strategy");
ABSL_FLAG(std::string, scheme,
          std::string(flashcp::core::CommSchemeName(flashcp::worker::DaemonOptions{}.scheme)),
          "KV exchange: full_kv, allgather, targeted");
ABSL_FLAG(std::string, attention_mask,
          std::string(flashcp::core::MaskKindName(
              flashcp::worker::DaemonOptions{}.attention_mask.kind)),
          "the attention mask: causal_document or block_diffusion (then every step runs the "
          "2C rows [noisy ; clean] of its C-token batch; docs/bdlm.md)");
ABSL_FLAG(int64_t, block_size, flashcp::worker::DaemonOptions{}.attention_mask.block_size,
          "block size b of --attention_mask=block_diffusion (>= 1)");
ABSL_FLAG(double, target_imbalance, flashcp::worker::DaemonOptions{}.target_imbalance,
          "target imbalance for flashcp; 0: the planner's default");
ABSL_FLAG(int32_t, heads, flashcp::worker::DaemonOptions{}.heads, "attention heads (H)");
ABSL_FLAG(int32_t, head_dim, flashcp::worker::DaemonOptions{}.head_dim, "head dimension (D)");
ABSL_FLAG(int64_t, steps, flashcp::worker::DaemonOptions{}.steps,
          "steps of the first run; 0: wait for WorkerControl.StartRun");
ABSL_FLAG(int32_t, prefetch, flashcp::worker::DaemonOptions{}.prefetch,
          "plans requested ahead of the step (driver)");
ABSL_FLAG(int32_t, timeout_s,
          static_cast<int32_t>(absl::ToInt64Seconds(flashcp::worker::DaemonOptions{}.timeout)),
          "bound on group formation and on every collective, seconds");
ABSL_FLAG(int32_t, threads, flashcp::worker::DaemonOptions{}.threads,
          "attention kernel threads of this rank");
ABSL_FLAG(uint64_t, seed, flashcp::worker::DaemonOptions{}.seed,
          "seed of the batches and of Q, K, V");
ABSL_FLAG(bool, linger, flashcp::worker::DaemonOptions{}.linger,
          "after a run, keep serving (metrics, control) until SIGTERM");
ABSL_FLAG(int32_t, local_rank, flashcp::worker::WorkerOptions{}.local_rank,
          "this rank's index on its host, exported as the local_rank label of every metric "
          "(the launcher sets it); -1: no label");
ABSL_FLAG(std::string, gloo_host, flashcp::worker::DaemonOptions{}.gloo_hostname,
          "address this rank's Gloo TCP transport listens on (the pod IP across nodes)");
ABSL_FLAG(int64_t, progress_every, flashcp::worker::DaemonOptions{}.progress_every,
          "driver: log progress every N steps to stderr; 0: never");
ABSL_FLAG(std::string, cost_profile, flashcp::worker::DaemonOptions{}.cost_profile,
          "the cost profile plans balance (pairs, h200-cudnn, cpu-fp32; empty: pairs); any "
          "but pairs: the driver reports measured step times so the planner calibrates it");
ABSL_FLAG(std::string, cluster, flashcp::worker::DaemonOptions{}.cluster,
          "a cluster preset (h100-sxm, h200): plans carry the step-time model's predicted step "
          "on it, exported beside the measured one; empty: none");
ABSL_FLAG(int32_t, report_every, flashcp::worker::DaemonOptions{}.report_every,
          "driver: steps per ReportStepTimes call (1..64)");
ABSL_FLAG(int32_t, rank_speed_window, flashcp::worker::DaemonOptions{}.rank_speed_window,
          "driver, with a calibrated cost profile: fit per-rank speeds over this many steps "
          "and plan with them (0: off; docs/workers.md, \"Calibration\")");

namespace fc = flashcp::client;
namespace fw = flashcp::worker;

namespace {

// FLASHCP_JOB_SECRET: the job's rendezvous credential, which the launcher
// makes once per job and gives every rank (docs/deploy.md, "Trust and
// limits"); unset: the planner's open namespace.
std::string JobSecretFromEnvironment() {
  const char* secret = std::getenv("FLASHCP_JOB_SECRET");
  return secret == nullptr ? std::string() : std::string(secret);
}

// The flags as WorkerOptions, `tls` the --tls_* flags (the planner channel's,
// client/internal/tls_flags.h: spelled and checked as flashcp-client's), not
// yet in WorkerOptions::channel: InvalidArgument naming the flag for a bad
// value.
absl::StatusOr<fw::WorkerOptions> OptionsFromFlags(const flashcp::core::CommandLine& line,
                                                   std::optional<fc::TlsOptions>& tls) {
  FLASHCP_ASSIGN_OR_RETURN(const flashcp::core::Dataset dataset,
                           flashcp::core::DatasetFromFlag(absl::GetFlag(FLAGS_dataset)));
  const auto scheme = flashcp::core::ParseCommScheme(absl::GetFlag(FLAGS_scheme));
  if (!scheme.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--scheme: ", scheme.status().message()));
  }
  const auto mask_kind = flashcp::core::ParseMaskKind(absl::GetFlag(FLAGS_attention_mask));
  if (!mask_kind.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", mask_kind.status().message()));
  }
  std::random_device entropy;
  fw::WorkerOptions w{
      .daemon = {.rank = absl::GetFlag(FLAGS_rank),
                 .world_size = absl::GetFlag(FLAGS_world_size),
                 .group = absl::GetFlag(FLAGS_group),
                 .device = absl::GetFlag(FLAGS_device),
                 .dataset = dataset,
                 .context = absl::GetFlag(FLAGS_context),
                 .strategy = absl::GetFlag(FLAGS_strategy),
                 .scheme = *scheme,
                 .attention_mask = {*mask_kind, absl::GetFlag(FLAGS_block_size)},
                 .target_imbalance = absl::GetFlag(FLAGS_target_imbalance),
                 .heads = absl::GetFlag(FLAGS_heads),
                 .head_dim = absl::GetFlag(FLAGS_head_dim),
                 .steps = absl::GetFlag(FLAGS_steps),
                 .prefetch = absl::GetFlag(FLAGS_prefetch),
                 .timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s)),
                 .threads = absl::GetFlag(FLAGS_threads),
                 .seed = absl::GetFlag(FLAGS_seed),
                 .linger = absl::GetFlag(FLAGS_linger),
                 // This process's identity for Join and Leave.
                 .incarnation = (uint64_t{entropy()} << 32) ^ entropy() ^
                                static_cast<uint64_t>(getpid()),
                 // From the environment, not a flag: a flag shows in `ps`.
                 .job_secret = JobSecretFromEnvironment(),
                 .progress_every = absl::GetFlag(FLAGS_progress_every),
                 .gloo_hostname = absl::GetFlag(FLAGS_gloo_host),
                 .cost_profile = absl::GetFlag(FLAGS_cost_profile),
                 .report_every = absl::GetFlag(FLAGS_report_every),
                 .rank_speed_window = absl::GetFlag(FLAGS_rank_speed_window),
                 .cluster = absl::GetFlag(FLAGS_cluster)},
      .planner = absl::GetFlag(FLAGS_planner),
      .rendezvous = absl::GetFlag(FLAGS_rendezvous),
      .channel = {},
      .metrics = absl::GetFlag(FLAGS_metrics),
      .metrics_http = flashcp::core::runtime::metrics_endpoint::EndpointOptionsFromFlags(),
      .control = absl::GetFlag(FLAGS_control),
      .connections = {},
      .local_rank = absl::GetFlag(FLAGS_local_rank),
      .version = FLASHCP_VERSION,
      .cuda = nullptr};
#ifdef FLASHCP_WORKER_CUDA
  w.cuda = flashcp::worker::cuda::MakeCudaRankBackend;
#endif
  FLASHCP_RETURN_IF_ERROR(fw::ValidateWorkerOptions(w));
  FLASHCP_ASSIGN_OR_RETURN(tls, fc::internal::TlsFromFlags(line));
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  flashcp::core::CommandLine line;
  if (std::optional<int> rc = flashcp::core::ParseMain(
          argc, argv,
          "Usage: flashcp-worker [--flag=value ...]\n\nOne rank of a FlashCP worker group.", line,
          std::cout, std::cerr)) {
    return *rc;  // 0 after --help; 2 for a bad flag or a stray word
  }
  std::optional<fc::TlsOptions> tls;
  absl::StatusOr<fw::WorkerOptions> options = OptionsFromFlags(line, tls);
  if (!options.ok()) {
    return flashcp::core::UsageError("flashcp-worker", options.status(), std::cerr);
  }
  absl::Status status = absl::OkStatus();
  if (tls.has_value()) {
    absl::StatusOr<fc::ChannelOptions> channel = fc::WithTls(fc::ChannelOptions(), *tls);
    if (channel.ok()) options->channel = *std::move(channel);
    status = channel.status();
  }
  if (status.ok()) status = fw::RunWorker(*options, std::make_shared<prometheus::Registry>());
  // The WORKER and RUN lines are the run's report; a full disk or a closed
  // pipe must not pass for success.
  if (status.ok() && (std::fflush(stdout) != 0 || std::ferror(stdout))) {
    status = absl::DataLossError("error writing the output (the WORKER and RUN lines) to stdout");
  }
  if (!status.ok()) {
    FLASHCP_LOG(ERROR) << "flashcp-worker rank " << absl::GetFlag(FLAGS_rank) << ": "
                       << status.ToString();
    return 1;
  }
  FLASHCP_LOG(INFO) << "flashcp-worker rank " << options->daemon.rank << ": done";
  return 0;
}
