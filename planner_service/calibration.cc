#include "planner_service/calibration.h"

#include <utility>

namespace flashcp::planner_service {

absl::StatusOr<core::CostCalibrator::State> Calibration::Report(
    const proto::StepTimesReport& report) {
  absl::StatusOr<core::CostCalibrator::State> state;
  {
    absl::MutexLock lock(&mu_);
    state = calibrator_.Add(report.cost_profile, report.samples);
  }
  if (state.ok()) observer_->OnCalibration(report.cost_profile, *state);
  return state;
}

void Calibration::Apply(proto::PlanInput& input) const {
  if (input.cost_profile.empty() || input.cost_profile == core::kPairsProfile) return;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::pair<core::CostCoefficients, bool>> r =
      calibrator_.Resolve(input.cost_profile);
  if (r.ok() && r->second) {
    input.options.cost = r->first;
    input.cost_calibrated = true;
  }
}

}  // namespace flashcp::planner_service
