#include "core/runtime/listener/listener_watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/log.h"

namespace flashcp::core::runtime::listener {
namespace {

// The port of a listening TCP socket `fd`; -1 for anything else.
int ListeningTcpPort(int fd) {
  int listening = 0;
  socklen_t len = sizeof(listening);
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) return -1;
  int type = 0;
  len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return -1;
  sockaddr_storage addr{};
  len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AcceptQueue>> AcceptQueue::Find(int port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    return absl::ErrnoToStatus(errno, "opendir /proc/self/fd");
  }
  std::vector<int> candidates;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && fd != dirfd(dir)) candidates.push_back(int(fd));
  }
  closedir(dir);
  std::vector<int> fds;
  for (int fd : candidates) {
    if (ListeningTcpPort(fd) != port) continue;
    const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
      const int error = errno;  // before close() may change it
      for (int c : fds) close(c);
      return absl::ErrnoToStatus(error, absl::StrCat("dup of listening fd ", fd));
    }
    fds.push_back(copy);
  }
  if (fds.empty()) {
    return absl::NotFoundError(absl::StrCat("no listening TCP socket on port ", port));
  }
  return std::unique_ptr<AcceptQueue>(new AcceptQueue(std::move(fds)));
}

AcceptQueue::~AcceptQueue() {
  for (int fd : fds_) close(fd);
}

absl::StatusOr<int64_t> AcceptQueue::Length() const {
  int64_t longest = 0;
  for (int fd : fds_) {
    // For a listening socket Linux reports the accept queue's length in
    // tcpi_unacked (and its capacity in tcpi_sacked).
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("getsockopt TCP_INFO of fd ", fd));
    }
    longest = std::max<int64_t>(longest, info.tcpi_unacked);
  }
  return longest;
}

bool StallDetector::Record(int64_t queue_length) {
  run_ = queue_length > 0 && (run_ == 0 || queue_length >= previous_) ? run_ + 1
         : queue_length > 0                                          ? 1
                                                                     : 0;
  previous_ = queue_length;
  return run_ >= stall_samples_;
}

ListenerWatchdog::ListenerWatchdog(Sampler sample, Options options, const core::WaitClock* clock,
                                   std::function<void(bool)> on_change)
    : sample_(std::move(sample)),
      options_(options),
      clock_(clock),
      on_change_(std::move(on_change)),
      thread_([this] { Loop(); }) {}

ListenerWatchdog::~ListenerWatchdog() { Stop(); }

void ListenerWatchdog::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t ListenerWatchdog::samples() const {
  absl::MutexLock lock(&mu_);
  return samples_;
}

void ListenerWatchdog::Loop() {
  StallDetector detector(options_.stall_samples);
  bool accepting = true;
  bool logged_failure = false;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      clock_->AwaitWithTimeout(mu_, absl::Condition(&stop_), options_.interval);
      if (stop_) return;
    }
    const absl::StatusOr<int64_t> length = sample_();
    if (!length.ok()) {
      if (!logged_failure) {
        FLASHCP_LOG(WARNING) << "listener watchdog: cannot sample the accept queue: "
                             << length.status().ToString();
        logged_failure = true;
      }
    } else if (const bool now = !detector.Record(*length); now != accepting) {
      accepting = now;
      on_change_(accepting);
    }
    absl::MutexLock lock(&mu_);
    ++samples_;
  }
}

}  // namespace flashcp::core::runtime::listener
