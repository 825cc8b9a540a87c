// The bounds of flashcp.v1.Rendezvous (proto/flashcp/v1/rendezvous.proto):
// part of the wire contract, so they sit next to the proto where both the
// server (planner_service/) and its clients (worker/) read them, without a
// client depending on the server library. Beyond a size bound the server
// answers RESOURCE_EXHAUSTED, for a malformed field INVALID_ARGUMENT.
#ifndef FLASHCP_PROTO_RENDEZVOUS_LIMITS_H_
#define FLASHCP_PROTO_RENDEZVOUS_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"

namespace flashcp::proto::rendezvous {

inline constexpr int32_t kMaxWorldSize = 1024;           // ranks per group
inline constexpr size_t kMaxGroupNameBytes = 64;         // [A-Za-z0-9._-]{1,64}
inline constexpr size_t kMaxKeyBytes = 256;
inline constexpr size_t kMaxValueBytes = size_t{1} << 20;
inline constexpr size_t kMaxKeysPerGroup = 16384;
// What one key-value entry is charged beyond its key and value bytes (the
// map node and two strings' headers, with allocator slack), so that empty
// values cannot pin memory uncounted.
inline constexpr int64_t kEntryOverheadBytes = 256;
// What one member of a group is charged (its token, twice, and two map
// nodes, with allocator slack): 1,024 members are 1 MiB.
inline constexpr int64_t kMemberOverheadBytes = 1024;
// A group's entries and members, charged key + value + kEntryOverheadBytes
// per entry and kMemberOverheadBytes per member.
inline constexpr int64_t kMaxBytesPerGroup = int64_t{256} << 20;
inline constexpr size_t kMaxGroups = 4096;
inline constexpr size_t kMaxKeysPerGet = 4096;     // distinct keys
// A Get's values together: keeps every answer far below protobuf's 2 GiB
// message limit and within gRPC clients' default 4 MiB receive limit.
inline constexpr int64_t kMaxGetResponseBytes = int64_t{2} << 20;
inline constexpr size_t kMaxReasonBytes = 1024;          // Abort's reason
// JoinRequest.job_secret and member_secret: at most this long; a member
// secret, when set, at least kMinMemberSecretBytes (128 bits: not guessable).
inline constexpr size_t kMaxSecretBytes = 256;
inline constexpr size_t kMinMemberSecretBytes = 16;
inline constexpr absl::Duration kMaxTimeout = absl::Hours(1);  // AwaitMembers, Get: timeout_ms

}  // namespace flashcp::proto::rendezvous

#endif  // FLASHCP_PROTO_RENDEZVOUS_LIMITS_H_
