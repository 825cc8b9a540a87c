#include "planner_service/service.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/strategies.h"
#include "planner_service/plan_batch.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"

namespace flashcp::planner_service {
namespace {

constexpr char kApiVersion[] = "flashcp.v1";

// A client whose deadline passes cancels the call itself, and that reaches us
// before our copy of the deadline (arrival time + the grpc-timeout header)
// passes: by the request's transit time, measured 8 ms for a 1 s deadline on
// a loaded 2-core machine. A cancellation this close to the deadline is
// counted as the deadline's: within 50 ms, and within a tenth of the call's
// budget, so that an explicit cancel of a short call still counts as one.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(50);

// Why a call that nobody waits for any more ended: its deadline passed, or the
// client cancelled it. `received`: when the call arrived.
absl::Status DroppedStatus(const grpc::CallbackServerContext& context, const Clock& clock,
                           absl::Time received) {
  const absl::Time deadline = absl::FromChrono(context.deadline());
  const absl::Duration slack = std::min(kDeadlineSlack, (deadline - received) / 10);
  if (deadline <= clock.Now() + slack) {
    return absl::DeadlineExceededError("planner: the deadline passed before the plan was made");
  }
  return absl::CancelledError("planner: the call was cancelled before the plan was made");
}

// One unary Plan call. Lives from Plan() until OnDone(); Finish() is called
// exactly once: on a validation or admission error (gRPC thread), from the
// planning job (pool thread), or from OnCancel when the job was still queued.
class PlanReactor final : public grpc::ServerUnaryReactor {
 public:
  PlanReactor(const ServiceDeps& deps, grpc::CallbackServerContext* context,
              const v1::PlanRequest* request, v1::PlanResponse* response)
      : deps_(deps), context_(context), response_(response), received_(deps.clock->Now()) {
    deps_.observer->OnInflightChange(+1);
    absl::StatusOr<proto::PlanInput> input =
        proto::RequestFromProto(*request, deps_.config.limits);
    if (!input.ok()) {
      FinishWith(input.status());
      return;
    }
    absl::Status admitted;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<PlanningPool::Ticket> ticket = deps_.pool->Submit(
          [this, in = *std::move(input)] { RunJob(in); }, PlanningPool::Admission::kBounded);
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
      dropped = ticket_.has_value() && deps_.pool->Cancel(*ticket_);
    }
    // Removed from the queue: the job will never run, so it is ours to finish.
    if (dropped) FinishWith(DroppedStatus(*context_, *deps_.clock, received_));
  }

  void OnDone() override { delete this; }

 private:
  // On a pool thread.
  void RunJob(const proto::PlanInput& input) {
    if (context_->IsCancelled()) {
      FinishWith(DroppedStatus(*context_, *deps_.clock, received_));
      return;
    }
    absl::StatusOr<v1::PlanResponse> response = PlanBatch(input, *deps_.clock, *deps_.observer);
    if (response.ok()) *response_ = *std::move(response);
    FinishWith(response.status());
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
  v1::PlanResponse* const response_;
  const absl::Time received_;
  absl::Mutex mu_;  // orders the ticket's publication against OnCancel
  std::optional<PlanningPool::Ticket> ticket_ ABSL_GUARDED_BY(mu_);
};

// One PlanStream call. Items are read, validated and queued on the pool; their
// responses are written in completion order, one write at a time. Flow
// control: at most `stream_window` items are in flight (read, not yet written);
// at the window the stream stops reading and resumes as writes complete.
// Every item is answered exactly once: a response (plan or per-item error), or,
// once the call is cancelled, dropped. Finish() is called once, when the client
// is done sending (or the call is cancelled) and no item is in flight.
//
// State changes happen under mu_; the gRPC operations they decide on (read,
// write, finish) are started after unlocking, so that no reaction can run
// while we hold the lock.
class PlanStreamReactor final : public grpc::ServerBidiReactor<v1::PlanRequest, v1::PlanResponse> {
 public:
  explicit PlanStreamReactor(const ServiceDeps& deps) : deps_(deps) {
    {
      absl::MutexLock lock(&mu_);
      reading_ = true;
    }
    StartRead(&read_buf_);
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
    const uint64_t batch_id = read_buf_.batch_id();
    absl::StatusOr<proto::PlanInput> input =
        proto::RequestFromProto(read_buf_, deps_.config.limits);
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!finished_ && !cancelled_) {
        deps_.observer->OnInflightChange(+1);
        ++in_flight_;
        if (!input.ok()) {
          ready_.push_back(
              Ready{proto::ErrorResponseToProto(batch_id, input.status()), input.status().code(),
                    received});
        } else {
          const uint64_t seq = next_seq_++;
          absl::StatusOr<PlanningPool::Ticket> ticket = deps_.pool->Submit(
              [this, seq, received, in = *std::move(input)] { RunJob(seq, received, in); },
              PlanningPool::Admission::kAlways);
          if (ticket.ok()) {
            queued_.emplace(seq, Queued{*ticket, received});
          } else {
            ready_.push_back(Ready{proto::ErrorResponseToProto(batch_id, ticket.status()),
                                   ticket.status().code(), received});
          }
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
  struct Ready {
    v1::PlanResponse response;
    absl::StatusCode code;  // the item's outcome, for metrics
    absl::Time received;
  };
  struct Queued {
    PlanningPool::Ticket ticket;
    absl::Time received;
  };
  struct Actions {
    bool read = false;
    bool write = false;
    bool finish = false;
    bool finish_cancelled = false;  // finish with CANCELLED (ignored by gRPC then) not OK
  };

  // On a pool thread.
  void RunJob(uint64_t seq, absl::Time received, const proto::PlanInput& input) {
    bool dropped = false;
    Actions actions;
    {
      absl::MutexLock lock(&mu_);
      queued_.erase(seq);
      if (cancelled_) {  // Cancel raced with this job's start: nobody waits for it
        AnswerLocked(absl::StatusCode::kCancelled, received);
        actions = NextActionsLocked();
        dropped = true;
      }
    }
    if (dropped) {
      Do(actions);
      return;
    }
    absl::StatusOr<v1::PlanResponse> planned = PlanBatch(input, *deps_.clock, *deps_.observer);
    Ready ready{planned.ok() ? *std::move(planned)
                             : proto::ErrorResponseToProto(input.batch_id, planned.status()),
                planned.status().code(), received};
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        AnswerLocked(absl::StatusCode::kCancelled, received);
      } else {
        ready_.push_back(std::move(ready));
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

  // Drops every item nobody will read: ready responses and queued jobs.
  // Running jobs are dropped when they return (RunJob).
  void CancelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_) return;
    cancelled_ = true;
    for (const Ready& r : ready_) AnswerLocked(absl::StatusCode::kCancelled, r.received);
    ready_.clear();
    for (const auto& [seq, queued] : queued_) {
      if (deps_.pool->Cancel(queued.ticket)) {
        AnswerLocked(absl::StatusCode::kCancelled, queued.received);
      }
    }
    queued_.clear();
  }

  Actions NextActionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Actions a;
    if (finished_) return a;
    if (!cancelled_ && !writing_ && !ready_.empty()) {
      write_buf_ = std::move(ready_.front().response);
      writing_code_ = ready_.front().code;
      writing_received_ = ready_.front().received;
      ready_.pop_front();
      writing_ = true;
      a.write = true;
    }
    if (!cancelled_ && !reading_ && !reads_done_ && in_flight_ < deps_.config.stream_window) {
      reading_ = true;
      a.read = true;
    }
    if ((reads_done_ || cancelled_) && in_flight_ == 0 && !writing_) {
      finished_ = true;
      a.finish = true;
      a.finish_cancelled = cancelled_;
    }
    return a;
  }

  // Starts what NextActionsLocked decided, without the lock. After Finish the
  // reactor may be deleted at any moment: nothing may follow it.
  void Do(const Actions& a) {
    if (a.write) StartWrite(&write_buf_);
    if (a.read) StartRead(&read_buf_);
    if (a.finish) Finish(a.finish_cancelled ? grpc::Status::CANCELLED : grpc::Status::OK);
  }

  const ServiceDeps& deps_;
  v1::PlanRequest read_buf_;    // owned by the outstanding read (reading_)
  v1::PlanResponse write_buf_;  // owned by the outstanding write (writing_)

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // items read and not yet answered
  std::deque<Ready> ready_ ABSL_GUARDED_BY(mu_);
  absl::StatusCode writing_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  absl::Time writing_received_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Queued> queued_ ABSL_GUARDED_BY(mu_);  // jobs in the pool, by item seq
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

absl::string_view StrategyDescription(core::Strategy s) {
  switch (s) {
    case core::Strategy::kLlama3:
      return "Llama3 CP: the packed sequence in 2N chunks, chunks k and 2N-1-k to rank k";
    case core::Strategy::kPerDoc:
      return "Per-Doc CP (WLB-LLM): every document in 2N chunks, zigzag";
    case core::Strategy::kRing:
      return "Ring-Attn: the packed sequence in N contiguous chunks";
    case core::Strategy::kZigzag:
      return "Ring-Attn zigzag: every document in 2N chunks, zigzag";
    case core::Strategy::kWholeDoc:
      return "Whole-Doc: documents kept whole, placed by workload, cut only to equalize tokens";
    case core::Strategy::kFlashCpPaper:
      return "FlashCP as the paper's Algorithm 1 states it, to target_imbalance";
    case core::Strategy::kFlashCp:
      return "FlashCP: Whole-Doc plus Per-Doc for the documents that stop balance, to "
             "target_imbalance";
    case core::Strategy::kIlp:
      return "Exact MILP at a fixed granularity (CBC); small batches only";
    case core::Strategy::kMagi:
      return "MagiAttention's default dispatch: the packed sequence in chunks of ceil(C / 8N), "
             "dealt by a min-heap on causal area, equal chunks per rank";
  }
  return "";
}

}  // namespace

grpc::ServerUnaryReactor* PlannerService::Plan(grpc::CallbackServerContext* context,
                                               const v1::PlanRequest* request,
                                               v1::PlanResponse* response) {
  return new PlanReactor(deps_, context, request, response);
}

grpc::ServerBidiReactor<v1::PlanRequest, v1::PlanResponse>* PlannerService::PlanStream(
    grpc::CallbackServerContext* /*context*/) {
  return new PlanStreamReactor(deps_);
}

grpc::ServerUnaryReactor* PlannerService::ListStrategies(grpc::CallbackServerContext* context,
                                                         const v1::ListStrategiesRequest*,
                                                         v1::ListStrategiesResponse* response) {
  const absl::Time received = deps_.clock->Now();
  for (core::Strategy s : core::kAllStrategies) {
    v1::StrategyInfo* info = response->add_strategies();
    info->set_name(std::string(core::StrategyName(s)));
    info->set_description(std::string(StrategyDescription(s)));
    info->set_is_default(s == proto::kDefaultStrategy);
  }
  deps_.observer->OnRequestDone("ListStrategies", absl::StatusCode::kOk,
                                absl::ToDoubleSeconds(deps_.clock->Now() - received));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PlannerService::GetServerInfo(grpc::CallbackServerContext* context,
                                                        const v1::GetServerInfoRequest*,
                                                        v1::ServerInfo* response) {
  const absl::Time received = deps_.clock->Now();
  response->set_version(deps_.config.version);
  response->set_api_version(kApiVersion);
  response->set_planner_threads(deps_.pool->options().threads);
  response->set_queue_capacity(deps_.pool->options().queue_capacity);
  response->set_max_docs_per_batch(deps_.config.limits.max_docs);
  response->set_max_tokens_per_batch(deps_.config.limits.max_tokens);
  response->set_max_cp_size(deps_.config.limits.max_cp_size);
  deps_.observer->OnRequestDone("GetServerInfo", absl::StatusCode::kOk,
                                absl::ToDoubleSeconds(deps_.clock->Now() - received));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace flashcp::planner_service
