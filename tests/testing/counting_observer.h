// A ServiceObserver for tests of the planner's services on a real loopback
// server: it records each answered request as "Method:CODE" in order, the
// requests in flight, the last queue depth and the plans made. Read its fields
// under `mu` (tests wait on them with mu.AwaitWithTimeout).
#ifndef FLASHCP_TESTS_TESTING_COUNTING_OBSERVER_H_
#define FLASHCP_TESTS_TESTING_COUNTING_OBSERVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "planner_service/observer.h"

namespace flashcp::tests::testing {

class CountingObserver final : public planner_service::ServiceObserver {
 public:
  void OnRequestDone(absl::string_view method, absl::StatusCode code, double) override {
    absl::MutexLock lock(&mu);
    done.push_back(std::string(method) + ":" + absl::StatusCodeToString(code));
  }
  void OnInflightChange(int delta) override {
    absl::MutexLock lock(&mu);
    inflight += delta;
  }
  void OnQueueDepth(int64_t d) override {
    absl::MutexLock lock(&mu);
    depth = d;
  }
  void OnStreamHeldBytes(int64_t) override {}
  void OnPlanned(core::Strategy, double, const core::PlanMetrics&) override {
    absl::MutexLock lock(&mu);
    ++planned;
  }

  absl::Mutex mu;
  std::vector<std::string> done ABSL_GUARDED_BY(mu);
  int inflight ABSL_GUARDED_BY(mu) = 0;
  int64_t depth ABSL_GUARDED_BY(mu) = 0;  // jobs waiting in the pool's queue
  int planned ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_COUNTING_OBSERVER_H_
