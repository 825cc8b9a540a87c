// A gRPC server whose listener comes back. gRPC 1.51's TCP listener stops
// accepting for good after one accept4() failure such as EMFILE (the fd
// limit reached by a connection flood; listener_watchdog.h): calls on
// existing connections go on, new clients wait forever. ResilientServer
// watches the listening socket's accept queue (ListenerWatchdog) and, once
// it has stalled, says NOT_SERVING, shuts the server down (its connections
// close, which frees their fds; calls still running after
// options.rebuild_grace are cancelled) and builds a new one on the same port,
// retrying every check until the bind succeeds. The planner and the worker's
// control port both serve through it, with the same connection bounds
// (ConnectionOptions: handshake timeout, idle and age limits, no
// SO_REUSEPORT, a thread quota).
#ifndef FLASHCP_PLANNER_SERVICE_LISTENER_RESILIENT_SERVER_H_
#define FLASHCP_PLANNER_SERVICE_LISTENER_RESILIENT_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "grpcpp/grpcpp.h"
#include "core/runtime/listener/listener_watchdog.h"

namespace flashcp::core::runtime::listener {

// What bounds a server's connections (docs/deploy.md, "Connections"). gRPC
// 1.51 has no bound on their number; the fd limit is the bound, and these
// reap the idle ones.
struct ConnectionOptions {
  absl::Duration handshake_timeout = absl::Seconds(10);      // TCP open, no HTTP/2 (TLS) yet
  absl::Duration max_connection_idle = absl::Minutes(5);     // no call for this long: GOAWAY
  absl::Duration max_connection_age = absl::ZeroDuration();  // 0: unbounded
  absl::Duration max_connection_age_grace = absl::Minutes(1);  // calls may finish, then closed
  int max_threads = 2048;  // threads gRPC may make for synchronous handlers, >= 2
  // The listener check (listener_watchdog.h): every interval (0: off), a
  // stall after stall_checks checks in a row.
  absl::Duration listener_check_interval = absl::Seconds(1);
  int listener_stall_checks = 5;  // >= 1
  // When a stalled server is rebuilt, how long its calls may still finish.
  absl::Duration rebuild_grace = absl::Seconds(1);
};

class ResilientServer {
 public:
  // Adds the services, message limits and plugins of one server generation
  // to `builder` (called for the first server and again for each rebuild).
  using Configure = std::function<void(grpc::ServerBuilder& builder)>;

  // Binds `listen` (HOST:PORT; port 0 picks one, which rebuilds keep) with
  // `credentials`, configured by `configure`, and starts serving; health
  // (grpc.health.v1) says SERVING for "" and each of `health_services` while
  // the listener accepts. Unavailable naming `flag` if it cannot listen.
  // `clock` (the watchdog's and the rebuild's) must outlive the server.
  static absl::StatusOr<std::unique_ptr<ResilientServer>> Start(
      const std::string& listen, const std::string& flag,
      std::shared_ptr<grpc::ServerCredentials> credentials, const ConnectionOptions& options,
      Configure configure, std::vector<std::string> health_services, const core::WaitClock* clock);
  ~ResilientServer();  // Shutdown(now)
  ResilientServer(const ResilientServer&) = delete;
  ResilientServer& operator=(const ResilientServer&) = delete;

  int port() const { return port_; }
  // Servers built after a stall (tests read it).
  int64_t rebuilds() const;

  // The drain begins: the listener is no longer watched or rebuilt, and
  // health says NOT_SERVING. Idempotent.
  void BeginDrain();
  // BeginDrain, then the server refuses new calls and waits for those in
  // flight until `deadline` (then cancels them). Idempotent.
  void Shutdown(absl::Time deadline);

 private:
  ResilientServer(std::string host, std::shared_ptr<grpc::ServerCredentials> credentials,
                  ConnectionOptions options, Configure configure,
                  std::vector<std::string> health_services, const core::WaitClock* clock)
      : host_(std::move(host)),
        credentials_(std::move(credentials)),
        options_(options),
        configure_(std::move(configure)),
        health_services_(std::move(health_services)),
        clock_(clock) {}
  // Builds a server on port_ (0 at first); false if it cannot listen.
  bool Build() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetHealth(bool serving) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watchdog's sample: the accept queue's length; 1 (a stall goes on)
  // while no server could be rebuilt, after trying again.
  absl::StatusOr<int64_t> Sample();
  // The watchdog's verdict: health, and on a stall the rebuild.
  void OnVerdict(bool accepting);

  const std::string host_;
  const std::shared_ptr<grpc::ServerCredentials> credentials_;
  const ConnectionOptions options_;
  const Configure configure_;
  const std::vector<std::string> health_services_;
  const core::WaitClock* const clock_;
  int port_ = 0;  // fixed by the first Build
  mutable absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);  // null while none could be built
  std::unique_ptr<AcceptQueue> accept_queue_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool built_ ABSL_GUARDED_BY(mu_) = false;  // a server was built once
  int64_t rebuilds_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<ListenerWatchdog> watchdog_;  // set once after the first Build
};

}  // namespace flashcp::core::runtime::listener

#endif  // FLASHCP_PLANNER_SERVICE_LISTENER_RESILIENT_SERVER_H_
