// The planner's online cost calibration (docs/planner.md, "Calibration"):
// core::CostCalibrator behind a mutex, fed by ReportStepTimes and read by
// every plan of a calibrated profile. The fit itself is core's.
#ifndef FLASHCP_PLANNER_SERVICE_CALIBRATION_H_
#define FLASHCP_PLANNER_SERVICE_CALIBRATION_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/cost_model.h"
#include "planner_service/observer.h"
#include "proto/convert.h"

namespace flashcp::planner_service {

class Calibration {
 public:
  // `observer` outlives this; `window`: samples kept per profile.
  explicit Calibration(ServiceObserver* observer, int64_t window = 4096)
      : observer_(observer), calibrator_(window) {}

  // Adds a validated report (proto::StepTimesFromProto) and refits; reports
  // the state to the observer. The calibrator's errors unchanged.
  absl::StatusOr<core::CostCalibrator::State> Report(const proto::StepTimesReport& report);

  // Where `input` names a calibrated profile, plans it with the fit.
  void Apply(proto::PlanInput& input) const;

 private:
  ServiceObserver* const observer_;
  mutable absl::Mutex mu_;
  core::CostCalibrator calibrator_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_CALIBRATION_H_
