#include "planner_service/log_limiter.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/clock.h"

namespace flashcp::planner_service {
namespace {

using ::testing::ElementsAre;

// What Allow said, with the suppressed count for the lines let through.
struct Verdict {
  bool allowed;
  int64_t suppressed;
  bool operator==(const Verdict& o) const {
    return allowed == o.allowed && suppressed == o.suppressed;
  }
};
void PrintTo(const Verdict& v, std::ostream* os) {
  *os << (v.allowed ? "allowed" : "refused") << "/" << v.suppressed;
}

Verdict Ask(LogLimiter& limiter) {
  int64_t suppressed = -1;
  const bool allowed = limiter.Allow(&suppressed);
  return {allowed, allowed ? suppressed : -1};
}

TEST(LogLimiterTest, LetsMaxLinesThroughPerWindowAndCountsTheRest) {
  core::ManualClock clock;
  LogLimiter limiter(2, absl::Seconds(10), &clock);
  std::vector<Verdict> got;
  for (int i = 0; i < 5; ++i) got.push_back(Ask(limiter));  // t = 0
  clock.Advance(absl::Seconds(9));
  got.push_back(Ask(limiter));  // t = 9: same window
  clock.Advance(absl::Seconds(1));
  got.push_back(Ask(limiter));  // t = 10: a new window; 4 were refused
  got.push_back(Ask(limiter));
  got.push_back(Ask(limiter));
  clock.Advance(absl::Seconds(25));
  got.push_back(Ask(limiter));  // t = 35: a new window; 1 refused
  got.push_back(Ask(limiter));
  EXPECT_THAT(got, ElementsAre(Verdict{true, 0}, Verdict{true, 0}, Verdict{false, -1},
                               Verdict{false, -1}, Verdict{false, -1}, Verdict{false, -1},
                               Verdict{true, 4}, Verdict{true, 0}, Verdict{false, -1},
                               Verdict{true, 1}, Verdict{true, 0}));
}

}  // namespace
}  // namespace flashcp::planner_service
