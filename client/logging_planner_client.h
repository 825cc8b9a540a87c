// A PlannerClient decorator that logs each call: method, batch id and size,
// result code and wall time. The sink is injected (tests capture lines); the
// default writes through FLASHCP_LOG.
#ifndef FLASHCP_CLIENT_LOGGING_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_LOGGING_PLANNER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/planner_client.h"
#include "core/clock.h"

namespace flashcp::client {

struct LoggingOptions {
  std::function<void(absl::string_view line)> sink;  // empty: FLASHCP_LOG(INFO)
  // The call timings' clock; null: the wall clock. Must outlive the decorator.
  const core::Clock* clock = nullptr;
};

class LoggingPlannerClient final : public PlannerClient {
 public:
  LoggingPlannerClient(std::shared_ptr<PlannerClient> inner, LoggingOptions options = {});

  PlanResult Plan(const v1::PlanRequest& request, const CallOptions& options) override;
  // Logs when `done` runs; the decorator must outlive the pending call.
  void PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                 PlanCallback done) override;
  std::unique_ptr<PlanStream> OpenPlanStream(const CallOptions& options) override;
  absl::StatusOr<v1::ListStrategiesResponse> ListStrategies(const CallOptions& options) override;
  absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& options) override;
  absl::StatusOr<v1::ReportStepTimesResponse> ReportStepTimes(
      const v1::ReportStepTimesRequest& request, const CallOptions& options) override;

 private:
  void Log(absl::string_view line) const;

  std::shared_ptr<PlannerClient> inner_;
  LoggingOptions options_;
  core::RealClock real_clock_;  // options_.clock when none was injected
  const core::Clock& clock_;     // *options_.clock or real_clock_
};

// "Plan batch_id=3 docs=12 cp=8 strategy=ring -> OK in 0.42ms": the line the
// decorator writes for one Plan call (exposed for tests).
std::string DescribePlanCall(absl::string_view method, const v1::PlanRequest& request,
                             const absl::Status& status, absl::Duration elapsed);

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_LOGGING_PLANNER_CLIENT_H_
