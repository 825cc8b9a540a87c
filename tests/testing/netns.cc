#include "tests/testing/netns.h"

#include <dirent.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/subprocess.h"

namespace flashcp::tests::testing {
namespace {

// Every name this helper makes starts with it, then "<pid>-<counter>".
constexpr char kPrefix[] = "fcpmh-";
constexpr char kNetnsDir[] = "/run/netns";

std::atomic<int> next_lab{0};

absl::StatusOr<CommandResult> RunIp(const std::string& ip, const std::vector<std::string>& args,
                                    absl::Time deadline) {
  std::vector<std::string> argv = {ip};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, "", deadline);
}

// Deletes the namespaces of labs whose test process is gone.
void DeleteStale(const std::string& ip, absl::Time deadline) {
  DIR* dir = opendir(kNetnsDir);
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (!absl::StartsWith(name, kPrefix)) continue;
    const std::vector<std::string> parts = absl::StrSplit(name.substr(sizeof(kPrefix) - 1), '-');
    int pid = 0;
    if (parts.empty() || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(name);
  }
  closedir(dir);
  for (const std::string& name : stale) (void)RunIp(ip, {"netns", "del", name}, deadline);
}

}  // namespace

absl::StatusOr<std::string> NetnsLab::IpBinary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return std::string(path);
  }
  return absl::FailedPreconditionError(
      "iproute2's `ip` not found (Debian package iproute2; scripts/install-deps.sh installs it)");
}

std::string NetnsLab::Address(int host) { return absl::StrCat("198.18.0.", host + 1); }

std::vector<std::string> NetnsLab::Exec(int host, const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {ip_, "netns", "exec", host_ns_[host]};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status NetnsLab::Ip(const std::vector<std::string>& args, absl::Time deadline) const {
  absl::StatusOr<CommandResult> r = RunIp(ip_, args, deadline);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::InternalError(absl::StrCat("ip ", absl::StrJoin(args, " "), " exited ",
                                            r->exit_code, ": ", r->output));
  }
  return absl::OkStatus();
}

absl::Status NetnsLab::CutLink(int host, absl::Time deadline) const {
  return Ip({"-n", host_ns_[host], "link", "set", "dev", "eth0", "down"}, deadline);
}

absl::StatusOr<std::unique_ptr<NetnsLab>> NetnsLab::Create(int hosts, absl::Time deadline) {
  if (hosts < 1 || hosts > 200) {
    return absl::InvalidArgumentError(absl::StrCat("hosts must be in [1, 200], got ", hosts));
  }
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); run as root, as CI does");
  }
  std::unique_ptr<NetnsLab> lab(new NetnsLab());
  absl::StatusOr<std::string> ip = IpBinary();
  if (!ip.ok()) return ip.status();
  lab->ip_ = *ip;
  DeleteStale(lab->ip_, deadline);
  const std::string base = absl::StrCat(kPrefix, getpid(), "-", next_lab++);
  lab->switch_ns_ = base + "-sw";
  // The first namespace decides whether this process may make any: a
  // container without CAP_SYS_ADMIN refuses it, and the test is skipped.
  if (absl::Status s = lab->Ip({"netns", "add", lab->switch_ns_}, deadline); !s.ok()) {
    lab->switch_ns_.clear();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a network namespace here: ", s.message()));
  }
  const auto& sw = lab->switch_ns_;
  if (absl::Status s = lab->Ip({"-n", sw, "link", "add", "br0", "type", "bridge"}, deadline);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = lab->Ip({"-n", sw, "link", "set", "br0", "up"}, deadline); !s.ok()) {
    return s;
  }
  for (int h = 0; h < hosts; ++h) {
    const std::string ns = absl::StrCat(base, "-h", h);
    if (absl::Status s = lab->Ip({"netns", "add", ns}, deadline); !s.ok()) return s;
    lab->host_ns_.push_back(ns);
    const std::string port = absl::StrCat("p", h);  // the bridge's side, in the switch namespace
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
              "netns", sw},
             {"-n", sw, "link", "set", port, "master", "br0", "up"},
             {"-n", ns, "addr", "add", Address(h) + "/24", "dev", "eth0"},
             {"-n", ns, "link", "set", "eth0", "up"},
             {"-n", ns, "link", "set", "lo", "up"}}) {
      if (absl::Status s = lab->Ip(args, deadline); !s.ok()) return s;
    }
  }
  return lab;
}

NetnsLab::~NetnsLab() {
  // Deleting a namespace destroys its veth end, and so the pair. Processes
  // still inside keep theirs alive until they exit; the name goes now.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (const std::string& ns : host_ns_) (void)Ip({"netns", "del", ns}, deadline);
  if (!switch_ns_.empty()) (void)Ip({"netns", "del", switch_ns_}, deadline);
}

}  // namespace flashcp::tests::testing
