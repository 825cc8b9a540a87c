// flashcp-worker: one rank of a FlashCP CP group (worker/daemon.h). Prints
//   WORKER rank=R control=HOST:PORT metrics=HOST:PORT
// to stdout once its endpoints are bound, forms the group through the
// planner's Rendezvous service, runs --steps steps (the driver, rank 0, also
// prints a `RUN {...}` summary line per run) and exits 0; a failure (a bad
// flag value included) exits 1 with the reason on stderr; a positional
// argument exits 2. SIGTERM or SIGINT: the group finishes the step in flight
// and every rank exits 0.
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
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "client/internal/tool_args.h"
#include "core/clock.h"
#include "core/flags.h"
#include "core/log.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "planner_service/metrics_endpoint/metrics_endpoint.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "worker/daemon.h"
#include "worker/gloo_communicator.h"
#include "worker/rank_backend.h"
#ifdef FLASHCP_WORKER_CUDA
#include "worker/cuda/cuda_rank_backend.h"
#endif

namespace {
// The --tls_* flags given on the command line (absl::ParseCommandLine runs
// their OnUpdate callbacks; main clears the calls made at registration), by
// name without the dashes.
std::set<std::string>& GivenTlsFlags() {
  static auto* given = new std::set<std::string>;
  return *given;
}
}  // namespace

ABSL_FLAG(int32_t, rank, 0, "this process's rank in the group, 0 is the driver");
ABSL_FLAG(int32_t, world_size, 1, "ranks in the CP group (N)");
ABSL_FLAG(std::string, group, "g0", "CP group name, [A-Za-z0-9._-]{1,64}");
ABSL_FLAG(std::string, planner, "127.0.0.1:50051", "planner gRPC address HOST:PORT");
ABSL_FLAG(std::string, rendezvous, "",
          "address HOST:PORT of the flashcp.v1.Rendezvous that forms the group (a "
          "flashcp-planner --serve=rendezvous); empty: the --planner");
ABSL_FLAG(std::string, metrics, "127.0.0.1:0", "Prometheus /metrics HOST:PORT; port 0 picks one");
ABSL_FLAG(int32_t, metrics_threads, 4, "connections the /metrics server serves at once");
ABSL_FLAG(absl::Duration, metrics_request_timeout, absl::Seconds(2),
          "a /metrics connection that has not sent its request in this is closed");
ABSL_FLAG(std::string, control, "127.0.0.1:0",
          "flashcp.v1.WorkerControl HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda:K (a build with CUDA; K the device index)");
ABSL_FLAG(std::string, dataset, "pile", "document-length distribution: wlbllm, pile, redpajama");
ABSL_FLAG(int64_t, context, 16384, "tokens per batch (C)");
ABSL_FLAG(std::string, strategy, "flashcp", "planner strategy");
ABSL_FLAG(std::string, scheme, "allgather", "KV exchange: full_kv, allgather, targeted");
ABSL_FLAG(double, target_imbalance, 0, "target imbalance for flashcp; 0: the planner's default");
ABSL_FLAG(int32_t, heads, 4, "attention heads (H)");
ABSL_FLAG(int32_t, head_dim, 64, "head dimension (D)");
ABSL_FLAG(int64_t, steps, 100, "steps of the first run; 0: wait for WorkerControl.StartRun");
ABSL_FLAG(int32_t, prefetch, 4, "plans requested ahead of the step (driver)");
ABSL_FLAG(int32_t, timeout_s, 30, "bound on group formation and on every collective, seconds");
ABSL_FLAG(int32_t, threads, 1, "attention kernel threads of this rank");
ABSL_FLAG(uint64_t, seed, 1, "seed of the batches and of Q, K, V");
ABSL_FLAG(bool, linger, false, "after a run, keep serving (metrics, control) until SIGTERM");
ABSL_FLAG(int32_t, local_rank, -1,
          "this rank's index on its host, exported as the local_rank label of every metric "
          "(the launcher sets it); -1: no label");
ABSL_FLAG(std::string, gloo_host, "127.0.0.1",
          "address this rank's Gloo TCP transport listens on (the pod IP across nodes)");
// The planner connection's TLS, spelled and checked as flashcp-client's
// (client::internal::TlsOptionsFromArgs; README, "TLS"): TLS iff --tls_ca.
// OnUpdate records that a flag was given, so that an empty value is refused
// as flashcp-client refuses it rather than taken for an absent flag.
ABSL_FLAG(std::string, tls_ca, "",
          "TLS to the planner: PEM CA bundle its certificate must chain to; plaintext without it")
    .OnUpdate([] { GivenTlsFlags().insert("tls_ca"); });
ABSL_FLAG(std::string, tls_cert, "",
          "mTLS: PEM client certificate (for a planner run with --tls_client_ca); needs "
          "--tls_ca and --tls_key")
    .OnUpdate([] { GivenTlsFlags().insert("tls_cert"); });
ABSL_FLAG(std::string, tls_key, "", "mTLS: PEM private key of --tls_cert")
    .OnUpdate([] { GivenTlsFlags().insert("tls_key"); });
ABSL_FLAG(std::string, tls_server_name, "",
          "TLS: the name the planner's certificate must carry, when it is not the host of "
          "--planner")
    .OnUpdate([] { GivenTlsFlags().insert("tls_server_name"); });
ABSL_FLAG(int64_t, progress_every, 0, "driver: log progress every N steps to stderr; 0: never");
ABSL_FLAG(std::string, cost_profile, "",
          "the cost profile plans balance (pairs, h200-cudnn, cpu-fp32; empty: pairs); any "
          "but pairs: the driver reports measured step times so the planner calibrates it");
ABSL_FLAG(int32_t, report_every, 8, "driver: steps per ReportStepTimes call (1..64)");

namespace fc = flashcp::client;
namespace fw = flashcp::worker;

namespace {

int Fail(const absl::Status& s) {
  FLASHCP_LOG(ERROR) << "flashcp-worker rank " << absl::GetFlag(FLAGS_rank) << ": "
                     << s.ToString();
  return 1;
}

// The planner channel's options from the --tls_* flags, read by the client
// library as flashcp-client reads its own (TlsOptionsFromArgs, then WithTls):
// plaintext without them; InvalidArgument naming the flag for a bad
// combination or an empty value, NotFound naming the flag and the path for a
// file that cannot be opened.
absl::StatusOr<fc::ChannelOptions> PlannerChannelOptions() {
  const std::pair<const char*, const absl::Flag<std::string>*> flags[] = {
      {"tls_ca", &FLAGS_tls_ca},
      {"tls_cert", &FLAGS_tls_cert},
      {"tls_key", &FLAGS_tls_key},
      {"tls_server_name", &FLAGS_tls_server_name}};
  std::vector<std::string> args;
  for (const auto& [name, flag] : flags) {
    if (GivenTlsFlags().count(name) > 0) {
      args.push_back(absl::StrCat("--", name, "=", absl::GetFlag(*flag)));
    }
  }
  const std::set<std::string> value_flags(std::begin(fc::internal::kTlsFlags),
                                          std::end(fc::internal::kTlsFlags));
  absl::StatusOr<fc::internal::ToolArgs> parsed =
      fc::internal::ToolArgs::Parse(args, value_flags, /*switches=*/{});
  if (!parsed.ok()) return parsed.status();
  absl::StatusOr<std::optional<fc::TlsOptions>> tls = fc::internal::TlsOptionsFromArgs(*parsed);
  if (!tls.ok()) return tls.status();
  if (!tls->has_value()) return fc::ChannelOptions();
  return fc::WithTls(fc::ChannelOptions(), **tls);
}

}  // namespace

int main(int argc, char** argv) {
  // absl also runs each OnUpdate callback once as the flag is registered
  // (static initialisation): only what ParseCommandLine sets counts as given.
  GivenTlsFlags().clear();
  const std::optional<std::vector<char*>> parsed = flashcp::core::ParseFlags(
      argc, argv,
      "Usage: flashcp-worker [--flag=value ...]\n\nOne rank of a FlashCP worker group.",
      std::cout);
  if (!parsed.has_value()) return 0;  // --help
  const std::vector<char*>& positional = *parsed;
  if (positional.size() > 1) {
    // A stray word (`flashcp-worker 1`, a command a container runtime
    // appended) would otherwise be ignored and the rank run on defaults.
    std::fprintf(stderr, "flashcp-worker: unexpected argument \"%s\"; every option is a --flag\n",
                 positional[1]);
    return 2;
  }
  // Signals go to the waiter thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR2);  // internal: the daemon has finished
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  fw::IgnoreSigpipe();  // a dead peer fails the collective, not this process

  fw::DaemonOptions o;
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.group = absl::GetFlag(FLAGS_group);
  o.device = absl::GetFlag(FLAGS_device);
  const auto dataset = flashcp::core::ParseDataset(absl::GetFlag(FLAGS_dataset));
  if (!dataset.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--dataset: ", dataset.status().message())));
  o.dataset = *dataset;
  o.context = absl::GetFlag(FLAGS_context);
  o.strategy = absl::GetFlag(FLAGS_strategy);
  const auto scheme = flashcp::core::ParseCommScheme(absl::GetFlag(FLAGS_scheme));
  if (!scheme.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--scheme: ", scheme.status().message())));
  o.scheme = *scheme;
  o.target_imbalance = absl::GetFlag(FLAGS_target_imbalance);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.head_dim = absl::GetFlag(FLAGS_head_dim);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.prefetch = absl::GetFlag(FLAGS_prefetch);
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  o.threads = absl::GetFlag(FLAGS_threads);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.linger = absl::GetFlag(FLAGS_linger);
  o.progress_every = absl::GetFlag(FLAGS_progress_every);
  o.gloo_hostname = absl::GetFlag(FLAGS_gloo_host);
  o.cost_profile = absl::GetFlag(FLAGS_cost_profile);
  o.report_every = absl::GetFlag(FLAGS_report_every);
  std::random_device entropy;
  o.incarnation = (uint64_t{entropy()} << 32) ^ entropy() ^ static_cast<uint64_t>(getpid());
  if (absl::Status s = fw::ValidateDaemonOptions(o); !s.ok()) return Fail(s);
  const int32_t local_rank = absl::GetFlag(FLAGS_local_rank);
  if (local_rank < -1 || local_rank > 4095) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--local_rank: must be in [-1, 4095], got ", local_rank)));
  }
  const absl::StatusOr<fc::ChannelOptions> channel_options = PlannerChannelOptions();
  if (!channel_options.ok()) return Fail(channel_options.status());

  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
      flashcp::planner_service::metrics_endpoint::StartExposer(absl::GetFlag(FLAGS_metrics),
                                              {absl::GetFlag(FLAGS_metrics_threads),
                                               absl::GetFlag(FLAGS_metrics_request_timeout)});
  if (!exposer.ok()) return Fail(exposer.status());
  (*exposer)->RegisterCollectable(registry);
  fw::WorkerMetrics metrics(
      *registry, FLASHCP_VERSION,
      fw::LabelsForDevice(o.device, local_rank < 0 ? "" : absl::StrCat(local_rank)));
  metrics.SetWorldSize(o.world_size);

  // The plans' channel, and the rendezvous store's: the same one unless
  // --rendezvous names a service of its own; both TLS when the flags ask.
  auto channel = fc::MakeChannel(absl::GetFlag(FLAGS_planner), *channel_options);
  const std::string rendezvous_address = absl::GetFlag(FLAGS_rendezvous);
  std::shared_ptr<flashcp::v1::Rendezvous::StubInterface> rendezvous =
      flashcp::v1::Rendezvous::NewStub(
          rendezvous_address.empty() ? channel
                                     : fc::MakeChannel(rendezvous_address, *channel_options));
  auto planner = std::make_shared<fc::GrpcPlannerClient>(channel);
  const flashcp::core::RealClock clock;
  fw::CudaBackendFactory cuda;  // empty: built without CUDA
#ifdef FLASHCP_WORKER_CUDA
  cuda = flashcp::worker::cuda::MakeCudaRankBackend;
#endif
  fw::BackendConfig backend_config;
  backend_config.rank = o.rank;
  backend_config.heads = o.heads;
  backend_config.head_dim = o.head_dim;
  backend_config.threads = o.threads;
  backend_config.clock = &clock;
  absl::StatusOr<std::unique_ptr<fw::RankBackend>> backend =
      fw::MakeRankBackend(o.device, backend_config, cuda);
  if (!backend.ok()) return Fail(backend.status());
  fw::WorkerDaemon daemon(o, rendezvous, planner, *std::move(backend), &metrics, &clock);

  fw::WorkerControlService control(&daemon);
  // grpc.health.v1.Health on the control port, for the pod's probes: SERVING
  // for "" and "flashcp.v1.WorkerControl" while the process serves; NOT_SERVING
  // once the daemon has ended, as the control server drains.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int control_port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_control), grpc::InsecureServerCredentials(),
                           &control_port);
  builder.RegisterService(&control);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || control_port == 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("--control: cannot listen on ", absl::GetFlag(FLAGS_control))));
  }
  const auto host = [](const std::string& address) {
    return address.substr(0, address.rfind(':'));
  };
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus("flashcp.v1.WorkerControl", true);
  std::fprintf(stdout, "WORKER rank=%d control=%s:%d metrics=%s:%d\n", o.rank,
               host(absl::GetFlag(FLAGS_control)).c_str(), control_port,
               host(absl::GetFlag(FLAGS_metrics)).c_str(), (*exposer)->GetListeningPorts().front());
  std::fflush(stdout);

  std::thread waiter([&] {
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0 || sig == SIGUSR2) return;
      FLASHCP_LOG(INFO) << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                        << ": finishing the step in flight";
      daemon.RequestExit();
    }
  });
  const absl::Status status = daemon.Run();
  pthread_kill(waiter.native_handle(), SIGUSR2);
  waiter.join();
  health->SetServingStatus(false);
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  if (!status.ok()) return Fail(status);
  FLASHCP_LOG(INFO) << "flashcp-worker rank " << o.rank << ": done";
  return 0;
}
