#include "core/runtime/process/host_port.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flashcp::core::runtime::process {

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address,
                                                          absl::string_view flag) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": want HOST:PORT, got \"", address, "\""));
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the port must be 0..65535, got \"", address, "\""));
  }
  return std::make_pair(std::string(address.substr(0, colon)), port);
}

}  // namespace flashcp::core::runtime::process
