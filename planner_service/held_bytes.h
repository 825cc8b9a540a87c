// Response bytes that PlanStream calls hold for clients that have not read
// them yet, summed over all streams, against one bound: a stream stops reading
// while the sum is at or above it and resumes (on_room) as writes complete.
#ifndef FLASHCP_PLANNER_SERVICE_HELD_BYTES_H_
#define FLASHCP_PLANNER_SERVICE_HELD_BYTES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashcp::planner_service {

class HeldBytes {
 public:
  using WaitId = uint64_t;  // never 0

  // `on_change`, if set, is called with the sum after every change, under
  // the lock (keep it cheap).
  explicit HeldBytes(int64_t limit, std::function<void(int64_t)> on_change = nullptr)
      : limit_(limit), on_change_(std::move(on_change)) {}
  HeldBytes(const HeldBytes&) = delete;
  HeldBytes& operator=(const HeldBytes&) = delete;

  // Bytes taken (may pass the limit: the caller checked Below before).
  void Add(int64_t bytes);
  // Bytes given back; once the sum is below the limit, calls every waiting
  // on_room (on this thread, without the lock).
  void Sub(int64_t bytes);
  // 0 if the sum is below the limit now; otherwise keeps `on_room` to call
  // once when it drops below, and returns its id.
  WaitId BelowOrWait(std::function<void()> on_room);
  // True if `id` was still waiting (on_room will not be called).
  bool CancelWait(WaitId id);

  int64_t held() const;
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  const std::function<void(int64_t)> on_change_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  WaitId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<WaitId, std::function<void()>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_HELD_BYTES_H_
