#include "core/runtime/metrics_endpoint/metrics_endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/runtime/process/host_port.h"
#include "core/status_macros.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace flashcp::core::runtime::metrics_endpoint {
namespace {

constexpr size_t kMaxRequestBytes = 8192;  // request line and headers
// How long accepting waits after accept() found no fd and no reserve.
constexpr int kNoFdBackoffMs = 100;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::string Response(int status, absl::string_view reason, absl::string_view content_type,
                     absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

std::string Text(int status, absl::string_view reason, absl::string_view body) {
  return Response(status, reason, "text/plain; charset=utf-8", body);
}

int OpenReserve() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

// A non-blocking listening socket on host:port; its fd, or Unavailable.
absl::StatusOr<int> Listen(absl::string_view address) {
  FLASHCP_ASSIGN_OR_RETURN(const auto host_port,
                           process::SplitHostPort(address, "--metrics"));
  std::string host(host_port.first);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);  // getaddrinfo takes IPv6 unbracketed
  }
  const std::string port = absl::StrCat(host_port.second);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics: cannot listen on ", address, ": ", gai_strerror(e)));
  }
  int last_errno = 0;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last_errno = errno;
    close(fd);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("--metrics: cannot listen on ", address, ": ",
                                             std::strerror(last_errno)));
}

int BoundPort(int fd) {
  sockaddr_storage a{};
  socklen_t length = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) != 0) return -1;
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

}  // namespace

struct MetricsServer::Connection {
  int fd = -1;
  int64_t accepted_ms = 0;
  int64_t deadline_ms = 0;  // the request's, then the answer's
  std::string in;           // the request so far
  std::string out;          // the answer; empty while reading
  size_t written = 0;
};

absl::Status ValidateEndpointOptions(const EndpointOptions& o) {
  if (o.max_connections < 1 || o.max_connections > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_max_connections: must be in [1, 65536], got ", o.max_connections));
  }
  if (o.request_timeout < absl::Milliseconds(1) || o.request_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_request_timeout: must be in [1ms, 10m], got ",
                     absl::FormatDuration(o.request_timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    absl::string_view address, const EndpointOptions& options) {
  FLASHCP_RETURN_IF_ERROR(ValidateEndpointOptions(options));
  FLASHCP_ASSIGN_OR_RETURN(const int listen_fd, Listen(address));
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int e = errno;
    close(listen_fd);
    return absl::UnavailableError(
        absl::StrCat("--metrics: cannot make an eventfd: ", std::strerror(e)));
  }
  std::unique_ptr<MetricsServer> s(
      new MetricsServer(listen_fd, wake_fd, BoundPort(listen_fd), options));
  s->reserve_fd_ = OpenReserve();
  s->thread_ = std::thread([server = s.get()] { server->Loop(); });
  return s;
}

MetricsServer::MetricsServer(int listen_fd, int wake_fd, int port, EndpointOptions options)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), options_(options) {}

MetricsServer::~MetricsServer() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void MetricsServer::RegisterCollectable(const std::weak_ptr<prometheus::Collectable>& c) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(c);
}

void MetricsServer::SetLivenessCheck(LivenessCheck check) {
  absl::MutexLock lock(&mu_);
  liveness_ = std::move(check);
}

int64_t MetricsServer::reserve_accepts() const {
  absl::MutexLock lock(&mu_);
  return reserve_accepts_;
}

std::string MetricsServer::Answer(absl::string_view request) {
  const absl::string_view line = request.substr(0, request.find("\r\n"));
  const size_t space = line.find(' ');
  const absl::string_view method = line.substr(0, space);
  absl::string_view target =
      space == absl::string_view::npos ? "" : line.substr(space + 1, line.find(' ', space + 1) -
                                                                         space - 1);
  target = target.substr(0, target.find('?'));
  if (method != "GET") return Text(405, "Method Not Allowed", "only GET\n");
  if (target == "/healthz") {
    LivenessCheck check;
    {
      absl::MutexLock lock(&mu_);
      check = liveness_;
    }
    const absl::Status live = check ? check() : absl::OkStatus();
    if (live.ok()) return Text(200, "OK", "ok\n");
    return Text(503, "Service Unavailable", absl::StrCat(live.ToString(), "\n"));
  }
  if (target != "/metrics") return Text(404, "Not Found", "serves /metrics and /healthz\n");
  std::vector<prometheus::MetricFamily> families;
  {
    absl::MutexLock lock(&mu_);
    auto dead = std::remove_if(collectables_.begin(), collectables_.end(),
                               [](const auto& c) { return c.expired(); });
    collectables_.erase(dead, collectables_.end());
    for (const auto& weak : collectables_) {
      if (auto c = weak.lock()) {
        std::vector<prometheus::MetricFamily> more = c->Collect();
        families.insert(families.end(), std::make_move_iterator(more.begin()),
                        std::make_move_iterator(more.end()));
      }
    }
  }
  std::ostringstream body;
  prometheus::TextSerializer().Serialize(body, families);
  return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body.str());
}

void MetricsServer::Accept(std::vector<Connection>& connections) {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
      // Out of fds: the reserve's goes to this one connection.
      close(reserve_fd_);
      reserve_fd_ = -1;
      fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        absl::MutexLock lock(&mu_);
        ++reserve_accepts_;
      }
    }
    if (fd < 0) return;  // EAGAIN, or still no fd (the loop backs off)
    if (static_cast<int>(connections.size()) >= options_.max_connections) {
      auto oldest = std::min_element(
          connections.begin(), connections.end(),
          [](const Connection& a, const Connection& b) { return a.accepted_ms < b.accepted_ms; });
      close(oldest->fd);
      connections.erase(oldest);
    }
    const int64_t now = NowMs();
    Connection& c = connections.emplace_back();
    c.fd = fd;
    c.accepted_ms = now;
    c.deadline_ms = now + absl::ToInt64Milliseconds(options_.request_timeout);
  }
}

bool MetricsServer::Serve(Connection& c) {
  if (c.out.empty()) {
    char buffer[4096];
    const ssize_t n = read(c.fd, buffer, sizeof(buffer));
    if (n <= 0) return n == 0 || (errno != EAGAIN && errno != EINTR);
    c.in.append(buffer, static_cast<size_t>(n));
    if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) {
      c.out = Answer(c.in);
    } else if (c.in.size() > kMaxRequestBytes) {
      c.out = Text(431, "Request Header Fields Too Large", "request over 8192 bytes\n");
    } else {
      return false;
    }
    // The answer has its own request_timeout to be read; it is written
    // when the socket is writable.
    c.deadline_ms = NowMs() + absl::ToInt64Milliseconds(options_.request_timeout);
    return false;
  }
  const ssize_t n = send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
  if (n < 0) return errno != EAGAIN && errno != EINTR;
  c.written += static_cast<size_t>(n);
  if (c.written < c.out.size()) return false;
  shutdown(c.fd, SHUT_WR);
  return true;
}

void MetricsServer::Loop() {
  std::vector<Connection> connections;
  std::vector<pollfd> polled;
  int64_t accept_after_ms = 0;  // no fd and no reserve: accepting waits until then
  for (;;) {
    if (reserve_fd_ < 0) reserve_fd_ = OpenReserve();
    const int64_t now = NowMs();
    // Drop what has passed its deadline.
    std::erase_if(connections, [&](const Connection& c) {
      if (c.deadline_ms > now) return false;
      close(c.fd);
      return true;
    });
    int64_t wake_ms = now + 1000;
    polled.clear();
    polled.push_back({.fd = wake_fd_, .events = POLLIN, .revents = 0});
    const bool accepting = now >= accept_after_ms;
    polled.push_back({.fd = accepting ? listen_fd_ : -1, .events = POLLIN, .revents = 0});
    if (!accepting) wake_ms = std::min(wake_ms, accept_after_ms);
    for (const Connection& c : connections) {
      polled.push_back(
          {.fd = c.fd, .events = static_cast<short>(c.out.empty() ? POLLIN : POLLOUT),
           .revents = 0});
      wake_ms = std::min(wake_ms, c.deadline_ms);
    }
    const int ready = poll(polled.data(), polled.size(),
                           static_cast<int>(std::max<int64_t>(0, wake_ms - now)));
    if (ready < 0 && errno != EINTR) break;
    if (polled[0].revents != 0) break;  // stopping
    // Connections first (their indexes match polled[2...]); then new ones.
    std::vector<bool> done(connections.size(), false);
    for (size_t i = 0; i < connections.size(); ++i) {
      const short revents = polled[i + 2].revents;
      if (revents == 0) continue;
      done[i] = Serve(connections[i]);
    }
    size_t kept = 0;
    for (size_t i = 0; i < connections.size(); ++i) {
      if (done[i]) {
        close(connections[i].fd);
      } else {
        if (kept != i) connections[kept] = std::move(connections[i]);  // never onto itself
        ++kept;
      }
    }
    connections.resize(kept);
    if (accepting && polled[1].revents != 0) {
      Accept(connections);
      if (reserve_fd_ < 0 && (reserve_fd_ = OpenReserve()) < 0) {
        accept_after_ms = NowMs() + kNoFdBackoffMs;
      }
    }
  }
  for (const Connection& c : connections) close(c.fd);
}

}  // namespace flashcp::core::runtime::metrics_endpoint
