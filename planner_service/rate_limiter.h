// Per-client token buckets: what bounds a cheap-to-send, costly-to-serve
// call per client (ReportStepTimes). Thread-safe; time from an injected clock.
#ifndef FLASHCP_PLANNER_SERVICE_RATE_LIMITER_H_
#define FLASHCP_PLANNER_SERVICE_RATE_LIMITER_H_

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace flashcp::planner_service {

class KeyedRateLimiter {
 public:
  struct Options {
    double per_second = 4;  // tokens refilled per second, per key
    double burst = 16;      // bucket size: calls a quiet key may make at once
    // Keys tracked; beyond it the least recently seen is forgotten (it starts
    // again with a full bucket): memory is O(max_keys).
    int64_t max_keys = 4096;
  };

  // `clock` outlives this.
  KeyedRateLimiter(Options options, const core::Clock* clock);

  // Takes a token from `key`'s bucket: false when it is empty.
  bool Allow(const std::string& key);

  const Options& options() const { return options_; }

 private:
  struct Bucket {
    double tokens;
    absl::Time at;  // when `tokens` was computed
    std::list<std::string>::iterator lru;
  };
  const Options options_;
  const core::Clock* const clock_;
  absl::Mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_RATE_LIMITER_H_
