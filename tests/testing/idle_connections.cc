#include "tests/testing/idle_connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace flashcp::tests::testing {
namespace {

int PollMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
}

}  // namespace

IdleConnections::~IdleConnections() { CloseAll(); }

void IdleConnections::CloseAll() {
  for (int fd : fds_) close(fd);
  fds_.clear();
}

absl::Status IdleConnections::Open(absl::string_view host_port, int n, absl::Time deadline) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(host_port.substr(colon + 1), &port) ||
      inet_pton(AF_INET, std::string(host_port.substr(0, colon)).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("want IPv4:PORT, got \"", host_port, "\""));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrCat("connection ", i, ": socket: ", std::strerror(errno)));
    }
    fds_.push_back(fd);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 &&
        errno != EINPROGRESS) {
      return absl::UnavailableError(
          absl::StrCat("connection ", i, ": connect ", host_port, ": ", std::strerror(errno)));
    }
    pollfd p{fd, POLLOUT, 0};
    while (poll(&p, 1, PollMs(deadline)) == 0) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("connection ", i, " to ", host_port, ": still connecting"));
      }
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return absl::UnavailableError(
          absl::StrCat("connection ", i, ": connect ", host_port, ": ", std::strerror(err)));
    }
  }
  return absl::OkStatus();
}

int IdleConnections::AwaitClosedByPeer(absl::Time deadline) {
  std::vector<bool> closed(fds_.size(), false);
  int n_closed = 0;
  for (;;) {
    std::vector<pollfd> open;
    std::vector<size_t> index;
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (!closed[i]) {
        open.push_back({fds_[i], POLLIN, 0});
        index.push_back(i);
      }
    }
    if (open.empty() || absl::Now() >= deadline) return n_closed;
    if (poll(open.data(), open.size(), PollMs(deadline)) <= 0) continue;
    for (size_t k = 0; k < open.size(); ++k) {
      if (open[k].revents == 0) continue;
      char buf[4096];
      const ssize_t r = recv(open[k].fd, buf, sizeof(buf), 0);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        closed[index[k]] = true;
        ++n_closed;
      }
    }
  }
}

}  // namespace flashcp::tests::testing
