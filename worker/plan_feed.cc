#include "worker/plan_feed.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/backoff.h"
#include "core/log.h"
#include "core/strategies.h"
#include "proto/convert.h"

namespace flashcp::worker {

PlanFeed::PlanFeed(std::shared_ptr<client::PlannerClient> planner, Config config,
                   const core::WaitClock* clock)
    : planner_(std::move(planner)), config_(std::move(config)), clock_(*clock) {
  {
    absl::MutexLock lock(&mu_);
    waiting_since_ = clock_.Now();
  }
  thread_ = std::thread([this] { Loop(); });
  watchdog_ = std::thread([this] { Watch(); });
}

PlanFeed::~PlanFeed() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // Unblocks a PlanPipelined waiting on a planner that never answers.
  canceller_.Cancel();
  watchdog_.join();
  thread_.join();
}

absl::StatusOr<std::optional<v1::PlanResponse>> PlanFeed::Next(absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  clock_.AwaitWithTimeout(mu_,
                          absl::Condition(
                              +[](std::deque<absl::StatusOr<v1::PlanResponse>>* q) {
                                return !q->empty();
                              },
                              &ready_),
                          wait);
  if (ready_.empty()) return std::optional<v1::PlanResponse>();
  // Taking from a full queue restarts the watchdog's clock (see waiting_since_).
  if (Full()) waiting_since_ = clock_.Now();
  absl::StatusOr<v1::PlanResponse> r = std::move(ready_.front());
  ready_.pop_front();
  if (!r.ok()) return r.status();
  return std::optional<v1::PlanResponse>(*std::move(r));
}

void PlanFeed::Watch() {
  bool fire = false;
  {
    absl::MutexLock lock(&mu_);
    while (!stop_ && !loop_done_) {
      if (Full()) {  // the driver is behind: nothing to time
        mu_.Await(absl::Condition(
            +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
              return f->stop_ || f->loop_done_ || !f->Full();
            },
            this));
        continue;
      }
      const absl::Time deadline = waiting_since_ + config_.timeout;
      if (clock_.Now() >= deadline) {
        timed_out_ = true;
        fire = true;
        break;
      }
      // Wakes early on stop; a new plan only moves the deadline, which the
      // next pass sees.
      clock_.AwaitWithDeadline(mu_,
                               absl::Condition(
                                   +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
                                     return f->stop_ || f->loop_done_ || f->Full();
                                   },
                                   this),
                               deadline);
    }
  }
  // Outside mu_: cancelling wakes the Loop thread, whose sink takes mu_.
  if (fire) canceller_.Cancel();
}

namespace {

// A broken stream worth reconnecting: the planner went away or the call ended.
bool IsRetryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled ||
         s.code() == absl::StatusCode::kAborted;
}

client::PipelineOptions StreamOptions(int prefetch, client::PipelineCanceller* canceller) {
  client::PipelineOptions options;
  options.inflight = prefetch;
  // No stream deadline: the watchdog (`timeout` without a plan) and the
  // destructor end a stream through canceller_, whatever its length.
  options.call.timeout = absl::InfiniteDuration();
  options.canceller = canceller;
  return options;
}

}  // namespace

void PlanFeed::Loop() {
  int64_t delivered = 0;
  core::Backoff backoff;  // 100 ms doubling to 1 s
  const auto push = [this](absl::StatusOr<v1::PlanResponse> r) {
    absl::MutexLock lock(&mu_);
    ready_.push_back(std::move(r));
  };
  // Wakes the watchdog when this returns, whichever way.
  struct Done {
    PlanFeed* f;
    ~Done() {
      absl::MutexLock lock(&f->mu_);
      f->loop_done_ = true;
    }
  } done{this};
  // Ends the loop: stopped, or the watchdog gave up (then UNAVAILABLE is
  // delivered, with the stream's last status).
  const auto finished = [&](const absl::Status& last) {
    absl::MutexLock lock(&mu_);
    if (stop_) return true;
    if (!timed_out_) return false;
    ready_.push_back(absl::UnavailableError(
        absl::StrCat("plan stream: no plan for ", absl::FormatDuration(config_.timeout),
                     "; last error: ", last.ToString())));
    return true;
  };
  absl::StatusOr<core::Strategy> strategy = core::ParseStrategy(config_.strategy);
  if (!strategy.ok()) {
    push(strategy.status());
    return;
  }
  core::PlanOptions plan_options;
  plan_options.attention_mask = config_.attention_mask;
  if (config_.target_imbalance > 0) plan_options.target_imbalance = config_.target_imbalance;
  const core::ModelShape shape{config_.heads, config_.head_dim, config_.dtype_bytes};
  absl::Status last = absl::OkStatus();
  while (delivered < config_.count && !finished(last)) {
    int64_t next = delivered;
    absl::Status source_error;
    const auto source = [&]() -> std::optional<v1::PlanRequest> {
      if (next >= config_.count || !source_error.ok()) return std::nullopt;
      absl::StatusOr<std::vector<int64_t>> lens = core::SampleBatch(
          config_.dataset, config_.context, config_.seed, config_.first_batch + next);
      if (!lens.ok()) {
        source_error = lens.status();
        return std::nullopt;
      }
      core::Batch batch{*std::move(lens), config_.cp_size};
      ++next;
      if (config_.rank_speed) plan_options.rank_speed = config_.rank_speed();
      v1::PlanRequest request = proto::RequestToProto(0, batch, *strategy, plan_options, shape,
                                                      false, config_.cost_profile);
      if (!config_.cluster.empty()) request.set_cluster(config_.cluster);
      return request;
    };
    const auto sink = [&](int64_t, client::PlanResult r) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
            return f->stop_ || !f->Full();
          },
          this));
      if (stop_) return;
      // PlanPipelined already turned a per-item `error` into r's status.
      ready_.push_back(std::move(r));
      ++delivered;
      waiting_since_ = clock_.Now();
    };
    const absl::Status s =
        client::PlanPipelined(*planner_, StreamOptions(config_.prefetch, &canceller_), source, sink);
    if (!source_error.ok()) {
      push(source_error);
      return;
    }
    if (s.ok()) return;
    last = s;
    if (finished(last)) return;
    if (!IsRetryable(s)) {
      push(absl::Status(s.code(), absl::StrCat("plan stream: ", s.message())));
      return;
    }
    const absl::Duration wait = backoff.Next();
    FLASHCP_LOG(WARNING) << "plan stream broke after " << delivered << " plans (" << s.ToString()
                         << "); reconnecting in " << absl::FormatDuration(wait);
    absl::MutexLock lock(&mu_);
    clock_.AwaitWithTimeout(mu_,
                            absl::Condition(
                                +[](PlanFeed* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
                                  return f->stop_ || f->timed_out_;
                                },
                                this),
                            wait);
  }
}

}  // namespace flashcp::worker
