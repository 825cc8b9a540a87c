#include "client/planner_client.h"

#include <algorithm>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flashcp::client {

std::future<PlanResult> PlannerClient::PlanFuture(const v1::PlanRequest& request,
                                                  const CallOptions& options) {
  auto promise = std::make_shared<std::promise<PlanResult>>();
  std::future<PlanResult> future = promise->get_future();
  PlanAsync(request, options,
            [promise](PlanResult result) { promise->set_value(std::move(result)); });
  return future;
}

absl::StatusOr<v1::ServerInfo> WaitForServer(PlannerClient& client, absl::Duration timeout) {
  absl::StatusOr<v1::ServerInfo> info =
      client.GetServerInfo({.timeout = timeout, .wait_for_ready = true});
  if (info.ok() || info.status().code() != absl::StatusCode::kDeadlineExceeded) return info;
  // One short fail-fast probe for the channel's last error: bounded at 1 s so
  // that a stuck connect adds at most that to the caller's timeout.
  absl::StatusOr<v1::ServerInfo> fail_fast = client.GetServerInfo(
      {.timeout = std::min(timeout, absl::Seconds(1)), .wait_for_ready = false});
  if (fail_fast.ok()) return fail_fast;
  return absl::DeadlineExceededError(
      absl::StrCat(info.status().message(), "; last connection error: ",
                   absl::StatusCodeToString(fail_fast.status().code()), ": ",
                   fail_fast.status().message()));
}

}  // namespace flashcp::client
