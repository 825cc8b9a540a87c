// A clock for tests that time things: every Now() returns the previous
// reading plus `tick`, so a duration counts the readings between two points
// exactly. Thread-safe.
#ifndef FLASHCP_CORE_TESTING_TICKING_CLOCK_H_
#define FLASHCP_CORE_TESTING_TICKING_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace flashcp::core::testing {

class TickingClock final : public Clock {
 public:
  explicit TickingClock(absl::Duration tick, absl::Time start = absl::UnixEpoch())
      : tick_(tick), now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    now_ += tick_;
    return now_;
  }

 private:
  const absl::Duration tick_;
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashcp::core::testing

#endif  // FLASHCP_CORE_TESTING_TICKING_CLOCK_H_
