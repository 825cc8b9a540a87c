#include "planner_service/log_limiter.h"

#include <atomic>
#include <string>

#include "core/log.h"
#include "google/protobuf/stubs/logging.h"

namespace flashcp::planner_service {

LogLimiter::LogLimiter(int max_lines, absl::Duration window, const core::Clock* clock)
    : max_lines_(max_lines), window_(window), clock_(clock) {}

bool LogLimiter::Allow(int64_t* suppressed) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= max_lines_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

namespace {

// protobuf's handler is a function pointer: the limiter it consults lives here.
std::atomic<LogLimiter*> protobuf_limiter{nullptr};

void ProtobufLogHandler(google::protobuf::LogLevel level, const char* filename, int line,
                        const std::string& message) {
  int64_t suppressed = 0;
  LogLimiter* limiter = protobuf_limiter.load();
  if (level != google::protobuf::LOGLEVEL_FATAL && limiter != nullptr &&
      !limiter->Allow(&suppressed)) {
    return;
  }
  const core::LogLevel ours = level == google::protobuf::LOGLEVEL_INFO      ? core::LogLevel::kInfo
                              : level == google::protobuf::LOGLEVEL_WARNING ? core::LogLevel::kWarning
                                                                            : core::LogLevel::kError;
  core::LogLine log(ours, filename, line);
  log.stream() << "protobuf: " << message;
  if (suppressed > 0) log.stream() << " (" << suppressed << " similar lines suppressed)";
}

}  // namespace

void RouteProtobufLogs(LogLimiter* limiter) {
  // protobuf's own handler, as SetLogHandler returned it the first time.
  static google::protobuf::LogHandler* const original =
      google::protobuf::SetLogHandler(&ProtobufLogHandler);
  protobuf_limiter.store(limiter);
  google::protobuf::SetLogHandler(limiter == nullptr ? original : &ProtobufLogHandler);
}

}  // namespace flashcp::planner_service
