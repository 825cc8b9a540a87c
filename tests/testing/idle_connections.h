// Loopback TCP connections that connect and then send nothing: what an idle
// or malicious client holds open (abuse tests of the planner and of /metrics).
#ifndef FLASHCP_TESTS_TESTING_IDLE_CONNECTIONS_H_
#define FLASHCP_TESTS_TESTING_IDLE_CONNECTIONS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flashcp::tests::testing {

class IdleConnections {
 public:
  IdleConnections() = default;
  ~IdleConnections();  // closes what is still open
  IdleConnections(IdleConnections&& other) noexcept : fds_(std::move(other.fds_)) {}
  IdleConnections& operator=(IdleConnections&& other) noexcept {  // closes this one's first
    CloseAll();
    fds_.swap(other.fds_);
    return *this;
  }

  // Opens `n` connections to `host_port` (numeric IPv4 "127.0.0.1:PORT"),
  // each connected (by the kernel: a listener that never accepts still
  // completes them into its backlog) by `deadline`. Unavailable naming the
  // connection that failed; DeadlineExceeded if one is still connecting.
  absl::Status Open(absl::string_view host_port, int n, absl::Time deadline);

  int size() const { return static_cast<int>(fds_.size()); }

  // How many the peer has closed (EOF or reset on a read), waiting until all
  // have been or `deadline` passes.
  int AwaitClosedByPeer(absl::Time deadline);

  void CloseAll();

 private:
  std::vector<int> fds_;
};

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_IDLE_CONNECTIONS_H_
