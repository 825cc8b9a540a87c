#include "planner_service/plan_stream.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "planner_service/service_calls.h"
#include "proto/convert.h"
#include "proto/plan_batch.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::planner_service {
namespace {

// One PlanStream call. Items are read, parsed, validated and queued on a pool;
// their responses are written in completion order, one write at a time. A
// malformed item gets its own INVALID_ARGUMENT response (batch_id 0) and the
// stream goes on. Flow control: the stream stops reading while
// `stream_window` items are in flight (read, not yet written), while it holds
// `stream_window_bytes` of responses (each item counted at its bound until
// planned, then at its size), while all streams together hold the server's
// bound (HeldBytes), or while an item waits for room in the pool
// (PlanningPool::SubmitOrWait: streams never fill the queue); it resumes as
// writes complete and room opens. Every item is answered exactly once: a
// response (plan or per-item error), or, once the call is cancelled, dropped.
// Finish() is called once, when the client is done sending (or the call is
// cancelled), no item is in flight, no read or write is outstanding and no
// wake-up is pending.
//
// State changes happen under mu_; the operations they decide on (gRPC's
// read, write, finish; the pool's Cancel and the byte bound's Sub, which may
// call other streams) are started after unlocking.
class PlanStreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PlanStreamReactor(const ServiceDeps& deps, grpc::CallbackServerContext* context)
      : deps_(deps),
        context_(context),
        peer_(context->peer()),
        tenant_(CallerOf(*context).calibration.tenant) {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      actions = NextActionsLocked();
    }
    Do(actions);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, or the call ended
      Actions actions;
      {
        absl::MutexLock lock(&mu_);
        reading_ = false;
        reads_done_ = true;
        actions = NextActionsLocked();
      }
      Do(actions);
      return;
    }
    const absl::Time received = deps_.clock->Now();
    uint64_t batch_id = 0;
    absl::StatusOr<Prepared> prepared = Prepare(&read_buf_, deps_, tenant_, &batch_id);
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!finished_ && !cancelled_) {
        deps_.observer->OnInflightChange(+1);
        ++in_flight_;
        if (!prepared.ok()) {
          PushErrorLocked(batch_id, prepared.status(), received);
        } else {
          const uint64_t seq = next_seq_++;
          Item& item = items_[seq];
          item.input = std::move(prepared->input);
          item.input.options.stop = core::StopToken([this] { return StopStatus(); });
          SetIlpBudget(deps_, received, item.input);
          item.received = received;
          item.pool = PoolFor(deps_, item.input.strategy);
          AdjustLocked(prepared->response_bound);
          item.reserved = prepared->response_bound;
          SubmitLocked(seq);
        }
      }
      actions = NextActionsLocked();
    }
    Do(actions);
  }

  void OnWriteDone(bool ok) override {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      AdjustLocked(-writing_bytes_);
      AnswerLocked(ok ? writing_code_ : absl::StatusCode::kCancelled, writing_received_);
      if (!ok) CancelLocked();  // the stream is broken: nobody reads what is left
      actions = NextActionsLocked();
    }
    Do(actions);
  }

  void OnCancel() override {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      CancelLocked();
      actions = NextActionsLocked();
    }
    Do(actions);
  }

  void OnDone() override { delete this; }

 private:
  // An item read and not yet planned: waiting for room, queued or running.
  struct Item {
    proto::PlanInput input;  // moved out by its job
    absl::Time received;
    PlanningPool* pool = nullptr;
    PlanningPool::Ticket ticket = 0;  // while queued
    int64_t reserved = 0;             // its response bound, counted as held
  };
  struct Ready {
    grpc::ByteBuffer bytes;
    absl::StatusCode code;  // the item's outcome, for metrics
    absl::Time received;
  };
  struct Queued {
    uint64_t seq;
    PlanningPool* pool;
    PlanningPool::Ticket ticket;
  };
  struct Actions {
    bool read = false;
    bool write = false;
    bool finish = false;
    bool finish_cancelled = false;  // finish with CANCELLED (ignored by gRPC then) not OK
    int64_t release = 0;            // bytes to give back to deps_.stream_bytes
    std::vector<Queued> cancel;     // jobs to take out of their pools
  };

  absl::Status StopStatus() const {
    if (stop_.load(std::memory_order_relaxed) || context_->IsCancelled()) {
      return absl::CancelledError("planner: the stream was cancelled before the plan was made");
    }
    return absl::OkStatus();
  }

  // Bytes held by this stream and counted in deps_.stream_bytes change by
  // `delta`; a decrease is given back after unlocking (Do).
  void AdjustLocked(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    held_ += delta;
    if (delta > 0) {
      deps_.stream_bytes->Add(delta);
    } else {
      release_ -= delta;
    }
  }

  void PushErrorLocked(uint64_t batch_id, const absl::Status& status, absl::Time received)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<grpc::ByteBuffer> bytes =
        Serialize(proto::ErrorResponseToProto(batch_id, status));
    if (!bytes.ok()) {  // not for a message of a few hundred bytes; counted, not lost
      AnswerLocked(bytes.status().code(), received);
      return;
    }
    AdjustLocked(static_cast<int64_t>(bytes->Length()));
    ready_.push_back(Ready{*std::move(bytes), status.code(), received});
  }

  // Queues item `seq` on its pool, or parks it until the pool has room.
  void SubmitLocked(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Item& item = items_.at(seq);
    PlanningPool::Job job = [this, seq] { RunJob(seq); };
    absl::StatusOr<PlanningPool::Queued> queued =
        item.pool->SubmitOrWait(&job, peer_, [this] { OnPoolRoom(); });
    if (!queued.ok()) {  // shutting down
      const uint64_t batch_id = item.input.batch_id;
      const absl::Time received = item.received;
      DropItemLocked(seq);
      PushErrorLocked(batch_id, queued.status(), received);
      return;
    }
    if (queued->ticket != 0) {
      item.ticket = queued->ticket;
    } else {
      parked_ = seq;
      pool_wait_ = queued->wait;
    }
  }

  // Forgets item `seq` and its reserved bytes (it is answered elsewhere).
  void DropItemLocked(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = items_.find(seq);
    AdjustLocked(-it->second.reserved);
    items_.erase(it);
  }

  // The pool may have room for the parked item (a pool thread, no lock held).
  void OnPoolRoom() {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      pool_wait_ = 0;
      if (parked_) {
        const uint64_t seq = *parked_;
        parked_.reset();
        if (cancelled_) {
          AnswerLocked(absl::StatusCode::kCancelled, items_.at(seq).received);
          DropItemLocked(seq);
        } else {
          SubmitLocked(seq);
        }
      }
      actions = NextActionsLocked();
    }
    Do(actions);
  }

  // All streams' held bytes dropped below their bound.
  void OnBytesRoom() {
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      bytes_wait_ = 0;
      actions = NextActionsLocked();
    }
    Do(actions);
  }

  // On a pool thread.
  void RunJob(uint64_t seq) {
    proto::PlanInput input;
    Actions actions;
    bool dropped = false;
    {
      absl::MutexLock lock(&mu_);
      Item& item = items_.at(seq);
      item.ticket = 0;
      if (cancelled_) {  // Cancel raced with this job's start: nobody waits for it
        AnswerLocked(absl::StatusCode::kCancelled, item.received);
        DropItemLocked(seq);
        actions = NextActionsLocked();
        dropped = true;
      } else {
        input = std::move(item.input);
      }
    }
    if (dropped) {
      Do(actions);
      return;
    }
    absl::StatusCode code;
    absl::StatusOr<grpc::ByteBuffer> bytes;
    {
      const absl::StatusOr<v1::PlanResponse> planned =
          proto::PlanBatch(input, *deps_.clock, *deps_.observer);
      if (planned.ok()) bytes = Serialize(*planned);
      const absl::Status status = !planned.ok() ? planned.status() : bytes.status();
      code = status.code();
      if (!status.ok()) bytes = Serialize(proto::ErrorResponseToProto(input.batch_id, status));
    }
    {
      absl::MutexLock lock(&mu_);
      const absl::Time received = items_.at(seq).received;
      DropItemLocked(seq);
      if (cancelled_ || !bytes.ok()) {
        AnswerLocked(cancelled_ ? absl::StatusCode::kCancelled : code, received);
      } else {
        AdjustLocked(static_cast<int64_t>(bytes->Length()));
        ready_.push_back(Ready{*std::move(bytes), code, received});
      }
      actions = NextActionsLocked();
    }
    Do(actions);
  }

  // One item leaves the stream: answered (written) or dropped.
  void AnswerLocked(absl::StatusCode code, absl::Time received)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    --in_flight_;
    deps_.observer->OnRequestDone("PlanStream", code,
                                  absl::ToDoubleSeconds(deps_.clock->Now() - received));
    deps_.observer->OnInflightChange(-1);
  }

  // Drops every item nobody will read: ready responses now, queued jobs after
  // unlocking (Do), the parked item if its wake-up can be called off. Running
  // jobs stop at their next check (StopStatus) and are dropped in RunJob.
  void CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_) return;
    cancelled_ = true;
    stop_.store(true, std::memory_order_relaxed);
    for (const Ready& r : ready_) {
      AdjustLocked(-static_cast<int64_t>(r.bytes.Length()));
      AnswerLocked(absl::StatusCode::kCancelled, r.received);
    }
    ready_.clear();
    for (const auto& [seq, item] : items_) {
      if (item.ticket != 0) to_cancel_.push_back(Queued{seq, item.pool, item.ticket});
    }
    if (parked_ && items_.at(*parked_).pool->CancelWait(pool_wait_)) {
      pool_wait_ = 0;
      AnswerLocked(absl::StatusCode::kCancelled, items_.at(*parked_).received);
      DropItemLocked(*parked_);
      parked_.reset();
    }
    if (bytes_wait_ != 0 && deps_.stream_bytes->CancelWait(bytes_wait_)) bytes_wait_ = 0;
  }

  Actions NextActionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Actions a;
    a.release = std::exchange(release_, 0);
    a.cancel.swap(to_cancel_);
    if (finished_) return a;
    if (!cancelled_ && !writing_ && !ready_.empty()) {
      write_buf_ = std::move(ready_.front().bytes);
      writing_bytes_ = static_cast<int64_t>(write_buf_.Length());
      writing_code_ = ready_.front().code;
      writing_received_ = ready_.front().received;
      ready_.pop_front();
      writing_ = true;
      a.write = true;
    }
    if (!cancelled_ && !reading_ && !reads_done_ && !parked_ && bytes_wait_ == 0 &&
        in_flight_ < deps_.config.stream_window && held_ < deps_.config.stream_window_bytes) {
      bytes_wait_ = deps_.stream_bytes->BelowOrWait([this] { OnBytesRoom(); });
      if (bytes_wait_ == 0) {
        reading_ = true;
        a.read = true;
      }
    }
    // Not while a read or write is decided or outstanding: another thread's
    // Do() may not have started it yet, and nothing may start after Finish.
    // A cancelled call completes both (ok = false), which comes back here.
    if ((reads_done_ || cancelled_) && in_flight_ == 0 && !reading_ && !writing_ &&
        pool_wait_ == 0 && bytes_wait_ == 0 && a.cancel.empty()) {
      finished_ = true;
      a.finish = true;
      a.finish_cancelled = cancelled_;
    }
    return a;
  }

  // Starts what NextActionsLocked decided, without the lock. After Finish the
  // reactor may be deleted at any moment: nothing may follow it.
  void Do(const Actions& a) {
    if (a.release > 0) deps_.stream_bytes->Sub(a.release);  // may wake other streams
    for (const Queued& q : a.cancel) {
      if (!q.pool->Cancel(q.ticket)) continue;  // started: RunJob answers it
      Actions more;
      {  // never run, so the item is still there
        absl::MutexLock lock(&mu_);
        AnswerLocked(absl::StatusCode::kCancelled, items_.at(q.seq).received);
        DropItemLocked(q.seq);
        more = NextActionsLocked();
      }
      Do(more);
    }
    if (a.write) StartWrite(&write_buf_);
    if (a.read) StartRead(&read_buf_);
    if (a.finish) Finish(a.finish_cancelled ? grpc::Status::CANCELLED : grpc::Status::OK);
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const context_;
  const std::string peer_;      // the client, for the pool's fairness
  const std::string tenant_;    // whose calibration its plans use (CallerOf)
  grpc::ByteBuffer read_buf_;   // owned by the outstanding read (reading_)
  grpc::ByteBuffer write_buf_;  // owned by the outstanding write (writing_)
  std::atomic<bool> stop_{false};  // cancelled_, for the planning threads

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // items read and not yet answered
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;   // response bytes: reserved, ready and writing
  int64_t release_ ABSL_GUARDED_BY(mu_) = 0;  // held bytes freed, not yet given back
  std::vector<Queued> to_cancel_ ABSL_GUARDED_BY(mu_);
  std::deque<Ready> ready_ ABSL_GUARDED_BY(mu_);
  int64_t writing_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusCode writing_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  absl::Time writing_received_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Item> items_ ABSL_GUARDED_BY(mu_);  // parked, queued or running, by seq
  std::optional<uint64_t> parked_ ABSL_GUARDED_BY(mu_);   // the item waiting for pool room
  PlanningPool::WaitId pool_wait_ ABSL_GUARDED_BY(mu_) = 0;  // its pending wake-up
  HeldBytes::WaitId bytes_wait_ ABSL_GUARDED_BY(mu_) = 0;    // pending wake-up to read
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewPlanStreamReactor(
    const ServiceDeps& deps, grpc::CallbackServerContext* context) {
  return new PlanStreamReactor(deps, context);
}

}  // namespace flashcp::planner_service
