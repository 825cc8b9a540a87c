#include "core/runtime/listener/listener_watchdog.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core::runtime::listener {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

TEST(StallDetectorTest, StalledOnlyAfterARunOfNonEmptyNonShrinkingSamples) {
  struct Case {
    std::vector<int64_t> samples;
    std::vector<bool> want;
  };
  const std::vector<Case> cases = {
      {{0, 0, 0, 0}, {false, false, false, false}},
      {{1, 1, 1, 1}, {false, false, true, true}},
      {{1, 2, 3}, {false, false, true}},
      {{1, 1, 0, 1, 1, 1}, {false, false, false, false, false, true}},  // emptied: live
      {{3, 3, 2, 2, 2}, {false, false, false, false, true}},            // shrank: live
      {{1, 1, 1, 0}, {false, false, true, false}},                      // drained again
  };
  for (const Case& c : cases) {
    StallDetector d(3);
    std::vector<bool> got;
    for (int64_t s : c.samples) got.push_back(d.Record(s));
    EXPECT_THAT(got, ElementsAreArray(c.want)) << ::testing::PrintToString(c.samples);
  }
}

// A scripted sampler and the verdicts the watchdog reported.
struct Script {
  absl::Mutex mu;
  std::vector<absl::StatusOr<int64_t>> samples ABSL_GUARDED_BY(mu);
  size_t next ABSL_GUARDED_BY(mu) = 0;
  std::vector<bool> verdicts ABSL_GUARDED_BY(mu);
};

// Advances the clock an interval at a time until at least `n` samples were
// taken. A wait that began after an advance needs the next one, so it keeps
// advancing; what the samples say is scripted, not how many extra ones ran.
void RunSamples(core::ManualClock& clock, const ListenerWatchdog& w, int64_t n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (w.samples() < n && absl::Now() < deadline) {
    clock.Advance(absl::Seconds(1));
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_GE(w.samples(), n);
}

TEST(ListenerWatchdogTest, ReportsEachVerdictChangeOnceAndKeepsItOnAFailedSample) {
  Script script;
  {
    absl::MutexLock lock(&script.mu);
    script.samples = {0, 2, 2, 2, 2, 2, absl::InternalError("TCP_INFO: gone"), 2, 0, 0};
  }
  core::ManualClock clock;
  ListenerWatchdog w(
      [&script]() -> absl::StatusOr<int64_t> {
        absl::MutexLock lock(&script.mu);
        return script.next < script.samples.size() ? script.samples[script.next++] : 0;
      },
      {.interval = absl::Seconds(1), .stall_samples = 2}, &clock,
      [&script](bool accepting) {
        absl::MutexLock lock(&script.mu);
        script.verdicts.push_back(accepting);
      });
  RunSamples(clock, w, 3);  // 0, 2, 2: stalled (and stays so for a few more samples)
  {
    absl::MutexLock lock(&script.mu);
    EXPECT_THAT(script.verdicts, ElementsAre(false));
  }
  RunSamples(clock, w, 10);  // the error changes nothing; 2 still stalled; 0 accepts
  w.Stop();
  absl::MutexLock lock(&script.mu);
  EXPECT_THAT(script.verdicts, ElementsAre(false, true));
}

// A real listening socket that nobody accepts on: its queue holds what the
// kernel completed; accepting one takes it off.
TEST(AcceptQueueTest, CountsConnectionsNobodyAccepted) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  absl::StatusOr<std::unique_ptr<AcceptQueue>> queue = AcceptQueue::Find(port);
  ASSERT_THAT(queue, IsOk());
  EXPECT_EQ((*queue)->Length().value_or(-1), 0);
  std::vector<int> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(connect(clients.back(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  // connect() returns once the client has sent its ACK; the server side
  // queues the connection when that ACK arrives (on loopback, at once).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((*queue)->Length().value_or(-1) != 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ((*queue)->Length().value_or(-1), 2);
  const int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  EXPECT_EQ((*queue)->Length().value_or(-1), 1);
  close(accepted);
  for (int c : clients) close(c);
  close(listener);
  queue->reset();  // its dup() kept the socket listening

  EXPECT_THAT(AcceptQueue::Find(port).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       absl::StrCat("no listening TCP socket on port ", port)));
}

}  // namespace
}  // namespace flashcp::core::runtime::listener
