// A minimal leveled logger for the edges (binaries, service handlers). Core
// algorithms never log. Abseil 20220623 has no absl/log; this is the one shim.
//   FLASHCP_LOG(INFO) << "listening on " << addr;
#ifndef FLASHCP_CORE_LOG_H_
#define FLASHCP_CORE_LOG_H_

#include <cstdio>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flashcp::core {

enum class LogLevel { kInfo, kWarning, kError };

// One line to stderr, timestamped (UTC, microseconds), written with a single
// fwrite so that lines from concurrent threads do not interleave.
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line) {
    const char* tag = level == LogLevel::kInfo ? "I" : level == LogLevel::kWarning ? "W" : "E";
    stream_ << tag << absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ ", absl::Now(), absl::UTCTimeZone())
            << Basename(file) << ":" << line << "] ";
  }
  ~LogLine() {
    stream_ << '\n';
    const std::string s = stream_.str();
    std::fwrite(s.data(), 1, s.size(), stderr);
  }
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  static const char* Basename(const char* path) {
    const char* base = path;
    for (const char* p = path; *p; ++p)
      if (*p == '/') base = p + 1;
    return base;
  }
  std::ostringstream stream_;
};

}  // namespace flashcp::core

#define FLASHCP_LOG_LEVEL_INFO ::flashcp::core::LogLevel::kInfo
#define FLASHCP_LOG_LEVEL_WARNING ::flashcp::core::LogLevel::kWarning
#define FLASHCP_LOG_LEVEL_ERROR ::flashcp::core::LogLevel::kError
#define FLASHCP_LOG(level) \
  ::flashcp::core::LogLine(FLASHCP_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#endif  // FLASHCP_CORE_LOG_H_
