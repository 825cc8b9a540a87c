// The Gloo backend of Communicator: TCP (loopback by default, ephemeral
// ports), one full mesh of pairs per group, point-to-point transfers on Gloo's
// unbound buffers so every wait is bounded and names its peer. Ranks may be
// threads of one process or separate processes: the same code runs both; only
// the rendezvous store differs (HashStore for threads, FileStore in a shared
// temporary directory for processes, a gRPC-served store later), and it is
// injected.
#ifndef FLASHCP_WORKER_GLOO_COMMUNICATOR_H_
#define FLASHCP_WORKER_GLOO_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/communicator.h"

namespace flashcp::worker {

struct GlooOptions {
  std::string hostname = "127.0.0.1";  // address the rank listens on (port chosen by the OS)
  // Bound on the rendezvous and on every operation, end to end: a peer that
  // does not take part within it makes the call return kDeadlineExceeded.
  absl::Duration timeout = absl::Seconds(30);
};

// Sets SIGPIPE to SIG_IGN, process-wide, if it is at its default action (a
// handler the program installed is kept). Gloo writes with writev, which
// cannot pass MSG_NOSIGNAL, so without this a peer that closes its socket
// kills the process instead of failing the operation. A signal disposition is
// the program's to choose: main() (or a test's setup) calls this before
// ConnectGloo; the library never does.
void IgnoreSigpipe();

// Joins the group of `size` ranks as `rank` through `store` (used only during
// this call) and connects the full mesh. InvalidArgument for a bad rank/size
// or timeout; FailedPrecondition if SIGPIPE is at its default action (see
// IgnoreSigpipe); DeadlineExceeded if the other ranks do not arrive within the
// timeout; Unavailable for a transport failure.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(gloo::rendezvous::Store& store,
                                                          int32_t rank, int32_t size,
                                                          const GlooOptions& options = {});

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_GLOO_COMMUNICATOR_H_
