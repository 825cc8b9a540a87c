#include "client/pipelined_planner.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/convert.h"

namespace flashcp::client {
namespace {

// What the reader thread hands the calling thread, guarded by `mu`.
struct Inbox {
  absl::Mutex mu;
  int64_t sent ABSL_GUARDED_BY(mu) = 0;  // requests written: ids [0, sent) are valid
  std::map<int64_t, v1::PlanResponse> ready ABSL_GUARDED_BY(mu);  // by batch id
  bool ended ABSL_GUARDED_BY(mu) = false;  // Read returned false
  absl::Status protocol_error ABSL_GUARDED_BY(mu);
  int64_t want ABSL_GUARDED_BY(mu) = 0;  // the id the calling thread waits for

  bool CanProceed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return ended || !protocol_error.ok() || ready.count(want) > 0;
  }
};

void ReadAll(PlanStream& stream, Inbox& inbox, int64_t* delivered_floor) {
  v1::PlanResponse response;
  while (stream.Read(&response)) {
    absl::MutexLock lock(&inbox.mu);
    const auto id = static_cast<int64_t>(response.batch_id());
    if (id >= inbox.sent || id < *delivered_floor || inbox.ready.count(id) > 0) {
      inbox.protocol_error = absl::InternalError(
          absl::StrCat("server answered batch_id ", response.batch_id(),
                       ", which is not in flight"));
      break;
    }
    inbox.ready.emplace(id, std::move(response));
    response = v1::PlanResponse();
  }
  absl::MutexLock lock(&inbox.mu);
  inbox.ended = true;
}

}  // namespace

void PipelineCanceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  // PlanStream::Cancel may run while other threads Read and Write.
  if (stream_ != nullptr) stream_->Cancel();
}

bool PipelineCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool PipelineCanceller::Attach(PlanStream* stream) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  stream_ = stream;
  return true;
}

void PipelineCanceller::Detach() {
  absl::MutexLock lock(&mu_);
  stream_ = nullptr;
}

absl::Status PlanPipelined(PlannerClient& client, const PipelineOptions& options,
                           RequestSource source, ResultSink sink) {
  if (options.inflight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("inflight must be >= 1, got ", options.inflight));
  }
  if (options.canceller != nullptr && options.canceller->cancelled()) {
    return absl::CancelledError("PlanStream cancelled before it opened");
  }
  std::unique_ptr<PlanStream> stream = client.OpenPlanStream(options.call);
  // Attached until Finish: the canceller never touches a destroyed stream.
  if (options.canceller != nullptr && !options.canceller->Attach(stream.get())) {
    stream->Cancel();  // Cancel() ran between the check above and Attach
    (void)stream->Finish();
    return absl::CancelledError("PlanStream cancelled before it opened");
  }
  Inbox inbox;
  // Ids below this were delivered; read by the reader under inbox.mu.
  int64_t delivered = 0;
  std::thread reader([&] { ReadAll(*stream, inbox, &delivered); });

  int64_t next = 0;  // the next request's id
  bool source_done = false;
  bool write_failed = false;
  bool broken = false;
  while (true) {
    // Fill the window.
    while (!source_done && !write_failed && next - delivered < options.inflight) {
      std::optional<v1::PlanRequest> request = source();
      if (!request.has_value()) {
        source_done = true;
        stream->WritesDone();
        break;
      }
      request->set_batch_id(static_cast<uint64_t>(next));
      {
        absl::MutexLock lock(&inbox.mu);
        inbox.sent = next + 1;
      }
      if (!stream->Write(*request)) {
        write_failed = true;
        break;
      }
      ++next;
    }
    if (delivered == next && (source_done || write_failed)) break;

    // Wait for the next result in input order.
    std::optional<v1::PlanResponse> response;
    {
      absl::MutexLock lock(&inbox.mu);
      inbox.want = delivered;
      inbox.mu.Await(absl::Condition(&inbox, &Inbox::CanProceed));
      auto it = inbox.ready.find(delivered);
      if (it != inbox.ready.end()) {
        response = std::move(it->second);
        inbox.ready.erase(it);
      }
    }
    if (!response.has_value()) {
      broken = true;
      break;
    }
    const int64_t index = delivered;
    {
      absl::MutexLock lock(&inbox.mu);
      ++delivered;
    }
    if (response->has_error()) {
      sink(index, proto::ErrorFromProto(response->error()));
    } else {
      sink(index, *std::move(response));
    }
  }

  absl::Status protocol_error;
  {
    absl::MutexLock lock(&inbox.mu);
    protocol_error = inbox.protocol_error;
  }
  // Only a stream the server still sends on is cancelled: one that broke
  // (a failed write or the read side ended) is over already, and a Cancel
  // here would replace the transport's status (UNAVAILABLE) with CANCELLED.
  if (!protocol_error.ok()) stream->Cancel();
  reader.join();
  const absl::Status final_status = stream->Finish();
  if (options.canceller != nullptr) options.canceller->Detach();
  if (!protocol_error.ok()) return protocol_error;
  const std::string context =
      absl::StrCat("PlanStream ended after ", delivered, " of ", next, " results: ");
  // Whatever the transport made of it (gRPC: CANCELLED; a fake: anything).
  if ((broken || write_failed) && options.canceller != nullptr &&
      options.canceller->cancelled()) {
    return absl::CancelledError(absl::StrCat(context, "cancelled"));
  }
  if (!broken && !write_failed) return final_status;
  if (!final_status.ok()) {
    return absl::Status(final_status.code(), absl::StrCat(context, final_status.message()));
  }
  return absl::InternalError(absl::StrCat(context, "the server closed the stream early"));
}

}  // namespace flashcp::client
