#include "planner_service/held_bytes.h"

#include <utility>

namespace flashcp::planner_service {

void HeldBytes::Add(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ += bytes;
  if (on_change_) on_change_(held_);
}

void HeldBytes::Sub(int64_t bytes) {
  std::map<WaitId, std::function<void()>> woken;
  {
    absl::MutexLock lock(&mu_);
    held_ -= bytes;
    if (on_change_) on_change_(held_);
    if (held_ < limit_) woken.swap(waiters_);
  }
  for (auto& [id, on_room] : woken) on_room();
}

HeldBytes::WaitId HeldBytes::BelowOrWait(std::function<void()> on_room) {
  absl::MutexLock lock(&mu_);
  if (held_ < limit_) return 0;
  const WaitId id = next_id_++;
  waiters_.emplace(id, std::move(on_room));
  return id;
}

bool HeldBytes::CancelWait(WaitId id) {
  absl::MutexLock lock(&mu_);
  return waiters_.erase(id) > 0;
}

int64_t HeldBytes::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

}  // namespace flashcp::planner_service
