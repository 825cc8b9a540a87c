// Reading samples out of a Prometheus text exposition (a /metrics scrape).
#ifndef FLASHCP_TESTS_TESTING_METRICS_TEXT_H_
#define FLASHCP_TESTS_TESTING_METRICS_TEXT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashcp::tests::testing {

using Labels = std::map<std::string, std::string>;

// The value of the sample `name` whose label set is exactly `labels` (in any
// order). NotFound if there is none; DataLoss for a malformed sample line.
//   FindSample(text, "flashcp_planner_requests_total", {{"method","Plan"},{"code","OK"}})
absl::StatusOr<double> FindSample(absl::string_view exposition, absl::string_view name,
                                  const Labels& labels = {});

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_METRICS_TEXT_H_
