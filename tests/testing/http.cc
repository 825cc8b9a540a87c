#include "tests/testing/http.h"

#include <netdb.h>
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

int PollTimeoutMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60'000));
}

// Waits until `fd` is ready for `events`.
absl::Status Await(int fd, short events, absl::Time deadline) {
  pollfd pfd{fd, events, 0};
  for (;;) {
    const int rc = poll(&pfd, 1, PollTimeoutMs(deadline));
    if (rc > 0) return absl::OkStatus();
    if (rc < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (rc == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError("HTTP request timed out");
    }
  }
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(absl::string_view host_port, absl::string_view path,
                                     absl::Time deadline) {
  const size_t colon = host_port.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("host_port: no port in \"", host_port, "\""));
  }
  const std::string host(host_port.substr(0, colon));
  const std::string port(host_port.substr(colon + 1));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve ", host_port, ": ", gai_strerror(rc)));
  }
  Fd fd(socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               res->ai_protocol));
  const int rc = fd.get() < 0 ? -1 : connect(fd.get(), res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  if (rc != 0 && errno != EINPROGRESS) {
    return absl::UnavailableError(absl::StrCat("connect ", host_port, ": ", std::strerror(errno)));
  }
  if (absl::Status s = Await(fd.get(), POLLOUT, deadline); !s.ok()) return s;
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", host_port, ": ", std::strerror(err)));
  }

  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    if (absl::Status s = Await(fd.get(), POLLOUT, deadline); !s.ok()) return s;
    const ssize_t n = send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string reply;
  for (;;) {
    if (absl::Status s = Await(fd.get(), POLLIN, deadline); !s.ok()) return s;
    char buf[8192];
    const ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    if (n > 0) reply.append(buf, static_cast<size_t>(n));
  }
  // "HTTP/1.x NNN reason\r\n" headers "\r\n\r\n" body
  const size_t header_end = reply.find("\r\n\r\n");
  int status = 0;
  if (reply.rfind("HTTP/1.", 0) != 0 || header_end == std::string::npos || reply.size() < 12 ||
      !absl::SimpleAtoi(absl::string_view(reply).substr(9, 3), &status)) {
    return absl::DataLossError(absl::StrCat("not an HTTP reply: \"", reply.substr(0, 64), "\""));
  }
  return HttpResponse{status, reply.substr(header_end + 4)};
}

}  // namespace flashcp::tests::testing
