// A throwaway network of "hosts" for multi-host tests: Linux network
// namespaces made with iproute2, one per host, each with one veth (eth0) on a
// bridge that lives in a namespace of its own, so nothing is added to the
// namespace the test runs in and no address of any other machine is used.
//   auto lab = NetnsLab::Create(3, deadline);   // FailedPrecondition: skip, saying why
//   Subprocess::Start(lab->Exec(1, {worker, "--gloo_host", lab->Address(1), ...}));
//   lab->CutLink(1);                           // host 1 drops off the network
// Host i has address 198.18.0.(i+1)/24 (RFC 2544's benchmarking range, only
// ever on these veths). Names carry the test's pid and a counter, so parallel
// runs never collide; the destructor deletes every namespace it made, and
// Create first deletes those left by runs whose process is gone (a crashed
// test). Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and `ip`.
#ifndef FLASHCP_TESTS_TESTING_NETNS_H_
#define FLASHCP_TESTS_TESTING_NETNS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flashcp::tests::testing {

class NetnsLab {
 public:
  // `hosts` namespaces on one bridge, every link up. FailedPrecondition with
  // the reason when this process cannot (not root, no `ip`, namespaces
  // refused); Internal naming the command for any later failure (what was
  // made by then is deleted).
  static absl::StatusOr<std::unique_ptr<NetnsLab>> Create(int hosts, absl::Time deadline);
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  int hosts() const { return static_cast<int>(host_ns_.size()); }
  const std::string& Namespace(int host) const { return host_ns_[host]; }
  // "198.18.0.<host + 1>", host's own address.
  static std::string Address(int host);
  // argv run inside host's namespace: `ip netns exec NS argv...` (ip execs
  // argv, so the child's pid is the program's).
  std::vector<std::string> Exec(int host, const std::vector<std::string>& argv) const;
  // Sets host's eth0 down: its connections stall (no RST, no FIN), as when a
  // node's link or switch port fails.
  absl::Status CutLink(int host, absl::Time deadline) const;

  // The `ip` binary (absolute path), or FailedPrecondition.
  static absl::StatusOr<std::string> IpBinary();

 private:
  NetnsLab() = default;
  absl::Status Ip(const std::vector<std::string>& args, absl::Time deadline) const;

  std::string ip_;
  std::string switch_ns_;
  std::vector<std::string> host_ns_;
};

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_NETNS_H_
