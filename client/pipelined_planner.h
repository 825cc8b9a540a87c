// Pipelined planning over one PlanStream: keeps up to K batches in flight and
// hands results back in input order, whatever order the server answers in.
//
//   PlanPipelined(client, {.inflight = 8}, next_request, [&](int64_t i, PlanResult r) {...});
//
// The source and the sink run on the calling thread; one helper thread reads
// the stream, so a full send window can never block the replies that would
// drain it.
#ifndef FLASHCP_CLIENT_PIPELINED_PLANNER_H_
#define FLASHCP_CLIENT_PIPELINED_PLANNER_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/planner_client.h"

namespace flashcp::client {

// Cancels a PlanPipelined call from another thread (a watchdog, a destructor):
// the stream in flight is cancelled, so a Write or Read blocked on a planner
// that never answers returns, and PlanPipelined returns CANCELLED. Sticky: a
// PlanPipelined that starts after Cancel() opens no stream and returns
// CANCELLED at once. Thread-safe; must outlive the calls it is passed to.
class PipelineCanceller {
 public:
  void Cancel();
  bool cancelled() const;

  // For PlanPipelined: the stream that Cancel() cancels, until Detach().
  // False (and nothing attached) if Cancel() already ran.
  bool Attach(PlanStream* stream);
  void Detach();

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  PlanStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct PipelineOptions {
  int inflight = 8;  // K >= 1: requests sent whose results the sink has not yet had
  // The stream's deadline covers the whole run, so it is long by default.
  CallOptions call = {.timeout = absl::Hours(1)};
  // Optional: lets another thread end the call early (see PipelineCanceller).
  PipelineCanceller* canceller = nullptr;
};

// Returns the next request, or nullopt at the end. Its batch_id is replaced by
// the request's 0-based input position (the stream's correlation key).
using RequestSource = absl::FunctionRef<std::optional<v1::PlanRequest>()>;
// Gets every request's result exactly once, in input order: the response, or
// that item's own error (the server's per-item `error`, code and message).
using ResultSink = absl::FunctionRef<void(int64_t index, PlanResult result)>;

// OK when every request from `source` reached `sink`. Otherwise the stream
// broke (the call's status, e.g. UNAVAILABLE or DEADLINE_EXCEEDED, with how
// many results arrived) or the server answered a batch_id not in flight
// (INTERNAL), or options.canceller cancelled it (CANCELLED); results already
// delivered stay delivered, later ones are not. INVALID_ARGUMENT if options.inflight < 1.
absl::Status PlanPipelined(PlannerClient& client, const PipelineOptions& options,
                           RequestSource source, ResultSink sink);

}  // namespace flashcp::client

#endif  // FLASHCP_CLIENT_PIPELINED_PLANNER_H_
