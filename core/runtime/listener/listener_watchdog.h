// Detects a gRPC listener that has stopped accepting connections, so that
// ResilientServer (resilient_server.h) can say NOT_SERVING and rebuild it.
// gRPC 1.51's TCP listener gives up for good after one accept4() failure other
// than EAGAIN/ECONNABORTED/EINTR (EMFILE when the fd limit is reached): the
// process stays up, calls on existing connections go on, and every new client
// waits forever. Such a listener leaves connections in the kernel's accept
// queue; a live one empties it within moments. The watchdog samples the
// queue's length (TCP_INFO on the listening socket) every interval and calls
// the listener stalled when the queue has been non-empty and not shrinking
// for `stall_samples` samples in a row.
#ifndef FLASHCP_PLANNER_SERVICE_LISTENER_LISTENER_WATCHDOG_H_
#define FLASHCP_PLANNER_SERVICE_LISTENER_LISTENER_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace flashcp::core::runtime::listener {

// The accept queues of this process's listening TCP sockets on one port.
class AcceptQueue {
 public:
  // Finds them by scanning /proc/self/fd and keeps a dup() of each, so that
  // sampling never touches an fd number gRPC has closed and reused. NotFound
  // if this process listens on no TCP socket with `port`.
  static absl::StatusOr<std::unique_ptr<AcceptQueue>> Find(int port);
  ~AcceptQueue();
  AcceptQueue(const AcceptQueue&) = delete;
  AcceptQueue& operator=(const AcceptQueue&) = delete;

  // Connections completed by the kernel and not yet accepted: the largest
  // over the sockets. Internal with errno's text if getsockopt fails.
  absl::StatusOr<int64_t> Length() const;

 private:
  explicit AcceptQueue(std::vector<int> fds) : fds_(std::move(fds)) {}
  std::vector<int> fds_;
};

// The verdict from a sequence of accept-queue lengths; pure.
class StallDetector {
 public:
  explicit StallDetector(int stall_samples) : stall_samples_(stall_samples) {}
  // Records one sample; true while the last `stall_samples` samples were all
  // non-empty and none shorter than the one before.
  bool Record(int64_t queue_length);

 private:
  const int stall_samples_;
  int run_ = 0;            // samples in the current non-empty, non-shrinking run
  int64_t previous_ = 0;
};

class ListenerWatchdog {
 public:
  struct Options {
    absl::Duration interval = absl::Seconds(1);  // between samples, > 0
    int stall_samples = 5;                       // >= 1
  };
  using Sampler = std::function<absl::StatusOr<int64_t>()>;
  // Starts a thread that samples every `interval` of `clock` and calls
  // `on_change(accepting)` each time the verdict changes (first call: false
  // when a stall is seen). A failed sample is logged once and changes nothing.
  // `clock` must outlive the watchdog.
  ListenerWatchdog(Sampler sample, Options options, const core::WaitClock* clock,
                   std::function<void(bool accepting)> on_change);
  ~ListenerWatchdog();  // Stop()
  ListenerWatchdog(const ListenerWatchdog&) = delete;
  ListenerWatchdog& operator=(const ListenerWatchdog&) = delete;

  // Ends the thread; no on_change call runs after it returns. Idempotent.
  void Stop();

  // Samples taken so far (tests wait on it).
  int64_t samples() const;

 private:
  void Loop();

  const Sampler sample_;
  const Options options_;
  const core::WaitClock* const clock_;
  const std::function<void(bool)> on_change_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t samples_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace flashcp::core::runtime::listener

#endif  // FLASHCP_PLANNER_SERVICE_LISTENER_LISTENER_WATCHDOG_H_
