// Rate-limited logging for lines a client can cause at will (issue 12 item
// 14: protobuf logs one ERROR line for every message with invalid UTF-8 in a
// string field; 10,000 requests wrote 10,000 lines). One limiter, one window.
#ifndef FLASHCP_PLANNER_SERVICE_LOG_LIMITER_H_
#define FLASHCP_PLANNER_SERVICE_LOG_LIMITER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace flashcp::planner_service {

// Lets at most `max_lines` lines through in each `window` of `clock` (fixed
// windows; the first starts at the first line) and counts the rest. Thread-safe.
class LogLimiter {
 public:
  // `clock` must outlive the limiter; max_lines >= 1, window > 0.
  LogLimiter(int max_lines, absl::Duration window, const core::Clock* clock);

  // Whether to write a line now. When it is, *suppressed is the number of
  // lines refused since the last one let through (0 if none).
  bool Allow(int64_t* suppressed);

 private:
  const int max_lines_;
  const absl::Duration window_;
  const core::Clock* const clock_;
  absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

// Routes protobuf's log messages (google::protobuf::SetLogHandler) through
// FLASHCP_LOG, rate-limited by `limiter`; FATAL messages always pass. The
// handler is process-wide (protobuf takes a plain function pointer), so
// install once, from the binary's edge; `limiter` must outlive the
// installation. nullptr restores protobuf's own handler.
void RouteProtobufLogs(LogLimiter* limiter);

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_LOG_LIMITER_H_
