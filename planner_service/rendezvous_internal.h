// What the rendezvous' files (rendezvous_keys.cc, rendezvous_state.cc,
// rendezvous_waits.cc, rendezvous_service.cc) share and nothing else uses:
// field checks and the errors they word alike. Not part of the planner's API.
#ifndef FLASHCP_PLANNER_SERVICE_RENDEZVOUS_INTERNAL_H_
#define FLASHCP_PLANNER_SERVICE_RENDEZVOUS_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "planner_service/rendezvous_service.h"

namespace flashcp::planner_service::rendezvous_internal {

inline absl::Status ValidateKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: must be 1..", kMaxKeyBytes, " bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

inline absl::Status ValidateTimeoutMs(int64_t timeout_ms) {
  if (timeout_ms < 0 || timeout_ms > absl::ToInt64Milliseconds(kMaxTimeout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms: must be in [0, ", absl::ToInt64Milliseconds(kMaxTimeout), "], got ",
        timeout_ms));
  }
  return absl::OkStatus();
}

inline std::string Quoted(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

// "a, b, c", naming at most kMaxNamedInError items, then " and N more".
template <typename T, typename Name>
std::string NameSome(const std::vector<T>& items, Name name) {
  std::string out;
  const size_t named = std::min(items.size(), kMaxNamedInError);
  for (size_t i = 0; i < named; ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", name(items[i]));
  if (items.size() > named) absl::StrAppend(&out, " and ", items.size() - named, " more");
  return out;
}

inline absl::Status ShuttingDown() {
  return absl::UnavailableError("rendezvous: the planner is shutting down");
}

// The one answer to a token that is no live member's of a group so named,
// whether or not such a group exists: a non-member learns nothing of it.
inline absl::Status NotAMember(absl::string_view group) {
  return absl::PermissionDeniedError(absl::StrCat(
      "group ", Quoted(group),
      ": the token is no live member's (a replaced member's token, one from before the group "
      "was re-formed or dropped, or one of no group is void)"));
}

inline absl::Status Aborted(const std::string& name, const std::string& reason) {
  return absl::AbortedError(absl::StrCat("group ", Quoted(name), " aborted: ", reason));
}

// The groups_ key: the namespace, then the name.
inline std::string GroupKey(absl::string_view identity, absl::string_view job_secret,
                     absl::string_view name) {
  return absl::StrCat(NamespaceKey(identity, job_secret), name);
}

inline int64_t EntryBytes(absl::string_view key, absl::string_view value) {
  return static_cast<int64_t>(key.size() + value.size()) + kEntryOverheadBytes;
}

}  // namespace flashcp::planner_service::rendezvous_internal

#endif  // FLASHCP_PLANNER_SERVICE_RENDEZVOUS_INTERNAL_H_
