#include "planner_service/service.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/ilp_deadline.h"
#include "core/status_macros.h"
#include "core/strategies.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "proto/plan_batch.h"
#include "proto/convert.h"
#include "proto/raw_message.h"
#include "proto/grpc_status.h"

namespace flashcp::planner_service {
namespace {

constexpr char kApiVersion[] = "flashcp.v1";

// A client whose deadline passes cancels the call itself, and that reaches us
// before our copy of the deadline (arrival time + the grpc-timeout header)
// passes: by the request's transit time, milliseconds on a loaded machine.
// A cancellation this close to the deadline is
// counted as the deadline's: within 50 ms, and within a tenth of the call's
// budget, so that an explicit cancel of a short call still counts as one.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(50);

// Why a call that nobody waits for any more ended: its deadline passed, or the
// client cancelled it. `received`: when the call arrived.
absl::Status DroppedStatus(const grpc::CallbackServerContext& context, const core::Clock& clock,
                           absl::Time received) {
  const absl::Time deadline = absl::FromChrono(context.deadline());
  const absl::Duration slack = std::min(kDeadlineSlack, (deadline - received) / 10);
  if (deadline <= clock.Now() + slack) {
    return absl::DeadlineExceededError("planner: the deadline passed before the plan was made");
  }
  return absl::CancelledError("planner: the call was cancelled before the plan was made");
}

// The host of a gRPC peer string ("ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1",
// "ipv6:[::1]:5000" -> "ipv6:[::1]"); other forms as they are.
std::string PeerHost(const std::string& peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return peer;
  const size_t colon = peer.rfind(':');
  return colon <= 4 ? peer : peer.substr(0, colon);
}

// Whose calibration a call reads or feeds (calibration.h), and the key its
// reports are rate-limited by: the peer's mTLS identity where it presented
// one (its identities, each length-prefixed so that no two lists collide);
// else the connection (tenant) and its host (rate limit).
struct Caller {
  CalibrationCaller calibration;
  std::string rate_key;
};
Caller CallerOf(const grpc::CallbackServerContext& context) {
  Caller c;
  const std::string peer = context.peer();
  c.calibration.reporter = peer;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    std::string id = "id:";
    for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
      absl::StrAppend(&id, name.size(), ":", absl::string_view(name.data(), name.size()), ";");
    }
    c.calibration.tenant = id;
    c.rate_key = id;
  } else {
    c.calibration.tenant = absl::StrCat("conn:", peer);
    c.rate_key = absl::StrCat("host:", PeerHost(peer));
  }
  return c;
}

// One PlanRequest message read off the wire and made ready to plan.
struct Prepared {
  proto::PlanInput input;
  int64_t response_bound = 0;  // bytes its answer may take (CheckPlanBounds)
};

// Size check, parse, validation, the ILP switch and the plan's bounds, in
// this order. `batch_id` is set once the message parsed.
absl::StatusOr<Prepared> Prepare(grpc::ByteBuffer* bytes, const ServiceDeps& deps,
                                 const std::string& tenant, uint64_t* batch_id) {
  const ServiceConfig& config = deps.config;
  const int64_t max_bytes = proto::MaxRequestBytes(config.limits);
  if (static_cast<int64_t>(bytes->Length()) > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request: ", bytes->Length(), " bytes, above the largest valid flashcp.v1.PlanRequest "
        "at this server's --max_docs, --max_tokens and --max_cp_size (", max_bytes, " bytes)"));
  }
  v1::PlanRequest request;
  FLASHCP_RETURN_IF_ERROR(proto::ParseRaw(bytes, &request));
  *batch_id = request.batch_id();
  // A named profile is planned with the caller's calibrated fit where it has
  // one, and validated against it (rank_speed), once.
  proto::CostResolver resolve;
  if (deps.calibration != nullptr) {
    resolve = [&](absl::string_view profile) {
      return deps.calibration->Resolve(tenant, profile);
    };
  }
  FLASHCP_ASSIGN_OR_RETURN(proto::PlanInput input,
                           proto::RequestFromProto(request, config.limits, resolve));
  if (input.strategy == core::Strategy::kIlp && !config.allow_ilp) {
    return absl::UnimplementedError(
        "strategy: ilp is disabled on this server (start it with --allow_ilp)");
  }
  FLASHCP_ASSIGN_OR_RETURN(const int64_t bound, proto::CheckPlanBounds(input, config.bounds));
  return Prepared{std::move(input), bound};
}

// The pool `strategy` plans on: the ILP has its own, so that its long plans
// never hold the threads the other strategies' quick ones need.
PlanningPool* PoolFor(const ServiceDeps& deps, core::Strategy strategy) {
  return strategy == core::Strategy::kIlp ? deps.ilp_pool : deps.pool;
}

// The ILP's time limit counts from the call's arrival (`received`), setup
// and queueing included: CBC stops when it is spent.
void SetIlpBudget(const ServiceDeps& deps, absl::Time received, proto::PlanInput& input) {
  if (input.strategy != core::Strategy::kIlp) return;
  core::SetIlpDeadline(deps.config.ilp_time_limit, received, deps.clock, input.options.ilp);
}

template <typename Message>
absl::StatusOr<grpc::ByteBuffer> Serialize(const Message& response) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  const grpc::Status s =
      grpc::SerializationTraits<Message>::Serialize(response, &bytes, &own_buffer);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("planner: cannot serialize the response: ",
                                            s.error_message()));
  }
  return bytes;
}

// One unary Plan call. Lives from Plan() until OnDone(); Finish() is called
// exactly once: on a validation or admission error (gRPC thread), from the
// planning job (pool thread), or from OnCancel when the job was still queued.
// A job already running stops at its next check of the call's StopToken.
class PlanReactor final : public grpc::ServerUnaryReactor {
 public:
  PlanReactor(const ServiceDeps& deps, grpc::CallbackServerContext* context,
              const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : deps_(deps), context_(context), response_(response), received_(deps.clock->Now()) {
    deps_.observer->OnInflightChange(+1);
    grpc::ByteBuffer bytes(*request);  // shares the slices
    uint64_t batch_id = 0;
    absl::StatusOr<Prepared> prepared =
        Prepare(&bytes, deps_, CallerOf(*context).calibration.tenant, &batch_id);
    if (!prepared.ok()) {
      FinishWith(prepared.status());
      return;
    }
    proto::PlanInput input = std::move(prepared->input);
    input.options.stop = core::StopToken([this] { return StopStatus(); });
    SetIlpBudget(deps_, received_, input);
    pool_ = PoolFor(deps_, input.strategy);
    absl::Status admitted;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<PlanningPool::Ticket> ticket =
          pool_->Submit([this, in = std::move(input)] { RunJob(in); }, context_->peer());
      if (ticket.ok()) {
        ticket_ = *ticket;
      } else {
        admitted = ticket.status();
      }
    }
    if (!admitted.ok()) FinishWith(admitted);
  }

  void OnCancel() override {
    bool dropped = false;
    {
      absl::MutexLock lock(&mu_);
      dropped = ticket_.has_value() && pool_->Cancel(*ticket_);
    }
    // Removed from the queue: the job will never run, so it is ours to finish.
    if (dropped) FinishWith(DroppedStatus(*context_, *deps_.clock, received_));
  }

  void OnDone() override { delete this; }

 private:
  // Why the plan should stop, or OK: the call was cancelled or its deadline
  // passed (gRPC cancels a call whose deadline passed).
  absl::Status StopStatus() const {
    if (!context_->IsCancelled()) return absl::OkStatus();
    return DroppedStatus(*context_, *deps_.clock, received_);
  }

  // On a pool thread.
  void RunJob(const proto::PlanInput& input) {
    absl::StatusOr<v1::PlanResponse> planned =
        proto::PlanBatch(input, *deps_.clock, *deps_.observer);
    if (!planned.ok()) {
      FinishWith(planned.status());
      return;
    }
    absl::StatusOr<grpc::ByteBuffer> bytes = Serialize(*planned);
    if (bytes.ok()) *response_ = *std::move(bytes);
    FinishWith(bytes.status());
  }

  // Reports and finishes; the reactor may be deleted as soon as Finish runs.
  void FinishWith(const absl::Status& status) {
    deps_.observer->OnRequestDone(
        "Plan", status.code(), absl::ToDoubleSeconds(deps_.clock->Now() - received_));
    deps_.observer->OnInflightChange(-1);
    Finish(proto::ToGrpcStatus(status));
  }

  const ServiceDeps& deps_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  const absl::Time received_;
  PlanningPool* pool_ = nullptr;  // set before the job is submitted
  absl::Mutex mu_;  // orders the ticket's publication against OnCancel
  std::optional<PlanningPool::Ticket> ticket_ ABSL_GUARDED_BY(mu_);
};

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

grpc::ServerUnaryReactor* PlannerService::Plan(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  return new PlanReactor(deps_, context, request, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PlannerService::PlanStream(
    grpc::CallbackServerContext* context) {
  return new PlanStreamReactor(deps_, context);
}

namespace {

// A unary call with a small fixed answer: its `Request` parsed (INVALID_ARGUMENT
// if it is not one), `fill` builds the `Reply`, serialized into `out`.
template <typename Request, typename Reply>
grpc::ServerUnaryReactor* AnswerSmallCall(const ServiceDeps& deps, absl::string_view method,
                                          grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                          const std::function<void(Reply&)>& fill) {
  const absl::Time received = deps.clock->Now();
  grpc::ByteBuffer bytes(*in);
  Request request;
  absl::Status status = proto::ParseRaw(&bytes, &request);
  if (status.ok()) {
    Reply reply;
    fill(reply);
    absl::StatusOr<grpc::ByteBuffer> serialized = Serialize(reply);
    status = serialized.status();
    if (serialized.ok()) *out = *std::move(serialized);
  }
  deps.observer->OnRequestDone(method, status.code(),
                               absl::ToDoubleSeconds(deps.clock->Now() - received));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(proto::ToGrpcStatus(status));
  return reactor;
}

// One ReportStepTimes call: rate-limited per client (Caller::rate_key),
// checked and parsed on the gRPC thread; the refit runs on the calibration's
// own thread, which finishes the call.
class ReportReactor final : public grpc::ServerUnaryReactor {
 public:
  ReportReactor(const ServiceDeps& deps, grpc::CallbackServerContext* context,
                const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : deps_(deps), response_(response), received_(deps.clock->Now()) {
    absl::StatusOr<proto::StepTimesReport> report = Check(*context, *request);
    if (!report.ok()) {
      FinishWith(report.status());
      return;
    }
    const int64_t accepted = static_cast<int64_t>(report->samples.size());
    deps_.calibration->Report(
        CallerOf(*context).calibration, *std::move(report),
        [this, accepted](absl::StatusOr<core::CostCalibrator::State> state) {
          absl::Status status = state.status();
          if (state.ok()) {
            absl::StatusOr<grpc::ByteBuffer> bytes =
                Serialize(proto::StepTimesResponseToProto(accepted, *state));
            status = bytes.status();
            if (bytes.ok()) *response_ = *std::move(bytes);
          }
          FinishWith(status);
        });
  }

  void OnDone() override { delete this; }

 private:
  absl::StatusOr<proto::StepTimesReport> Check(const grpc::CallbackServerContext& context,
                                               const grpc::ByteBuffer& request) {
    if (deps_.calibration == nullptr) {
      return absl::UnimplementedError("ReportStepTimes: this planner does not calibrate");
    }
    if (deps_.report_limiter != nullptr &&
        !deps_.report_limiter->Allow(CallerOf(context).rate_key)) {
      const KeyedRateLimiter::Options& o = deps_.report_limiter->options();
      return absl::ResourceExhaustedError(absl::StrCat(
          "ReportStepTimes: rate limit: at most ", o.per_second, " reports per second (bursts of ",
          o.burst, ") per client (mTLS identity, else host); retry later"));
    }
    if (static_cast<int64_t>(request.Length()) > proto::kMaxReportBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "request: ", request.Length(), " bytes, above the largest valid "
          "flashcp.v1.ReportStepTimesRequest (", proto::kMaxReportBytes, " bytes)"));
    }
    grpc::ByteBuffer bytes(request);
    v1::ReportStepTimesRequest message;
    FLASHCP_RETURN_IF_ERROR(proto::ParseRaw(&bytes, &message));
    return proto::StepTimesFromProto(message);
  }

  void FinishWith(const absl::Status& status) {
    deps_.observer->OnRequestDone("ReportStepTimes", status.code(),
                                  absl::ToDoubleSeconds(deps_.clock->Now() - received_));
    Finish(proto::ToGrpcStatus(status));
  }

  const ServiceDeps& deps_;
  grpc::ByteBuffer* const response_;
  const absl::Time received_;
};

}  // namespace

grpc::ServerUnaryReactor* PlannerService::ListStrategies(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return AnswerSmallCall<v1::ListStrategiesRequest, v1::ListStrategiesResponse>(
      deps_, "ListStrategies", context, request, response, [](v1::ListStrategiesResponse& r) {
        for (core::Strategy s : core::AllStrategies()) {
          v1::StrategyInfo* info = r.add_strategies();
          info->set_name(std::string(core::StrategyName(s)));
          info->set_description(std::string(core::StrategyDescription(s)));
          info->set_is_default(s == proto::kDefaultStrategy);
        }
      });
}

grpc::ServerUnaryReactor* PlannerService::GetServerInfo(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return AnswerSmallCall<v1::GetServerInfoRequest, v1::ServerInfo>(
      deps_, "GetServerInfo", context, request, response, [this](v1::ServerInfo& r) {
        r.set_version(deps_.config.version);
        r.set_api_version(kApiVersion);
        r.set_planner_threads(deps_.pool->options().threads);
        r.set_queue_capacity(deps_.pool->options().queue_capacity);
        r.set_max_docs_per_batch(deps_.config.limits.max_docs);
        r.set_max_tokens_per_batch(deps_.config.limits.max_tokens);
        r.set_max_cp_size(deps_.config.limits.max_cp_size);
      });
}

grpc::ServerUnaryReactor* PlannerService::ReportStepTimes(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return new ReportReactor(deps_, context, request, response);
}

}  // namespace flashcp::planner_service
