// The project's one exponential backoff: the delay before the next attempt
// after `attempt` failures, min(initial * multiplier^(attempt-1), max). Pure:
// the caller's clock does the waiting.
#ifndef FLASHCP_CORE_BACKOFF_H_
#define FLASHCP_CORE_BACKOFF_H_

#include <algorithm>
#include <cmath>

#include "absl/time/time.h"

namespace flashcp::core {

struct BackoffPolicy {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(1);
  double multiplier = 2.0;  // values below 1 count as 1
};

// The wait after `attempt` (>= 1) failed attempts.
inline absl::Duration BackoffDelay(const BackoffPolicy& policy, int attempt) {
  const double factor = std::pow(std::max(policy.multiplier, 1.0), std::max(attempt, 1) - 1);
  return std::min(policy.initial * factor, policy.max);
}

// Successive delays of one retry loop: Next() returns BackoffDelay for 1, 2, ...
class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy = {}) : policy_(policy) {}
  absl::Duration Next() { return BackoffDelay(policy_, ++failures_); }

 private:
  BackoffPolicy policy_;
  int failures_ = 0;
};

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_BACKOFF_H_
