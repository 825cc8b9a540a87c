// Signals as events, for the planner's and the worker's processes alike: the
// set is blocked in every thread and received synchronously with sigwait, so
// no work ever runs in a signal handler.
#ifndef FLASHCP_RUNTIME_PROCESS_SIGNALS_H_
#define FLASHCP_RUNTIME_PROCESS_SIGNALS_H_

#include <signal.h>

#include <initializer_list>

#include "absl/status/statusor.h"

namespace flashcp::core::runtime::process {

class SignalWaiter {
 public:
  // Blocks `signals` in the calling thread; threads started afterwards inherit
  // the mask. Construct it before any other thread starts (gRPC, civetweb).
  explicit SignalWaiter(std::initializer_list<int> signals);
  // Restores the calling thread's previous mask.
  ~SignalWaiter();
  SignalWaiter(const SignalWaiter&) = delete;
  SignalWaiter& operator=(const SignalWaiter&) = delete;

  // Blocks until one of the signals arrives and returns its number; Internal
  // if sigwait fails.
  absl::StatusOr<int> Wait() const;

 private:
  sigset_t set_;
  sigset_t previous_;
};

}  // namespace flashcp::core::runtime::process

#endif  // FLASHCP_RUNTIME_PROCESS_SIGNALS_H_
