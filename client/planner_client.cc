#include "client/planner_client.h"

#include <future>
#include <memory>
#include <utility>

namespace flashcp::client {

std::future<PlanResult> PlannerClient::PlanFuture(const v1::PlanRequest& request,
                                                  const CallOptions& options) {
  auto promise = std::make_shared<std::promise<PlanResult>>();
  std::future<PlanResult> future = promise->get_future();
  PlanAsync(request, options,
            [promise](PlanResult result) { promise->set_value(std::move(result)); });
  return future;
}

}  // namespace flashcp::client
