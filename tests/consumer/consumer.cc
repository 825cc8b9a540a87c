// Plans a batch with the installed flashcp::core and, with the client, makes
// a client for a planner (no call: nothing listens). Prints what the test
// checks.
#include <iostream>

#include "core/strategies.h"
#include "core/types.h"
#ifdef CONSUMER_WITH_CLIENT
#include "client/grpc_planner_client.h"
#endif

int main() {
  namespace core = flashcp::core;
  absl::StatusOr<core::Plan> plan = core::MakePlan(core::Strategy::kFlashCp, {{5, 3, 8}, 2});
  if (!plan.ok()) {
    std::cerr << plan.status() << "\n";
    return 1;
  }
  std::cout << "plan " << core::StrategyName(core::Strategy::kFlashCp) << " shards "
            << plan->shards.size() << "\n";
  // The ILP is not linked here: MakePlan says so.
  std::cout << "ilp " << core::MakePlan(core::Strategy::kIlp, {{5, 3, 8}, 2}).status().code()
            << "\n";
#ifdef CONSUMER_WITH_CLIENT
  flashcp::client::GrpcPlannerClient client(flashcp::client::MakeChannel("127.0.0.1:1"));
  std::cout << "client ok\n";
#endif
  return 0;
}
