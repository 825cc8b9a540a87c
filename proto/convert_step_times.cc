#include "proto/convert.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"

// Step-time reports and cost coefficients (ReportStepTimes).
namespace flashcp::proto {

v1::ReportStepTimesResponse StepTimesResponseToProto(int64_t accepted,
                                                     const core::CostCalibrator::State& state) {
  v1::ReportStepTimesResponse r;
  r.set_accepted_samples(accepted);
  r.set_profile_samples(state.samples);
  r.set_calibrated(state.calibrated);
  if (state.calibrated) {
    CostToProto(state.fit.coefficients, r.mutable_fit());
    r.set_fit_mean_abs_rel_error(state.fit.mean_abs_rel_error);
  }
  r.set_fit_status(state.status);
  return r;
}

void CostToProto(const core::CostCoefficients& c, v1::CostCoefficients* out) {
  out->set_whole_pair(c.whole_pair);
  out->set_prefixed_pair(c.prefixed_pair);
  out->set_sequence(c.sequence);
  out->set_token(c.token);
}

core::CostCoefficients CostFromProto(const v1::CostCoefficients& c) {
  return {c.whole_pair(), c.prefixed_pair(), c.sequence(), c.token()};
}

absl::StatusOr<StepTimesReport> StepTimesFromProto(const v1::ReportStepTimesRequest& request) {
  const std::string& profile = request.cost_profile();
  if (profile.empty()) return absl::InvalidArgumentError("cost_profile: required");
  if (static_cast<int64_t>(profile.size()) > kMaxCostProfileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cost_profile: at most ", kMaxCostProfileBytes,
                                                   " bytes, got ", profile.size()));
  }
  FLASHCP_RETURN_IF_ERROR(core::ValidateCalibrationProfile(profile));
  if (request.steps_size() > kMaxReportSteps) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "steps: ", request.steps_size(), " steps, at most ", kMaxReportSteps, " per call"));
  }
  int64_t entries = 0;
  for (const v1::StepTimes& step : request.steps()) entries += step.ranks_size();
  if (entries > kMaxReportRanks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "steps: ", entries, " rank entries, at most ", kMaxReportRanks, " per call"));
  }
  StepTimesReport out;
  out.cost_profile = profile;
  out.samples.reserve(static_cast<size_t>(entries));
  for (int i = 0; i < request.steps_size(); ++i) {
    const v1::StepTimes& step = request.steps(i);
    if (step.cp_size() < 1 || step.ranks_size() != step.cp_size()) {
      return absl::InvalidArgumentError(absl::StrCat("steps[", i, "].ranks: ", step.ranks_size(),
                                                     " entries for cp_size ", step.cp_size()));
    }
    for (int j = 0; j < step.ranks_size(); ++j) {
      const v1::RankStepTime& r = step.ranks(j);
      core::CostSample sample{{r.whole_pairs(), r.prefixed_pairs(), r.sequences(), r.tokens()},
                              r.seconds()};
      if (absl::Status s = core::ValidateCostSample(sample); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("steps[", i, "].ranks[", j, "].", s.message()));
      }
      out.samples.push_back(sample);
    }
  }
  return out;
}

v1::ReportStepTimesRequest StepTimesToProto(absl::string_view cost_profile, int32_t cp_size,
                                            const std::vector<core::CostSample>& samples) {
  v1::ReportStepTimesRequest request;
  request.set_cost_profile(std::string(cost_profile));
  v1::StepTimes* step = nullptr;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (i % static_cast<size_t>(cp_size) == 0) {
      step = request.add_steps();
      step->set_cp_size(cp_size);
    }
    v1::RankStepTime* r = step->add_ranks();
    r->set_whole_pairs(samples[i].features.whole_pairs);
    r->set_prefixed_pairs(samples[i].features.prefixed_pairs);
    r->set_sequences(samples[i].features.sequences);
    r->set_tokens(samples[i].features.tokens);
    r->set_seconds(samples[i].seconds);
  }
  return request;
}

}  // namespace flashcp::proto
