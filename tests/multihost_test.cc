// CP groups across hosts: the planning service, the rendezvous and every
// rank each in a network namespace of its own (tests/testing/netns.h: a
// bridge, veth pairs, one address per host), so a rank reaches its peers and
// the services only over the "network", as pods on different nodes do
// (deploy/k8s's layout: planning replicas, a rendezvous of its own,
// --gloo_host = the pod IP). 2- and 4-rank CPU groups of the real
// flashcp-worker (Gloo over TCP, --gloo_host = the rank's own address) run
// their steps; the container launcher, one per host as pods, forms a group
// with the pod IP; the old default (--gloo_host 127.0.0.1) cannot form one.
// Then a group loses one host's link mid-run and every other rank must fail
// within a bound, naming the lost rank (in its own error, or in the group's
// first failure that it appends). Skipped, saying why, without root or iproute2 (CI has both). Every
// wait is on a line or an exit, with a deadline.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/netns.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/worker_process.h"

namespace flashcp {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::tests::testing::NetnsLab;
using ::flashcp::tests::testing::ParseListeningLine;
using ::flashcp::tests::testing::Subprocess;
using ::flashcp::tests::testing::WorkerProcess;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: the CI box is shared
// The workers' --timeout_s in the link-cut runs: the bound on every
// collective, and so on how long a survivor waits for the lost rank.
constexpr int kCutTimeoutS = 3;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

class MultiHostTest : public ::testing::TestWithParam<int> {
 protected:
  // Host 0 runs the planning service (--serve planning), host 1 the
  // rendezvous (--serve rendezvous), as deploy/k8s runs them; host 2 + r
  // runs rank r.
  static constexpr int kPlanningHost = 0, kRendezvousHost = 1, kFirstRankHost = 2;

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<NetnsLab>> lab =
        NetnsLab::Create(kFirstRankHost + Ranks(), In(kTimeout));
    if (absl::IsFailedPrecondition(lab.status())) GTEST_SKIP() << lab.status().message();
    ASSERT_THAT(lab, IsOk());
    lab_ = *std::move(lab);
    ASSERT_NO_FATAL_FAILURE(StartServer(kPlanningHost, "planning", &planner_, &planner_address_));
    ASSERT_NO_FATAL_FAILURE(
        StartServer(kRendezvousHost, "rendezvous", &rendezvous_, &rendezvous_address_));
  }

  void StartServer(int host, const std::string& serve, std::unique_ptr<Subprocess>* process,
                   std::string* address) {
    const std::string ip = NetnsLab::Address(host);
    auto p = Subprocess::Start(lab_->Exec(
        host, {FLASHCP_PLANNER_BIN, "--listen", ip + ":0", "--metrics", ip + ":0", "--threads",
               "1", "--serve", serve}));
    ASSERT_THAT(p, IsOk());
    *process = *std::move(p);
    for (;;) {
      absl::StatusOr<std::string> line = (*process)->ReadLine(In(kTimeout));
      ASSERT_THAT(line, IsOk()) << serve;
      if (auto a = ParseListeningLine(*line); a.ok()) {
        *address = a->grpc;
        return;
      }
    }
  }

  int Ranks() const { return GetParam(); }

  // Rank `rank` of group `group` in its own namespace; `extra` last (later
  // flags win).
  absl::StatusOr<WorkerProcess> StartRank(int rank, const std::string& group, int64_t steps,
                                          int timeout_s, std::vector<std::string> extra = {}) {
    const std::string host = NetnsLab::Address(kFirstRankHost + rank);
    std::vector<std::string> argv = {FLASHCP_WORKER_BIN,
                                     "--rank",       absl::StrCat(rank),
                                     "--world_size", absl::StrCat(Ranks()),
                                     "--group",      group,
                                     "--planner",    planner_address_,
                                     "--rendezvous", rendezvous_address_,
                                     "--gloo_host",  host,
                                     "--control",    host + ":0",
                                     "--metrics",    host + ":0",
                                     "--device",     "cpu",
                                     "--context",    "2048",
                                     "--heads",      "1",
                                     "--head_dim",   "16",
                                     "--steps",      absl::StrCat(steps),
                                     "--timeout_s",  absl::StrCat(timeout_s)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const std::vector<std::string> in_ns = lab_->Exec(kFirstRankHost + rank, argv);
    return WorkerProcess::Start(in_ns[0], {in_ns.begin() + 1, in_ns.end()}, In(kTimeout));
  }

  std::vector<WorkerProcess> StartGroup(const std::string& group, int64_t steps, int timeout_s,
                                        const std::vector<std::string>& driver_extra = {},
                                        const std::vector<std::string>& extra = {}) {
    std::vector<WorkerProcess> ws;
    for (int r = 0; r < Ranks(); ++r) {
      std::vector<std::string> flags = extra;
      if (r == 0) flags.insert(flags.end(), driver_extra.begin(), driver_extra.end());
      absl::StatusOr<WorkerProcess> w = StartRank(r, group, steps, timeout_s, flags);
      EXPECT_THAT(w.status(), IsOk()) << "rank " << r;
      if (!w.ok()) return {};
      ws.push_back(*std::move(w));
    }
    return ws;
  }

  // Declared first, destroyed last: the processes inside go before their
  // namespaces.
  std::unique_ptr<NetnsLab> lab_;
  std::unique_ptr<Subprocess> planner_, rendezvous_;
  std::string planner_address_, rendezvous_address_;
};

TEST_P(MultiHostTest, GroupAcrossHostsRunsItsSteps) {
  constexpr int kSteps = 4;
  std::vector<WorkerProcess> ws = StartGroup("across", kSteps, /*timeout_s=*/30);
  ASSERT_EQ(static_cast<int>(ws.size()), Ranks());
  for (int r = 0; r < Ranks(); ++r) {
    absl::StatusOr<int> code = ws[r].Finish(In(kTimeout));
    ASSERT_THAT(code, IsOk()) << "rank " << r << ": " << ws[r].output;
    EXPECT_EQ(*code, 0) << "rank " << r << ": " << ws[r].output;
  }
  EXPECT_THAT(ws[0].output, HasSubstr(absl::StrCat("\"steps\":", kSteps, ",")));
}

// The container entrypoint as the StatefulSet runs it: one launcher per "pod"
// (host), 2 ranks each, the pod's address as FLASHCP_GLOO_HOST (the downward
// API's status.podIP in deploy/k8s), NCCL_SOCKET_IFNAME as the h100 overlay
// sets it (the pod's eth0), the planner and rendezvous by address.
// Its fixed ports (control 50061 + k, metrics 9470 + k) are each namespace's
// own, as a pod's are.
TEST_P(MultiHostTest, LauncherPodsFormAGroupWithThePodIp) {
  constexpr int kPerPod = 2;
  const int pods = Ranks() / kPerPod;
  std::vector<std::unique_ptr<Subprocess>> launchers;
  for (int pod = 0; pod < pods; ++pod) {
    const int host = kFirstRankHost + pod;
    auto p = Subprocess::Start(
        lab_->Exec(host, {"/usr/bin/env",
                          absl::StrCat("FLASHCP_NODES=", pods),
                          absl::StrCat("FLASHCP_RANKS_PER_NODE=", kPerPod),
                          absl::StrCat("FLASHCP_NODE_RANK=", pod),
                          "FLASHCP_DEVICE=cpu",
                          "FLASHCP_GROUP=pods",
                          "FLASHCP_PLANNER=" + planner_address_,
                          "FLASHCP_RENDEZVOUS=" + rendezvous_address_,
                          "FLASHCP_GLOO_HOST=" + NetnsLab::Address(host),
                          "NCCL_SOCKET_IFNAME=eth0",  // the h100 overlay's setting
                          // One secret for all pods, as deploy/k8s's Secret gives them.
                          "FLASHCP_JOB_SECRET=multihost-test-job",
                          absl::StrCat("FLASHCP_WORKER=", FLASHCP_WORKER_BIN),
                          "/bin/bash", FLASHCP_LAUNCHER,
                          "--context", "2048", "--heads", "1", "--head_dim", "16",
                          "--steps", "3", "--timeout_s", "30"}),
        {.pipe_stdin = false, .merge_stderr = true});
    ASSERT_THAT(p, IsOk());
    launchers.push_back(*std::move(p));
  }
  for (int pod = 0; pod < pods; ++pod) {
    absl::StatusOr<std::string> out = launchers[pod]->ReadAll(In(kTimeout));
    ASSERT_THAT(out, IsOk()) << "pod " << pod;
    absl::StatusOr<int> code = launchers[pod]->Wait(In(kTimeout));
    ASSERT_THAT(code, IsOk()) << "pod " << pod;
    EXPECT_EQ(*code, 0) << "pod " << pod << ": " << *out;
    EXPECT_THAT(*out, HasSubstr(absl::StrCat("gloo host ", NetnsLab::Address(kFirstRankHost + pod),
                                             ", rendezvous ", rendezvous_address_,
                                             ", job secret given, NCCL_SOCKET_IFNAME=eth0")));
    // The interface NCCL is told to use is the one that carries the pod IP.
    absl::StatusOr<std::string> ip = NetnsLab::IpBinary();
    ASSERT_THAT(ip, IsOk());
    auto show = Subprocess::Start(
        lab_->Exec(kFirstRankHost + pod, {*ip, "-o", "-4", "addr", "show", "dev", "eth0"}),
        {.pipe_stdin = false, .merge_stderr = true});
    ASSERT_THAT(show, IsOk());
    absl::StatusOr<std::string> addr = (*show)->ReadAll(In(kTimeout));
    ASSERT_THAT(addr, IsOk());
    EXPECT_THAT(*addr, HasSubstr(absl::StrCat(" ", NetnsLab::Address(kFirstRankHost + pod), "/")));
    absl::StatusOr<int> shown = (*show)->Wait(In(kTimeout));
    ASSERT_THAT(shown, IsOk());
    EXPECT_EQ(*shown, 0) << *addr;
    if (pod == 0) {
      EXPECT_THAT(*out, HasSubstr("\"steps\":3,")) << *out;  // the driver's RUN line
    }
  }
}

TEST_P(MultiHostTest, LoopbackGlooHostCannotFormAGroupAcrossHosts) {
  // Every rank advertises 127.0.0.1, which on another host is that host: the
  // connections fail or time out at formation, as the issue predicted for pods.
  std::vector<WorkerProcess> ws =
      StartGroup("loopback", 4, kCutTimeoutS, {}, {"--gloo_host", "127.0.0.1"});
  ASSERT_EQ(static_cast<int>(ws.size()), Ranks());
  for (int r = 0; r < Ranks(); ++r) {
    absl::StatusOr<int> code = ws[r].Finish(In(kTimeout));
    ASSERT_THAT(code, IsOk()) << "rank " << r << ": " << ws[r].output;
    EXPECT_EQ(*code, 1) << "rank " << r << ": " << ws[r].output;
    EXPECT_THAT(ws[r].output, HasSubstr("gloo connect")) << "rank " << r;
  }
}

TEST_P(MultiHostTest, RanksSentToAPlanningOnlyPlannerForTheirGroupFailAtOnce) {
  // The rendezvous is not where the plans are: without --rendezvous a rank
  // asks the planning replicas, which answer UNIMPLEMENTED (not retried).
  std::vector<WorkerProcess> ws = StartGroup("misrouted", 4, /*timeout_s=*/30, {},
                                             {"--rendezvous", ""});
  ASSERT_EQ(static_cast<int>(ws.size()), Ranks());
  for (int r = 0; r < Ranks(); ++r) {
    absl::StatusOr<int> code = ws[r].Finish(In(absl::Seconds(20)));  // well inside --timeout_s
    ASSERT_THAT(code, IsOk()) << "rank " << r << ": " << ws[r].output;
    EXPECT_EQ(*code, 1) << "rank " << r << ": " << ws[r].output;
    EXPECT_THAT(ws[r].output, HasSubstr("UNIMPLEMENTED")) << "rank " << r;
  }
}

TEST_P(MultiHostTest, LostHostFailsTheOthersInBoundedTimeNamingIt) {
  const int lost = Ranks() - 1;
  std::vector<WorkerProcess> ws =
      StartGroup("cut", /*steps=*/1000000, kCutTimeoutS, {"--progress_every", "1"});
  ASSERT_EQ(static_cast<int>(ws.size()), Ranks());
  // Steps run across every host before the cut.
  const std::string third_step = "step 3/";
  while (!absl::StrContains(ws[0].output, third_step)) {
    absl::StatusOr<std::string> line = ws[0].process->ReadLine(In(kTimeout));
    ASSERT_THAT(line, IsOk()) << ws[0].output;
    ws[0].output += *line + "\n";
  }
  const absl::Time cut = absl::Now();
  ASSERT_THAT(lab_->CutLink(kFirstRankHost + lost, In(kTimeout)), IsOk());
  // A survivor waits one collective's --timeout_s for the lost rank, then up
  // to one more for it to publish a failure (worker/grpc_store.h,
  // TraceGroupFailure); one blocked on a survivor follows that survivor's
  // published failure to the lost rank and ends with the group's abort. The
  // bound: those two timeouts and slack for a loaded machine.
  const absl::Duration bound = absl::Seconds(2 * kCutTimeoutS + 10);
  absl::Duration slowest;
  int naming_lost = 0;  // survivors whose error names the lost rank
  for (int r = 0; r < Ranks(); ++r) {
    if (r == lost) continue;
    absl::StatusOr<int> code = ws[r].Finish(cut + bound);
    ASSERT_THAT(code, IsOk()) << "rank " << r << " still running " << bound << " after the cut: "
                              << ws[r].output;
    slowest = std::max(slowest, absl::Now() - cut);
    EXPECT_EQ(*code, 1) << "rank " << r << ": " << ws[r].output;
    // "recv of N bytes from rank P" (or "send ... to rank P"): a peer this
    // rank lost, in its own error, in the failures of the peers it traced, or
    // in the group's first failure that it appends. Before the fix, a
    // survivor whose peer closed after timing out, or that timed out on a
    // live peer first, named only that peer.
    static const std::regex peer_re("(from|to) rank ([0-9]+):");
    std::set<int> peers;
    for (std::sregex_iterator it(ws[r].output.begin(), ws[r].output.end(), peer_re), end;
         it != end; ++it) {
      peers.insert(std::stoi((*it)[2].str()));
    }
    EXPECT_FALSE(peers.empty()) << "rank " << r << " names no peer: " << ws[r].output;
    if (peers.count(lost) > 0) ++naming_lost;
    const std::string& out = ws[r].output;
    std::fprintf(stderr, "rank %d, %s after the cut of rank %d: ...%s\n", r,
                 absl::FormatDuration(absl::Now() - cut).c_str(), lost,
                 out.substr(out.size() > 400 ? out.size() - 400 : 0).c_str());
  }
  std::fprintf(stderr,
               "%d ranks: every survivor exited within %s of the link cut; %d of %d name rank "
               "%d\n",
               Ranks(), absl::FormatDuration(slowest).c_str(), naming_lost, Ranks() - 1, lost);
  EXPECT_EQ(naming_lost, Ranks() - 1) << "not every survivor names the lost rank " << lost;
}

INSTANTIATE_TEST_SUITE_P(Ranks, MultiHostTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return absl::StrCat(p.param, "ranks");
                         });

}  // namespace
}  // namespace flashcp
