// gMock PlannerClient for tests of code that calls the planner.
#ifndef FLASHCP_CLIENT_TESTING_MOCK_PLANNER_CLIENT_H_
#define FLASHCP_CLIENT_TESTING_MOCK_PLANNER_CLIENT_H_

#include <memory>

#include "client/planner_client.h"
#include "gmock/gmock.h"

namespace flashcp::client::testing {

class MockPlannerClient : public PlannerClient {
 public:
  MOCK_METHOD(PlanResult, Plan, (const v1::PlanRequest&, const CallOptions&), (override));
  MOCK_METHOD(void, PlanAsync, (const v1::PlanRequest&, const CallOptions&, PlanCallback),
              (override));
  MOCK_METHOD(std::unique_ptr<PlanStream>, OpenPlanStream, (const CallOptions&), (override));
  MOCK_METHOD(absl::StatusOr<v1::ListStrategiesResponse>, ListStrategies, (const CallOptions&),
              (override));
  MOCK_METHOD(absl::StatusOr<v1::ServerInfo>, GetServerInfo, (const CallOptions&), (override));
  MOCK_METHOD(absl::StatusOr<v1::ReportStepTimesResponse>, ReportStepTimes,
              (const v1::ReportStepTimesRequest&, const CallOptions&), (override));
};

}  // namespace flashcp::client::testing

#endif  // FLASHCP_CLIENT_TESTING_MOCK_PLANNER_CLIENT_H_
