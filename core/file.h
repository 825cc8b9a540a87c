// Whole-file reads and writes for the programs' edges (TLS files and their
// PEM check, --svg,
// flashcp-cpstep's rank files), their errors written once: the code is
// absl::ErrnoToStatus's for the errno (NotFound for ENOENT, PermissionDenied
// for EACCES, ...), the message names what the file is for (the flag) and the
// path. Its own target (flashcp_file): flashcp_core does no I/O.
#ifndef FLASHCP_CORE_FILE_H_
#define FLASHCP_CORE_FILE_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flashcp::core {

// absl::ErrnoToStatus(errno_value, "WHAT: cannot VERB "PATH""), PATH
// C-escaped: the message then ends in ": " and strerror's text.
absl::Status FileError(absl::string_view what, absl::string_view verb, absl::string_view path,
                       int errno_value);

// The bytes of the file at `path`, `what` naming it in errors (FileError,
// verb "open" or "read"); InvalidArgument `WHAT: "PATH" is larger than
// MAX_BYTES bytes` once more than `max_bytes` have been read, so that a path
// that is no such file (/dev/zero) is refused, not held.
absl::StatusOr<std::string> ReadFile(absl::string_view what, const std::string& path,
                                     int64_t max_bytes = std::numeric_limits<int64_t>::max());

// `data` as the file at `path`, created or truncated (FileError, verb "open"
// or "write").
absl::Status WriteFile(absl::string_view what, const std::string& path, absl::string_view data);

// PEM files (certificates, CA bundles, keys) are read whole, at most this
// many bytes: a path that is no such file (/dev/zero) is refused, not held.
inline constexpr int64_t kMaxPemFileBytes = int64_t{16} << 20;

// The file at `path` for `flag`, as the client's TLS options and
// flashcp-planner's TLS flags read it: ReadFile's errors (the errno's code,
// naming both) if it cannot be opened or read; InvalidArgument if it is
// above kMaxPemFileBytes or holds no PEM block whose BEGIN line ends in
// `pem_label` ("CERTIFICATE", "PRIVATE KEY"; "EC PRIVATE KEY" and "RSA
// PRIVATE KEY" end in the latter).
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag,
                                    absl::string_view pem_label);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_FILE_H_
