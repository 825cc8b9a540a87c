#include "core/runtime/process/signals.h"

#include <pthread.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashcp::core::runtime::process {

SignalWaiter::SignalWaiter(std::initializer_list<int> signals) {
  sigemptyset(&set_);
  for (int s : signals) sigaddset(&set_, s);
  pthread_sigmask(SIG_BLOCK, &set_, &previous_);
}

SignalWaiter::~SignalWaiter() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

absl::StatusOr<int> SignalWaiter::Wait() const {
  int sig = 0;
  const int rc = sigwait(&set_, &sig);
  if (rc != 0) return absl::InternalError(absl::StrCat("sigwait: ", std::strerror(rc)));
  return sig;
}

}  // namespace flashcp::core::runtime::process
