#include "client/logging_planner_client.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/log.h"

namespace flashcp::client {
namespace {

std::string StatusText(const absl::Status& status) {
  if (status.ok()) return "OK";
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

std::string Millis(absl::Duration d) {
  return absl::StrFormat("%.3fms", absl::ToDoubleMilliseconds(d));
}

// The request's identity, without its (possibly 10^6) lengths.
std::string DescribeRequest(const v1::PlanRequest& request) {
  return absl::StrCat("batch_id=", request.batch_id(), " docs=", request.doc_lens_size(),
                      " cp=", request.cp_size(), " strategy=", request.strategy());
}

}  // namespace

std::string DescribePlanCall(absl::string_view method, const v1::PlanRequest& request,
                             const absl::Status& status, absl::Duration elapsed) {
  return absl::StrCat(method, " ", DescribeRequest(request), " -> ", StatusText(status), " in ",
                      Millis(elapsed));
}

LoggingPlannerClient::LoggingPlannerClient(std::shared_ptr<PlannerClient> inner,
                                           LoggingOptions options)
    : inner_(std::move(inner)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : real_clock_) {}

void LoggingPlannerClient::Log(absl::string_view line) const {
  if (options_.sink) {
    options_.sink(line);
  } else {
    FLASHCP_LOG(INFO) << line;
  }
}

PlanResult LoggingPlannerClient::Plan(const v1::PlanRequest& request,
                                      const CallOptions& options) {
  const absl::Time start = clock_.Now();
  PlanResult result = inner_->Plan(request, options);
  Log(DescribePlanCall("Plan", request, result.status(), clock_.Now() - start));
  return result;
}

void LoggingPlannerClient::PlanAsync(const v1::PlanRequest& request, const CallOptions& options,
                                     PlanCallback done) {
  const absl::Time start = clock_.Now();
  inner_->PlanAsync(request, options,
                    [this, start, what = DescribeRequest(request),
                     done = std::move(done)](PlanResult result) mutable {
                      Log(absl::StrCat("PlanAsync ", what, " -> ", StatusText(result.status()),
                                       " in ", Millis(clock_.Now() - start)));
                      std::move(done)(std::move(result));
                    });
}

std::unique_ptr<PlanStream> LoggingPlannerClient::OpenPlanStream(const CallOptions& options) {
  Log("OpenPlanStream");
  return inner_->OpenPlanStream(options);
}

absl::StatusOr<v1::ListStrategiesResponse> LoggingPlannerClient::ListStrategies(
    const CallOptions& options) {
  const absl::Time start = clock_.Now();
  auto result = inner_->ListStrategies(options);
  Log(absl::StrCat("ListStrategies -> ", StatusText(result.status()), " in ",
                   Millis(clock_.Now() - start)));
  return result;
}

absl::StatusOr<v1::ServerInfo> LoggingPlannerClient::GetServerInfo(const CallOptions& options) {
  const absl::Time start = clock_.Now();
  auto result = inner_->GetServerInfo(options);
  Log(absl::StrCat("GetServerInfo -> ", StatusText(result.status()), " in ",
                   Millis(clock_.Now() - start)));
  return result;
}

absl::StatusOr<v1::ReportStepTimesResponse> LoggingPlannerClient::ReportStepTimes(
    const v1::ReportStepTimesRequest& request, const CallOptions& options) {
  const absl::Time start = clock_.Now();
  auto result = inner_->ReportStepTimes(request, options);
  Log(absl::StrCat("ReportStepTimes ", request.steps_size(), " steps -> ",
                   StatusText(result.status()), " in ", Millis(clock_.Now() - start)));
  return result;
}

}  // namespace flashcp::client
