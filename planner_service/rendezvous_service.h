// flashcp.v1.Rendezvous (proto/flashcp/v1/rendezvous.proto): the per-group
// key-value store through which worker ranks form a CP group (Gloo's store on
// CPU, the NCCL unique id on GPU), hosted by the planner.
//
// RendezvousState holds every group behind one absl::Mutex; its waits
// (AwaitMembers, Get) block on a CondVar until the condition holds, the
// group is aborted, the state shuts down, or the deadline passes. The
// gRPC adapter (RendezvousService) is the synchronous API on purpose: its
// calls block for up to their timeout, which must not tie up the callback
// threads the Planner service plans on; a sync service gets its own threads.
//
// Bounds: a group name is [A-Za-z0-9._-]{1,64}; world_size is 1..kMaxWorldSize;
// keys are 1..256 bytes, values at most 1 MiB, a group holds at most
// kMaxKeysPerGroup keys and kMaxBytesPerGroup value bytes, the state at most
// kMaxGroups groups and max_total_value_bytes value bytes over all groups
// (kDefaultMaxTotalValueBytes unless the planner's --rendezvous_max_bytes
// says otherwise: without it, 4096 groups x 256 MiB could pin 1 TiB); a Get names 1..kMaxKeysPerGet keys; timeouts are
// 0..kMaxTimeout. Oversize gets RESOURCE_EXHAUSTED, malformed INVALID_ARGUMENT.
#ifndef FLASHCP_PLANNER_SERVICE_RENDEZVOUS_SERVICE_H_
#define FLASHCP_PLANNER_SERVICE_RENDEZVOUS_SERVICE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/rendezvous_limits.h"

namespace flashcp::planner_service {

// The wire contract's bounds, shared with the clients (proto/rendezvous_limits.h).
using proto::rendezvous::kMaxBytesPerGroup;
using proto::rendezvous::kMaxGroupNameBytes;
using proto::rendezvous::kMaxGroups;
using proto::rendezvous::kMaxKeyBytes;
using proto::rendezvous::kMaxKeysPerGet;
using proto::rendezvous::kMaxKeysPerGroup;
using proto::rendezvous::kMaxReasonBytes;
using proto::rendezvous::kMaxTimeout;
using proto::rendezvous::kMaxValueBytes;
using proto::rendezvous::kMaxWorldSize;
// All groups' values together, bytes (the RendezvousState default).
inline constexpr int64_t kDefaultMaxTotalValueBytes = int64_t{1} << 30;

// InvalidArgument naming the field unless `group` is [A-Za-z0-9._-]{1,64}.
absl::Status ValidateGroupName(absl::string_view group);

class RendezvousState {
 public:
  // `max_total_value_bytes` (>= 1) bounds the value bytes of all groups
  // together: a Set beyond it gets RESOURCE_EXHAUSTED.
  explicit RendezvousState(int64_t max_total_value_bytes = kDefaultMaxTotalValueBytes)
      : max_total_value_bytes_(max_total_value_bytes) {}
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  // Registers `rank`. Returns the group's world_size. A rank already present
  // with the same incarnation is OK (a retried Join); with another
  // incarnation ALREADY_EXISTS. On an aborted group, a Join from a rank that
  // is not a live member with that incarnation resets the group (members,
  // keys and the abort are dropped) and joins it: a restarted group forms
  // again; the old members' later calls see the new group.
  absl::StatusOr<int32_t> Join(absl::string_view group, int32_t rank, int32_t world_size,
                               uint64_t incarnation);

  // Waits until world_size ranks have joined; returns the ranks, ascending.
  // NOT_FOUND for an unknown group; DEADLINE_EXCEEDED naming the missing
  // ranks at `deadline`; ABORTED with the reason once the group is aborted.
  absl::StatusOr<std::vector<int32_t>> AwaitMembers(absl::string_view group, absl::Time deadline);

  absl::Status Set(absl::string_view group, absl::string_view key, absl::string_view value);

  // The values of `keys` in order, waiting until `deadline` for all of them
  // (a deadline in the past: no wait); DEADLINE_EXCEEDED naming the missing keys.
  absl::StatusOr<std::vector<std::string>> Get(absl::string_view group,
                                               const std::vector<std::string>& keys,
                                               absl::Time deadline);

  // Marks the group failed; every waiting and later call on it gets ABORTED
  // with "rank R: reason" (the first report is kept).
  absl::Status Abort(absl::string_view group, int32_t rank, absl::string_view reason);

  // Removes the member (rank, incarnation); the group goes when its last
  // member leaves. NOT_FOUND if there is no such member.
  absl::Status Leave(absl::string_view group, int32_t rank, uint64_t incarnation);

  // Wakes every waiter with UNAVAILABLE and refuses later calls likewise
  // (the planner is draining). Idempotent.
  void Shutdown();

  size_t group_count() const;

 private:
  struct Group {
    int32_t world_size = 0;
    std::map<int32_t, uint64_t> members;  // rank -> incarnation
    std::map<std::string, std::string, std::less<>> kv;
    int64_t value_bytes = 0;
    bool aborted = false;
    std::string abort_reason;
  };
  absl::Status Usable(absl::string_view group_name, const Group** group) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const int64_t max_total_value_bytes_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // signalled on every change a waiter may wait for
  std::map<std::string, Group, std::less<>> groups_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t total_value_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // sum of groups_' value_bytes
};

// The gRPC adapter: validates, clamps waits to min(timeout_ms, the call's
// deadline), calls the state, maps the Status (proto/grpc_status.h).
class RendezvousService final : public v1::Rendezvous::Service {
 public:
  explicit RendezvousService(RendezvousState* state) : state_(state) {}

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override;
  grpc::Status AwaitMembers(grpc::ServerContext* context, const v1::AwaitMembersRequest* request,
                            v1::AwaitMembersResponse* response) override;
  grpc::Status Set(grpc::ServerContext* context, const v1::SetRequest* request,
                   v1::SetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   v1::GetResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                     v1::LeaveResponse* response) override;

 private:
  RendezvousState* const state_;
};

// Owns the state and the service; what the planner's server registers.
class RendezvousHost {
 public:
  explicit RendezvousHost(int64_t max_total_value_bytes = kDefaultMaxTotalValueBytes)
      : state_(max_total_value_bytes), service_(&state_) {}
  grpc::Service* service() { return &service_; }
  RendezvousState& state() { return state_; }
  void Shutdown() { state_.Shutdown(); }

 private:
  RendezvousState state_;
  RendezvousService service_;
};

}  // namespace flashcp::planner_service

#endif  // FLASHCP_PLANNER_SERVICE_RENDEZVOUS_SERVICE_H_
