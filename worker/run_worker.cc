#include "worker/run_worker.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "core/runtime/listener/resilient_server.h"
#include "prometheus/registry.h"
#include "core/runtime/process/host_port.h"
#include "core/runtime/process/signals.h"
#include "worker/control_service.h"
#include "worker/daemon.h"
#include "worker/gloo_communicator.h"
#include "worker/metrics.h"

namespace flashcp::worker {
namespace {

std::string Host(const std::string& address) { return address.substr(0, address.rfind(':')); }

// The process's observer: the metrics, and each run's summary line on stdout
// (the run's report, with the WORKER line).
class PrintingObserver final : public WorkerObserver {
 public:
  explicit PrintingObserver(WorkerObserver& metrics) : metrics_(metrics) {}
  void OnRunStart(absl::string_view strategy, absl::string_view scheme) override {
    metrics_.OnRunStart(strategy, scheme);
  }
  void OnStep(absl::string_view strategy, absl::string_view scheme,
              const StepRecord& record) override {
    metrics_.OnStep(strategy, scheme, record);
  }
  void OnGroupEvent(GroupEvent event, const absl::Status& status) override {
    metrics_.OnGroupEvent(event, status);
  }
  void OnRunEnd(absl::string_view summary) override {
    metrics_.OnRunEnd(summary);
    std::fprintf(stdout, "%.*s\n", static_cast<int>(summary.size()), summary.data());
    std::fflush(stdout);
  }

 private:
  WorkerObserver& metrics_;
};

}  // namespace

absl::Status ValidateWorkerOptions(const WorkerOptions& o) {
  FLASHCP_RETURN_IF_ERROR(ValidateDaemonOptions(o.daemon));
  if (o.local_rank < -1 || o.local_rank > 4095) {
    return absl::InvalidArgumentError(
        absl::StrCat("--local_rank: must be in [-1, 4095], got ", o.local_rank));
  }
  FLASHCP_RETURN_IF_ERROR(core::runtime::process::SplitHostPort(o.control, "--control").status());
  FLASHCP_RETURN_IF_ERROR(core::runtime::process::SplitHostPort(o.metrics, "--metrics").status());
  return absl::OkStatus();
}

absl::Status RunWorker(const WorkerOptions& options,
                       std::shared_ptr<prometheus::Registry> registry) {
  // Signals go to the waiter thread only: blocked before any thread starts.
  // SIGUSR2 is internal: the daemon has finished.
  const core::runtime::process::SignalWaiter signals({SIGTERM, SIGINT, SIGUSR2});
  IgnoreSigpipe();  // a dead peer fails the collective, not this process
  FLASHCP_RETURN_IF_ERROR(ValidateWorkerOptions(options));
  const DaemonOptions& o = options.daemon;

  FLASHCP_ASSIGN_OR_RETURN(
      std::unique_ptr<core::runtime::metrics_endpoint::MetricsServer> exposer,
      core::runtime::metrics_endpoint::MetricsServer::Start(options.metrics, options.metrics_http));
  exposer->RegisterCollectable(registry);
  PrometheusWorkerMetrics metrics(
      *registry, options.version,
      LabelsForDevice(o.device, options.local_rank < 0 ? "" : absl::StrCat(options.local_rank)));
  metrics.SetWorldSize(o.world_size);

  // The plans' channel, and the rendezvous store's: the same one unless
  // options.rendezvous names a service of its own.
  auto channel = client::MakeChannel(options.planner, options.channel);
  std::shared_ptr<v1::Rendezvous::StubInterface> rendezvous = v1::Rendezvous::NewStub(
      options.rendezvous.empty() ? channel
                                 : client::MakeChannel(options.rendezvous, options.channel));
  auto planner = std::make_shared<client::GrpcPlannerClient>(channel);
  const core::RealClock clock;
  BackendConfig backend_config;
  backend_config.rank = o.rank;
  backend_config.heads = o.heads;
  backend_config.head_dim = o.head_dim;
  backend_config.threads = o.threads;
  backend_config.clock = &clock;
  FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<RankBackend> backend,
                           MakeRankBackend(o.device, backend_config, options.cuda));
  PrintingObserver observer(metrics);
  WorkerDaemon daemon(o, rendezvous, planner, std::move(backend), &observer, &clock);

  WorkerControlService control(&daemon);
  // The planner's connection bounds, and a listener rebuilt after a stall
  // (an fd flood): the liveness probe's port comes back.
  FLASHCP_ASSIGN_OR_RETURN(
      std::unique_ptr<core::runtime::listener::ResilientServer> server,
      core::runtime::listener::ResilientServer::Start(
          options.control, "--control", grpc::InsecureServerCredentials(), options.connections,
          [&control](grpc::ServerBuilder& builder) { builder.RegisterService(&control); },
          {"flashcp.v1.WorkerControl"}, &clock));
  std::fprintf(stdout, "WORKER rank=%d control=%s:%d metrics=%s:%d\n", o.rank,
               Host(options.control).c_str(), server->port(), Host(options.metrics).c_str(),
               exposer->port());
  std::fflush(stdout);

  std::thread waiter([&] {
    for (;;) {
      const absl::StatusOr<int> sig = signals.Wait();
      if (!sig.ok() || *sig == SIGUSR2) return;
      FLASHCP_LOG(INFO) << (*sig == SIGTERM ? "SIGTERM" : "SIGINT")
                        << ": finishing the step in flight";
      daemon.RequestExit();
    }
  });
  const absl::Status status = daemon.Run();
  server->Shutdown(absl::Now() + absl::Seconds(2));
  // Last, so that a SIGTERM during the drain is still taken, not fatal.
  pthread_kill(waiter.native_handle(), SIGUSR2);
  waiter.join();
  return status;
}

}  // namespace flashcp::worker
