// Untrusted input quoted back in an error message: truncated, so that a
// huge field cannot make a huge error (gRPC puts the message in a header, and
// a header above its limit turns INVALID_ARGUMENT into RESOURCE_EXHAUSTED),
// and escaped, so that control bytes and invalid UTF-8 stay printable.
#ifndef FLASHCP_CORE_ECHO_H_
#define FLASHCP_CORE_ECHO_H_

#include <cstddef>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace flashcp::core {

// Input bytes an error quotes at most.
inline constexpr size_t kMaxEchoBytes = 64;

// `input` in double quotes, C-escaped; past kMaxEchoBytes cut, with the
// full length: "abc..."... (1048576 bytes). At most 4 * kMaxEchoBytes + 40 chars.
inline std::string Echo(absl::string_view input) {
  if (input.size() <= kMaxEchoBytes) return absl::StrCat("\"", absl::CHexEscape(input), "\"");
  return absl::StrCat("\"", absl::CHexEscape(input.substr(0, kMaxEchoBytes)), "\"... (",
                      input.size(), " bytes)");
}

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_ECHO_H_
