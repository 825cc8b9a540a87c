// flashcp-planner: the FlashCP planning service. Serves flashcp.v1.Planner
// and the workers' flashcp.v1.Rendezvous (or one of them, --serve) until
// SIGTERM or SIGINT, then drains and exits 0. Prints one line,
//   LISTENING grpc=HOST:PORT metrics=HOST:PORT
// to stdout once bound; logs go to stderr.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/types.h"
#include "planner_service/server.h"
#include "prometheus/registry.h"
#include "core/runtime/metrics_endpoint/endpoint_flags.h"

ABSL_FLAG(std::string, listen, flashcp::planner_service::ServerOptions{}.listen,
          "gRPC address HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, serve, "all",
          "services: all (Planner and Rendezvous), planning (Planner only: stateless, run as "
          "many replicas as needed) or rendezvous (Rendezvous only: one replica)");
ABSL_FLAG(std::string, metrics, flashcp::planner_service::ServerOptions{}.metrics,
          "Prometheus /metrics address HOST:PORT; port 0 picks one; empty disables");
ABSL_FLAG(int32_t, threads, flashcp::planner_service::ServerOptions{}.threads, "planning threads");
ABSL_FLAG(int32_t, queue_size, flashcp::planner_service::ServerOptions{}.queue_size,
          "planning jobs that may wait; unary calls beyond get RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, queue_per_client, flashcp::planner_service::ServerOptions{}.queue_per_client,
          "planning jobs one client (connection) may have waiting; 0: queue_size / 4");
ABSL_FLAG(int32_t, stream_window, flashcp::planner_service::ServerOptions{}.stream_window,
          "items one PlanStream may have in flight");
ABSL_FLAG(int64_t, stream_window_bytes,
          flashcp::planner_service::ServerOptions{}.stream_window_bytes,
          "unread response bytes one PlanStream may hold before it stops reading");
ABSL_FLAG(int64_t, stream_buffer_bytes,
          flashcp::planner_service::ServerOptions{}.stream_buffer_bytes,
          "unread response bytes all PlanStreams together may hold before they stop reading");
ABSL_FLAG(int64_t, max_shard_ranks, flashcp::proto::PlanBounds{}.max_shard_ranks,
          "bound on a plan's shards x ranks, from the request; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_response_bytes, flashcp::proto::PlanBounds{}.max_response_bytes,
          "bound on a response's bytes, from the request; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(bool, allow_ilp, flashcp::planner_service::ServerOptions{}.allow_ilp,
          "serve the ilp strategy (slow: own pool, --ilp_threads, --ilp_time_limit)");
ABSL_FLAG(int32_t, ilp_threads, flashcp::planner_service::ServerOptions{}.ilp_threads,
          "ILP plans run at once (as many more may wait)");
ABSL_FLAG(absl::Duration, ilp_time_limit, flashcp::planner_service::ServerOptions{}.ilp_time_limit,
          "wall-clock limit of one ILP plan (a request), from its arrival: queueing and model "
          "setup included; then its best plan so far");
ABSL_FLAG(int64_t, max_docs, flashcp::planner_service::ServerOptions{}.limits.max_docs,
          "documents per batch; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_tokens, flashcp::planner_service::ServerOptions{}.limits.max_tokens,
          "tokens per batch; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_cp_size, flashcp::planner_service::ServerOptions{}.limits.max_cp_size,
          "CP group size; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_message_bytes, flashcp::planner_service::ServerOptions{}.max_message_bytes,
          "largest request message, bytes; 0: the largest valid request at the limits");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate; TLS when set");
ABSL_FLAG(std::string, tls_key, "", "PEM server private key");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA bundle; when set, clients need a cert it signed");
ABSL_FLAG(absl::Duration, drain_timeout, flashcp::planner_service::ServerOptions{}.drain_timeout,
          "on SIGTERM, how long in-flight calls may take before they are cancelled");
ABSL_FLAG(int64_t, rendezvous_max_bytes, flashcp::planner_service::kDefaultMaxTotalValueBytes,
          "bytes all rendezvous groups may hold together, an entry counting key + value + 256 "
          "and a member 1024; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, rendezvous_idle_timeout, flashcp::planner_service::kDefaultIdleTimeout,
          "a rendezvous group that no member called (and none waits in) for this long is dropped "
          "(at least 1s)");
ABSL_FLAG(int64_t, rendezvous_max_waiters, flashcp::planner_service::kDefaultMaxWaiters,
          "rendezvous AwaitMembers/Get calls waiting at once; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, rendezvous_max_waiters_per_peer,
          flashcp::planner_service::kDefaultMaxWaitersPerPeer,
          "rendezvous calls one peer (mTLS identity, else IP address) has waiting at once; above: "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, rendezvous_max_waiter_bytes, flashcp::planner_service::kDefaultMaxWaiterBytes,
          "bytes all waiting rendezvous calls may hold, a Get counting 1024 + 2 x key + 320 per "
          "key; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, rendezvous_max_waiter_bytes_per_peer, 0,
          "bytes one peer's waiting rendezvous calls may hold (counted as for "
          "--rendezvous_max_waiter_bytes); 0: a sixteenth of --rendezvous_max_waiter_bytes; "
          "above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, rendezvous_max_waiters_per_member,
          flashcp::planner_service::kDefaultMaxWaitersPerMember,
          "rendezvous calls one group member (token) has waiting at once; above: "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, rendezvous_form_timeout, flashcp::planner_service::kDefaultFormTimeout,
          "a rendezvous group that has not had all its ranks this long after its creation is "
          "dropped, its waits ending with DEADLINE_EXCEEDED (at least 1s)");
ABSL_FLAG(bool, rendezvous_require_job_secret, false,
          "refuse rendezvous Joins without a job secret (JoinRequest.job_secret; the worker's "
          "FLASHCP_JOB_SECRET): groups then form only among holders of their job's secret");
ABSL_FLAG(int64_t, rendezvous_max_answer_bytes, flashcp::planner_service::kDefaultMaxAnswerBytes,
          "value bytes of rendezvous Get answers being sent at once; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, rendezvous_max_groups_per_peer,
          flashcp::planner_service::kDefaultMaxGroupsPerPeer,
          "rendezvous groups one peer (mTLS identity, else IP address) created that still exist, "
          "formed or not; above: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, handshake_timeout,
          flashcp::planner_service::ServerOptions{}.handshake_timeout,
          "a connection that has not completed its HTTP/2 (and TLS) handshake in this is closed");
ABSL_FLAG(absl::Duration, max_connection_idle,
          flashcp::planner_service::ServerOptions{}.max_connection_idle,
          "a connection with no call for this long is closed (GOAWAY); 0 never");
ABSL_FLAG(absl::Duration, max_connection_age,
          flashcp::planner_service::ServerOptions{}.max_connection_age,
          "a connection is closed (GOAWAY) after this long; 0 never");
ABSL_FLAG(absl::Duration, max_connection_age_grace,
          flashcp::planner_service::ServerOptions{}.max_connection_age_grace,
          "after --max_connection_age, how long its calls may take before it is cut");
ABSL_FLAG(int32_t, grpc_max_threads, flashcp::planner_service::ServerOptions{}.grpc_max_threads,
          "threads gRPC may make for synchronous handlers (health, reflection)");
ABSL_FLAG(absl::Duration, listener_check_interval,
          flashcp::planner_service::ServerOptions{}.listener_check_interval,
          "how often the listener's accept queue is checked; 0 disables the check");
ABSL_FLAG(int32_t, listener_stall_checks,
          flashcp::planner_service::ServerOptions{}.listener_stall_checks,
          "checks in a row with connections left unaccepted before health says NOT_SERVING");
ABSL_FLAG(bool, testing_hold_planning,
          flashcp::planner_service::ServerOptions{}.testing_hold_planning,
          "tests only: plan nothing until SIGUSR1 (makes queue-full and deadline tests "
          "deterministic)");

namespace fps = flashcp::planner_service;

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, which leaves absl::Mutex's
  // deadlock detection on: a lock-order graph update on every lock and unlock
  // of every call's mutexes. The tests keep it (they do not run main).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  flashcp::core::CommandLine line;
  if (std::optional<int> rc = flashcp::core::ParseMain(
          argc, argv, "Usage: flashcp-planner [--flag=value ...]\n\nThe FlashCP planner service.",
          line, std::cout, std::cerr)) {
    return *rc;  // --help, or a bad flag or a stray word (`flashcp-planner 50051`)
  }
  fps::ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  const absl::StatusOr<fps::ServeRole> serve = fps::ParseServeRole(absl::GetFlag(FLAGS_serve));
  if (!serve.ok()) return flashcp::core::UsageError("flashcp-planner", serve.status(), std::cerr);
  o.serve = *serve;
  o.metrics = absl::GetFlag(FLAGS_metrics);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.queue_size = absl::GetFlag(FLAGS_queue_size);
  o.queue_per_client = absl::GetFlag(FLAGS_queue_per_client);
  o.stream_window = absl::GetFlag(FLAGS_stream_window);
  o.stream_window_bytes = absl::GetFlag(FLAGS_stream_window_bytes);
  o.stream_buffer_bytes = absl::GetFlag(FLAGS_stream_buffer_bytes);
  o.bounds.max_shard_ranks = absl::GetFlag(FLAGS_max_shard_ranks);
  o.bounds.max_response_bytes = absl::GetFlag(FLAGS_max_response_bytes);
  o.allow_ilp = absl::GetFlag(FLAGS_allow_ilp);
  o.ilp_threads = absl::GetFlag(FLAGS_ilp_threads);
  o.ilp_time_limit = absl::GetFlag(FLAGS_ilp_time_limit);
  o.limits = {absl::GetFlag(FLAGS_max_docs), absl::GetFlag(FLAGS_max_tokens),
              absl::GetFlag(FLAGS_max_cp_size)};
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  o.rendezvous.max_total_bytes = absl::GetFlag(FLAGS_rendezvous_max_bytes);
  o.rendezvous.idle_timeout = absl::GetFlag(FLAGS_rendezvous_idle_timeout);
  o.rendezvous.max_waiters = absl::GetFlag(FLAGS_rendezvous_max_waiters);
  o.rendezvous.max_waiters_per_peer = absl::GetFlag(FLAGS_rendezvous_max_waiters_per_peer);
  o.rendezvous.max_waiter_bytes = absl::GetFlag(FLAGS_rendezvous_max_waiter_bytes);
  o.rendezvous.max_answer_bytes = absl::GetFlag(FLAGS_rendezvous_max_answer_bytes);
  o.rendezvous.max_groups_per_peer = absl::GetFlag(FLAGS_rendezvous_max_groups_per_peer);
  o.rendezvous.max_waiter_bytes_per_peer =
      absl::GetFlag(FLAGS_rendezvous_max_waiter_bytes_per_peer);
  o.rendezvous.form_timeout = absl::GetFlag(FLAGS_rendezvous_form_timeout);
  o.rendezvous.max_waiters_per_member = absl::GetFlag(FLAGS_rendezvous_max_waiters_per_member);
  o.rendezvous.require_job_secret = absl::GetFlag(FLAGS_rendezvous_require_job_secret);
  o.handshake_timeout = absl::GetFlag(FLAGS_handshake_timeout);
  o.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle);
  o.max_connection_age = absl::GetFlag(FLAGS_max_connection_age);
  o.max_connection_age_grace = absl::GetFlag(FLAGS_max_connection_age_grace);
  o.grpc_max_threads = absl::GetFlag(FLAGS_grpc_max_threads);
  o.listener_check_interval = absl::GetFlag(FLAGS_listener_check_interval);
  o.listener_stall_checks = absl::GetFlag(FLAGS_listener_stall_checks);
  o.metrics_http = flashcp::core::runtime::metrics_endpoint::EndpointOptionsFromFlags();
  o.testing_hold_planning = absl::GetFlag(FLAGS_testing_hold_planning);
  o.version = FLASHCP_VERSION;
  if (absl::Status s = fps::ValidateOptions(o); !s.ok()) {
    return flashcp::core::UsageError("flashcp-planner", s, std::cerr);
  }
  const absl::Status status = fps::RunPlanner(o, std::make_shared<prometheus::Registry>());
  if (!status.ok()) {
    FLASHCP_LOG(ERROR) << "flashcp-planner: " << status.ToString();
    return 1;
  }
  return 0;
}
