#include "core/runtime/listener/resilient_server.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "core/runtime/process/host_port.h"

namespace flashcp::core::runtime::listener {
namespace {

// A duration as a gRPC channel argument in ms; 0 (off) as INT_MAX, gRPC's "never".
int ChannelArgMs(absl::Duration d) {
  if (d == absl::ZeroDuration()) return INT_MAX;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT_MAX));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResilientServer>> ResilientServer::Start(
    const std::string& listen, const std::string& flag,
    std::shared_ptr<grpc::ServerCredentials> credentials, const ConnectionOptions& options,
    Configure configure, std::vector<std::string> health_services, const core::WaitClock* clock) {
  FLASHCP_ASSIGN_OR_RETURN(const auto host_port, process::SplitHostPort(listen, flag));
  // Health answers on every server this process builds.
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<ResilientServer> s(new ResilientServer(host_port.first, std::move(credentials),
                                                         options, std::move(configure),
                                                         std::move(health_services), clock));
  s->port_ = host_port.second;
  {
    absl::MutexLock lock(&s->mu_);
    if (!s->Build()) {
      return absl::UnavailableError(
          absl::StrCat(flag, ": cannot listen on ", listen, " (address in use?)"));
    }
    if (options.listener_check_interval > absl::ZeroDuration() && s->accept_queue_ == nullptr) {
      FLASHCP_ASSIGN_OR_RETURN(s->accept_queue_, AcceptQueue::Find(s->port_));
    }
  }
  if (options.listener_check_interval > absl::ZeroDuration()) {
    ResilientServer* server = s.get();
    s->watchdog_ = std::make_unique<ListenerWatchdog>(
        [server] { return server->Sample(); },
        ListenerWatchdog::Options{options.listener_check_interval, options.listener_stall_checks},
        clock, [server](bool accepting) { server->OnVerdict(accepting); });
  }
  return s;
}

ResilientServer::~ResilientServer() { Shutdown(absl::Now()); }

bool ResilientServer::Build() {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(host_, ":", port_), credentials_, &port);
  configure_(builder);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             ChannelArgMs(options_.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             ChannelArgMs(options_.max_connection_idle));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                             ChannelArgMs(options_.max_connection_age));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             ChannelArgMs(options_.max_connection_age_grace));
  // gRPC sets SO_REUSEPORT by default: a second process on a port in use
  // would start and take half its connections (splitting rendezvous groups).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota quota("flashcp-server");
  quota.SetMaxThreads(options_.max_threads);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return false;
  if (built_) ++rebuilds_;
  built_ = true;
  port_ = port;
  server_ = std::move(server);
  accept_queue_.reset();
  if (options_.listener_check_interval > absl::ZeroDuration()) {
    // Where the fds are still short this fails; Sample tries again.
    absl::StatusOr<std::unique_ptr<AcceptQueue>> queue = AcceptQueue::Find(port_);
    if (queue.ok()) accept_queue_ = *std::move(queue);
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  for (const std::string& name : health_services_) health->SetServingStatus(name, true);
  return true;
}

void ResilientServer::SetHealth(bool serving) {
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(serving);
}

int64_t ResilientServer::rebuilds() const {
  absl::MutexLock lock(&mu_);
  return rebuilds_;
}

absl::StatusOr<int64_t> ResilientServer::Sample() {
  absl::MutexLock lock(&mu_);
  if (draining_) return 0;
  if (server_ == nullptr && !Build()) return 1;  // still no listener: the stall goes on
  if (accept_queue_ == nullptr) {
    FLASHCP_ASSIGN_OR_RETURN(accept_queue_, AcceptQueue::Find(port_));
  }
  return accept_queue_->Length();
}

void ResilientServer::OnVerdict(bool accepting) {
  absl::MutexLock lock(&mu_);
  if (draining_) return;
  if (accepting) {
    FLASHCP_LOG(INFO) << "listener on port " << port_ << " accepts again; health SERVING";
    SetHealth(true);
    return;
  }
  FLASHCP_LOG(ERROR) << "listener on port " << port_ << " has left connections unaccepted for "
                     << options_.listener_stall_checks << " checks "
                     << absl::FormatDuration(options_.listener_check_interval)
                     << " apart (gRPC stops accepting after an accept error such as EMFILE); "
                        "health NOT_SERVING; rebuilding the server on the same port";
  SetHealth(false);
  accept_queue_.reset();
  if (server_ != nullptr) {
    // Its connections close with it, which frees their fds.
    server_->Shutdown(absl::ToChronoTime(absl::Now() + options_.rebuild_grace));
    server_->Wait();
    server_.reset();
  }
  if (!Build()) {
    FLASHCP_LOG(ERROR) << "cannot listen on port " << port_ << " again yet; retrying every "
                       << absl::FormatDuration(options_.listener_check_interval);
  }
}

void ResilientServer::BeginDrain() {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return;
    draining_ = true;
  }
  // Not under mu_: the watchdog's thread may be waiting for it.
  if (watchdog_ != nullptr) watchdog_->Stop();
  absl::MutexLock lock(&mu_);
  SetHealth(false);
}

void ResilientServer::Shutdown(absl::Time deadline) {
  BeginDrain();
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(deadline));
    server_->Wait();
  }
}

}  // namespace flashcp::core::runtime::listener
