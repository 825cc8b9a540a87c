// The rendezvous' keys and bounds: peers, identities, namespaces, tokens, group
// names and the options' checks (rendezvous_service.h).
#include "planner_service/rendezvous_service.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/echo.h"
#include "core/status_macros.h"
#include "planner_service/rendezvous_internal.h"
#include "proto/rpc/grpc_status.h"
#include "proto/rpc/raw_message.h"

namespace flashcp::planner_service {

using rendezvous_internal::Aborted;
using rendezvous_internal::EntryBytes;
using rendezvous_internal::GroupKey;
using rendezvous_internal::NameSome;
using rendezvous_internal::NotAMember;
using rendezvous_internal::Quoted;
using rendezvous_internal::ShuttingDown;
using rendezvous_internal::ValidateKey;
using rendezvous_internal::ValidateTimeoutMs;

std::string PeerKey(absl::string_view grpc_peer, absl::string_view identity) {
  if (!identity.empty()) return absl::StrCat("identity:", identity);
  if (absl::StartsWith(grpc_peer, "ipv4:") || absl::StartsWith(grpc_peer, "ipv6:")) {
    const size_t colon = grpc_peer.rfind(':');
    if (colon > 4) return std::string(grpc_peer.substr(0, colon));
  }
  return std::string(grpc_peer);
}

std::string JoinIdentities(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    if (!out.empty()) out += ",";
    // Each name's own commas and backslashes escaped: SANs "a", "b" and the
    // one SAN "a,b" are two identities.
    for (const char c : name) {
      if (c == ',' || c == '\\') out += '\\';
      out += c;
    }
  }
  return out;
}

std::string Sha256(absl::string_view bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string NamespaceKey(absl::string_view identity, absl::string_view job_secret) {
  return Sha256(absl::StrCat(identity.size(), ":", identity, job_secret));
}

std::string RandomToken() {
  std::random_device entropy;
  std::string bytes(16, '\0');
  for (size_t i = 0; i < bytes.size(); i += 4) {
    const uint32_t r = entropy();
    for (size_t j = 0; j < 4; ++j) bytes[i + j] = static_cast<char>((r >> (8 * j)) & 0xff);
  }
  return absl::BytesToHexString(bytes);
}

absl::Status ValidateGroupName(absl::string_view group) {
  if (group.empty() || group.size() > kMaxGroupNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("group: must be 1..", kMaxGroupNameBytes,
                                                   " characters [A-Za-z0-9._-], got ",
                                                   group.size(), " bytes"));
  }
  for (const char c : group) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("group: ", Quoted(group), " has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRendezvousOptions(const RendezvousOptions& o) {
  const auto at_least_one = [](absl::string_view flag, int64_t value) -> absl::Status {
    if (value >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(flag, ": must be at least 1, got ", value));
  };
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_bytes", o.max_total_bytes));
  if (o.idle_timeout < kMinIdleTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rendezvous_idle_timeout: must be at least ",
                     absl::FormatDuration(kMinIdleTimeout), ", got ",
                     absl::FormatDuration(o.idle_timeout)));
  }
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_waiters", o.max_waiters));
  FLASHCP_RETURN_IF_ERROR(
      at_least_one("--rendezvous_max_waiters_per_peer", o.max_waiters_per_peer));
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_waiter_bytes", o.max_waiter_bytes));
  FLASHCP_RETURN_IF_ERROR(at_least_one("--rendezvous_max_answer_bytes", o.max_answer_bytes));
  if (o.max_waiter_bytes_per_peer < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rendezvous_max_waiter_bytes_per_peer: must be at least 0 (0: ",
                     "--rendezvous_max_waiter_bytes / ", kWaiterBytesShares, "), got ",
                     o.max_waiter_bytes_per_peer));
  }
  FLASHCP_RETURN_IF_ERROR(
      at_least_one("--rendezvous_max_waiters_per_member", o.max_waiters_per_member));
  if (o.form_timeout < kMinIdleTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rendezvous_form_timeout: must be at least ",
                     absl::FormatDuration(kMinIdleTimeout), ", got ",
                     absl::FormatDuration(o.form_timeout)));
  }
  return at_least_one("--rendezvous_max_groups_per_peer", o.max_groups_per_peer);
}

int64_t MaxWaiterBytesPerPeer(const RendezvousOptions& o) {
  return o.max_waiter_bytes_per_peer > 0 ? o.max_waiter_bytes_per_peer
                                         : o.max_waiter_bytes / kWaiterBytesShares;
}

int64_t WaiterBytes(const std::vector<std::string>& keys) {
  int64_t bytes = kWaiterOverheadBytes;
  for (const std::string& key : keys) {
    bytes += 2 * static_cast<int64_t>(key.size()) + kWaitKeyOverheadBytes;
  }
  return bytes;
}

}  // namespace flashcp::planner_service
