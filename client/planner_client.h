// The planner client interface: what callers of the flashcp.v1 Planner service
// program against. Implementations: GrpcPlannerClient (the wire),
// RetryingPlannerClient and LoggingPlannerClient (decorators around another
// client), and MockPlannerClient (client/testing/) for tests.
//
// Messages are the flashcp.v1 protos (the service's contract); callers that
// want core structs convert at their own edge with proto/convert.h.
#ifndef FLASHCP_CLIENT_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_PLANNER_CLIENT_H_

#include <future>
#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "flashcp/v1/planner.pb.h"

namespace flashcp::client {

namespace v1 = ::flashcp::v1;

// Per-call settings.
struct CallOptions {
  // Deadline of one attempt, measured from when the attempt starts. A retrying
  // client bounds all attempts together with RetryPolicy::total_timeout.
  absl::Duration timeout = absl::Seconds(30);
  // Wait for the channel to become ready instead of failing fast with
  // UNAVAILABLE while the server is unreachable (gRPC's wait_for_ready).
  bool wait_for_ready = false;
};

// One bidirectional PlanStream call. One thread may call Write/WritesDone
// while another calls Read; neither may be called concurrently with itself.
class PlanStream {
 public:
  virtual ~PlanStream() = default;
  // Sends one request; blocks under flow control. False once the stream is
  // broken (then Finish() says why).
  virtual bool Write(const v1::PlanRequest& request) = 0;
  // Half-closes the sending side. False if the stream is broken.
  virtual bool WritesDone() = 0;
  // Blocks for the next response; false at the end of the stream or when it
  // is broken.
  virtual bool Read(v1::PlanResponse* response) = 0;
  // Cancels the call; pending and later Write/Read return false.
  virtual void Cancel() = 0;
  // After Read returned false: the call's final status.
  virtual absl::Status Finish() = 0;
};

using PlanResult = absl::StatusOr<v1::PlanResponse>;
// Called exactly once per PlanAsync, possibly on a transport thread: it must
// not block.
using PlanCallback = absl::AnyInvocable<void(PlanResult) &&>;

class PlannerClient {
 public:
  virtual ~PlannerClient() = default;

  // Plans one batch. The server's error codes come back unchanged
  // (INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED, ...);
  // DEADLINE_EXCEEDED when `options.timeout` passes first.
  virtual PlanResult Plan(const v1::PlanRequest& request, const CallOptions& options) = 0;

  // As Plan, without blocking: `done` runs once with the result.
  virtual void PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                         PlanCallback done) = 0;

  // Opens a PlanStream call; its deadline is `options.timeout` for the whole
  // stream. Never null.
  virtual std::unique_ptr<PlanStream> OpenPlanStream(const CallOptions& options) = 0;

  virtual absl::StatusOr<v1::ListStrategiesResponse> ListStrategies(
      const CallOptions& options) = 0;
  virtual absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& options) = 0;

  // Measured step times for the planner's cost calibration. Not idempotent
  // (a repeated report adds its samples twice), so decorators never retry
  // it. The default: UNIMPLEMENTED (clients that do not report).
  virtual absl::StatusOr<v1::ReportStepTimesResponse> ReportStepTimes(
      const v1::ReportStepTimesRequest& request, const CallOptions& options) {
    (void)request;
    (void)options;
    return absl::UnimplementedError("ReportStepTimes: not supported by this client");
  }

  // PlanAsync as a future.
  std::future<PlanResult> PlanFuture(const v1::PlanRequest& request, const CallOptions& options);
};

// The server's info once it answers, waiting up to `timeout` for it to come
// up (GetServerInfo with wait_for_ready), as the tools do before they start.
// A wait that ends in DEADLINE_EXCEEDED does not say why the channel never
// became ready, so one fail-fast GetServerInfo (deadline min(timeout, 1 s))
// follows: its answer if the server has just come up, else DEADLINE_EXCEEDED
// with the fail-fast call's error appended ("...; last connection error:
// UNAVAILABLE: ... Ssl handshake failed ..."). Other errors come back as is.
absl::StatusOr<v1::ServerInfo> WaitForServer(PlannerClient& client, absl::Duration timeout);

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_PLANNER_CLIENT_H_
