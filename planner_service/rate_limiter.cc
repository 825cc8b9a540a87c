#include "planner_service/rate_limiter.h"

#include <algorithm>

namespace flashcp::planner_service {

KeyedRateLimiter::KeyedRateLimiter(Options options, const core::Clock* clock)
    : options_(options), clock_(clock) {}

bool KeyedRateLimiter::Allow(const std::string& key) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    while (!lru_.empty() && static_cast<int64_t>(buckets_.size()) >= options_.max_keys) {
      buckets_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(key);
    it = buckets_.emplace(key, Bucket{options_.burst, now, lru_.begin()}).first;
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  Bucket& b = it->second;
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - b.at));
  b.tokens = std::min(options_.burst, b.tokens + elapsed * options_.per_second);
  b.at = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

}  // namespace flashcp::planner_service
