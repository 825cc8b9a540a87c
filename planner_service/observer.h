// What the service reports as it works: the seam between the service and its
// metrics (STYLE item 9). PrometheusMetrics (metrics.h) implements it for the
// binary; tests use a recording fake. Implementations must be thread-safe and
// cheap: they are called on gRPC and planning threads, sometimes under locks.
#ifndef FLASHCP_PLANNER_SERVICE_OBSERVER_H_
#define FLASHCP_PLANNER_SERVICE_OBSERVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/analysis.h"
#include "core/cost_model.h"
#include "core/strategies.h"
#include "proto/plan_batch.h"

namespace flashcp::planner_service {

// OnPlanned (one successful plan: its planning and analysis time and its
// quality) comes from proto::PlanObserver, what PlanBatch reports to.
class ServiceObserver : public proto::PlanObserver {
 public:

  // One answered request: a unary call, or one PlanStream item. `method` is
  // the RPC's name ("Plan", "PlanStream", ...); `seconds` from receipt to
  // answer (for a stream item: read to its response handed to gRPC).
  virtual void OnRequestDone(absl::string_view method, absl::StatusCode code,
                             double seconds) = 0;

  // Requests (unary calls and stream items) received and not yet answered;
  // `delta` is +1 or -1.
  virtual void OnInflightChange(int delta) = 0;

  // Planning jobs waiting in the pool's queue (not yet running).
  virtual void OnQueueDepth(int64_t depth) = 0;

  // Response bytes all PlanStreams hold for their clients (HeldBytes), after
  // every change.
  virtual void OnStreamHeldBytes(int64_t bytes) = 0;

  // A refit of one tenant's window of `profile` (calibration.h) after
  // reports of `accepted` samples in all; `state` is that window's.
  virtual void OnCalibration(absl::string_view profile, int64_t accepted,
                             const core::CostCalibrator::State& state) {
    (void)profile;
    (void)accepted;
    (void)state;
  }
};

// What the planner's Rendezvous (rendezvous_service.h) reports as groups form
// and fail. Called under the rendezvous state's lock: implementations must not
// call back into it.
class RendezvousObserver {
 public:
  enum class Event {
    kJoin,     // a member joined (a new rank, or a new incarnation replacing one)
    kFormed,   // a group's world_size ranks were members for the first time
    kAbort,    // a group was aborted (the first report; later ones are no event)
    kReform,   // a new incarnation joined an aborted group and started it afresh
    kExpired,  // an idle group was dropped (no member call for the idle timeout)
  };
  virtual ~RendezvousObserver() = default;
  virtual void OnRendezvousEvent(Event event) = 0;
  // The groups and members held, after each Join, Leave and expiry (which
  // may leave both as they were).
  virtual void OnRendezvousSize(int64_t groups, int64_t members) = 0;
};

// Reports nothing.
class NullRendezvousObserver final : public RendezvousObserver {
 public:
  void OnRendezvousEvent(Event) override {}
  void OnRendezvousSize(int64_t, int64_t) override {}
};

// Reports nothing.
class NullObserver final : public ServiceObserver {
 public:
  void OnRequestDone(absl::string_view, absl::StatusCode, double) override {}
  void OnInflightChange(int) override {}
  void OnQueueDepth(int64_t) override {}
  void OnStreamHeldBytes(int64_t) override {}
  void OnPlanned(core::Strategy, double, const core::PlanMetrics&) override {}
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_OBSERVER_H_
