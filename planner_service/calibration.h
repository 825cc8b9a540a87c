// The planner's online cost calibration (docs/planner.md, "Calibration"),
// per tenant: ReportStepTimes feeds a window of samples per (tenant, profile)
// and the plans of that tenant and profile use its fit; nobody else's. The
// fit itself is core's (core::FitCostModel), accepted only near the shipped
// profile (core::CheckFitNearProfile).
//
// Trust (docs/deploy.md, "Trust and limits"): the tenant is the caller's
// mTLS identity where the connection has one, else the connection itself
// (its peer address and port), so a reporter moves only the plans asked for
// by the same identity, or on the same connection. Within a tenant, one
// reporter (a connection) holds at most `max_reporter_share` of a window.
// Refits run on this class's own thread, never on a gRPC thread; a report
// is answered once the refit that includes it has run.
#ifndef FLASHCP_PLANNER_SERVICE_CALIBRATION_H_
#define FLASHCP_PLANNER_SERVICE_CALIBRATION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/cost_model.h"
#include "planner_service/observer.h"
#include "proto/convert.h"

namespace flashcp::planner_service {

struct CalibrationOptions {
  int64_t window = 4096;             // samples kept per (tenant, profile)
  double max_reporter_share = 0.25;  // of `window`, per reporter (at least min_samples)
  int32_t max_tenants = 128;         // least recently reported dropped beyond it
  int32_t max_pending = 64;          // reports waiting for the refit thread
  core::CostFitOptions fit;
};

// Who reports (or plans): `tenant` keys the windows and the fits it plans
// with; `reporter` is the connection, for the per-reporter share.
struct CalibrationCaller {
  std::string tenant;
  std::string reporter;
};

class Calibration {
 public:
  // `observer` outlives this.
  explicit Calibration(ServiceObserver* observer, CalibrationOptions options = {});
  // Runs the refits already queued (their callbacks are called), then stops.
  ~Calibration();
  Calibration(const Calibration&) = delete;
  Calibration& operator=(const Calibration&) = delete;

  using Done = std::function<void(absl::StatusOr<core::CostCalibrator::State>)>;

  // Queues a validated report (proto::StepTimesFromProto) for the refit
  // thread; `done` is called once, from that thread, with the window's state
  // after the refit that includes it (a refused fit: calibrated stays as it
  // was, status says why), or at once, on the calling thread, with
  // RESOURCE_EXHAUSTED when max_pending reports already wait.
  void Report(const CalibrationCaller& caller, proto::StepTimesReport report, Done done);

  // The coefficients `caller` plans `profile` with and whether they are its
  // accepted fit; the shipped ones otherwise. NotFound for an unknown profile.
  absl::StatusOr<std::pair<core::CostCoefficients, bool>> Resolve(
      const std::string& tenant, absl::string_view profile) const;

  // Blocks until no report waits and no refit runs (tests).
  void WaitIdle() const;

 private:
  struct Sample {
    core::CostSample sample;
    uint64_t seq;  // arrival order over the window
  };
  struct Window {
    std::map<std::string, std::deque<Sample>> by_reporter;  // none empty
    int64_t size = 0;
    core::CostCalibrator::State state;
  };
  struct Tenant {
    std::map<std::string, Window> profiles;
    std::list<std::string>::iterator lru;  // in lru_
  };
  struct Pending {
    CalibrationCaller caller;
    proto::StepTimesReport report;
    Done done;
  };

  void Loop();
  // Adds `report`'s samples to `w` under the share and window bounds.
  void AddLocked(Window& w, const std::string& reporter, const std::vector<core::CostSample>& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Tenant& TenantLocked(const std::string& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ServiceObserver* const observer_;
  const CalibrationOptions options_;
  mutable absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the refit thread holds taken reports
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // most recently reported first
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_CALIBRATION_H_
