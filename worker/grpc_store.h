// Group rendezvous over the planner's flashcp.v1.Rendezvous service: a thin
// client (RendezvousClient: Join, AwaitMembers, Set, Get, Abort, Leave, each an
// absl::Status with the server's exact code) and GrpcStore, Gloo's
// rendezvous::Store over it, so that ConnectGloo forms the mesh through the
// planner instead of a shared file system.
#ifndef FLASHCP_WORKER_GRPC_STORE_H_
#define FLASHCP_WORKER_GRPC_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "gloo/rendezvous/store.h"

namespace flashcp::worker {

// One group's view of the Rendezvous service. Every call's gRPC deadline is
// its wait plus `rpc_slack` (the server bounds the wait; the slack covers the
// round trip), so a dead planner gives DEADLINE_EXCEEDED or UNAVAILABLE, never
// a hang. Each Join carries `job_secret` (the job's credential: the group's
// namespace on the planner; empty: the open one) and a member secret this
// client draws at random once, which makes its repeated Joins retries.
// Thread-safe (the stub is).
class RendezvousClient {
 public:
  RendezvousClient(std::shared_ptr<v1::Rendezvous::StubInterface> stub, std::string group,
                   int32_t rank, uint64_t incarnation, std::string job_secret = "",
                   absl::Duration rpc_slack = absl::Seconds(5));

  const std::string& group() const { return group_; }
  int32_t rank() const { return rank_; }

  // The group's world size (the first Join fixes it). Keeps the member token
  // the service returns; every later call carries it.
  absl::StatusOr<int32_t> Join(int32_t world_size);
  absl::StatusOr<std::vector<int32_t>> AwaitMembers(absl::Duration timeout);
  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `timeout` for all keys; DEADLINE_EXCEEDED naming the missing ones.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout);
  absl::Status Abort(const std::string& reason);
  absl::Status Leave();

 private:
  std::string token() const;

  std::shared_ptr<v1::Rendezvous::StubInterface> stub_;
  const std::string group_;
  const int32_t rank_;
  const uint64_t incarnation_;
  const std::string job_secret_;
  const std::string member_secret_;  // 16 random bytes
  const absl::Duration rpc_slack_;
  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);  // from the last successful Join; empty before
};

// What a failing rank learns from its group before it aborts it. It
// publishes its own failure in the group's store (key FailureKey(rank), value
// failure.ToString()), then follows the peers the failures name ("... from
// rank P" / "to rank P", the communicator's wording): it reads P's published
// failure and appends it, then the one P names, and so on, until a rank that
// published nothing, a rank seen before, or a failure naming no peer. A peer
// this rank timed out on may be alive and still waiting on a third rank (a
// lost host): its failure is waited for up to `wait`; a peer that closed its
// connection published first (its communicator closes only after it reports),
// so there it is only looked up. The last rank of the chain is the one that
// stopped taking part. The group's abort (by any rank) ends every wait. The
// failure as it is when the group is already aborted or the rendezvous
// cannot be reached.
// After `rdv` joined, waits until all `world_size` ranks of its group have
// joined, until `deadline` of `clock`; the ranks. While the group forms
// another Join may replace this rank (a stray or restarted process): the wait
// then ends with PERMISSION_DENIED and this rank joins again, taking its
// place back, at most kMaxRejoins times. Any other failure is returned as is.
inline constexpr int kMaxRejoins = 64;
absl::StatusOr<std::vector<int32_t>> AwaitGroup(RendezvousClient& rdv, int32_t world_size,
                                                absl::Time deadline, const core::Clock& clock);

absl::Status TraceGroupFailure(RendezvousClient& rdv, const absl::Status& failure,
                               absl::Duration wait);
std::string FailureKey(int32_t rank);

// gloo::rendezvous::Store over RendezvousClient. Gloo's interface reports
// failure only by exception, so inside the overrides a failed call throws
// gloo::IoException (the type ConnectGloo turns into a Status); the Status
// itself, with the server's exact code, is kept in first_error() for the
// caller to report.
class GrpcStore final : public gloo::rendezvous::Store {
 public:
  // `client` must outlive the store; `timeout` bounds get() and wait() calls
  // that pass none.
  GrpcStore(RendezvousClient* client, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The first failure of any call through this store; OK if none.
  absl::Status first_error() const;

 private:
  [[noreturn]] void Throw(const absl::Status& status);

  RendezvousClient* const client_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_GRPC_STORE_H_
