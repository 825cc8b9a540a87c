#include "core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

// Closes the descriptor on every return path.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::Status FileError(absl::string_view what, absl::string_view verb, absl::string_view path,
                       int errno_value) {
  // Whole, unlike Echo: a local path (at most PATH_MAX), the operator's own.
  return absl::ErrnoToStatus(errno_value, absl::StrCat(what, ": cannot ", verb, " \"",
                                                       absl::CHexEscape(path), "\""));
}

absl::StatusOr<std::string> ReadFile(absl::string_view what, const std::string& path,
                                     int64_t max_bytes) {
  const Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return FileError(what, "open", path, errno);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(f.fd, buf, sizeof(buf));
    if (n == 0) return out;
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(what, "read", path, errno);
    }
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": \"", absl::CHexEscape(path),
                                                     "\" is larger than ", max_bytes, " bytes"));
    }
  }
}

absl::Status WriteFile(absl::string_view what, const std::string& path, absl::string_view data) {
  Fd f{open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)};
  if (f.fd < 0) return FileError(what, "open", path, errno);
  while (!data.empty()) {
    const ssize_t n = write(f.fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(what, "write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  // close() reports a write the kernel deferred (NFS, a full disk).
  const int fd = f.fd;
  f.fd = -1;
  if (close(fd) != 0) return FileError(what, "write", path, errno);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag,
                                    absl::string_view pem_label) {
  FLASHCP_ASSIGN_OR_RETURN(std::string pem, ReadFile(flag, path, kMaxPemFileBytes));
  const size_t begin = pem.find("-----BEGIN ");
  const size_t end = begin == std::string::npos ? begin : pem.find("-----", begin + 11);
  if (end == std::string::npos ||
      !absl::EndsWith(absl::string_view(pem).substr(begin, end - begin), pem_label)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": \"", path, "\" holds no PEM ", pem_label));
  }
  return pem;
}

}  // namespace flashcp::core
