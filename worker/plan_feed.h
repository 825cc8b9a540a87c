// The driver's plans, batch after batch, from the planner's PlanStream.
#ifndef FLASHCP_WORKER_PLAN_FEED_H_
#define FLASHCP_WORKER_PLAN_FEED_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/pipelined_planner.h"
#include "client/planner_client.h"
#include "core/clock.h"
#include "core/datasets.h"
#include "core/types.h"
#include "flashcp/v1/planner.pb.h"

namespace flashcp::worker {

// The driver's supply of plans: one thread runs PlanStream (client/
// PlanPipelined) with `prefetch` batches in flight and, when the stream
// breaks with UNAVAILABLE, CANCELLED or ABORTED (a planner restart or
// drain), reopens it from the first batch not yet delivered with backoff. A watchdog thread gives up when no plan has
// arrived for `timeout` while the feed had room for one (a planner that is
// down, or one that hangs without dropping the connection): it cancels the
// stream and the feed delivers UNAVAILABLE. A per-item error is delivered as
// that item's result. The destructor cancels the stream too, so it never
// waits on the planner.
class PlanFeed {
 public:
  struct Config {
    core::Dataset dataset = core::Dataset::kPile;
    int64_t context = 0;
    int32_t cp_size = 1;
    std::string strategy;
    core::AttentionMask attention_mask;  // PlanRequest.attention_mask, block_size
    double target_imbalance = 0.0;
    int32_t heads = 1, head_dim = 1;
    int32_t dtype_bytes = 4;  // the backend's element size, for the plans' byte counts
    uint64_t seed = 1;
    int64_t first_batch = 0;  // batch index of the first step
    int64_t count = 0;        // batches to plan
    int32_t prefetch = 4;
    absl::Duration timeout = absl::Seconds(30);
    std::string cost_profile;  // PlanRequest.cost_profile; "" sends none
    // PlanRequest.rank_speed of each request, called (on the feed's thread)
    // as the request is made; null or empty: none.
    std::function<std::vector<double>()> rank_speed;
    std::string cluster;  // PlanRequest.cluster (a preset); "" sends none
  };
  // `clock` (the watchdog's, Next's and the backoff's time) must outlive the feed.
  PlanFeed(std::shared_ptr<client::PlannerClient> planner, Config config,
           const core::WaitClock* clock);
  ~PlanFeed();  // cancels the stream and stops the threads

  // The next plan in order, waiting up to `wait` (of the clock's time);
  // nullopt if none yet.
  absl::StatusOr<std::optional<v1::PlanResponse>> Next(absl::Duration wait);

 private:
  void Loop();
  void Watch();
  bool Full() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int32_t>(ready_.size()) >= config_.prefetch;
  }
  std::shared_ptr<client::PlannerClient> planner_;
  const Config config_;
  const core::WaitClock& clock_;
  client::PipelineCanceller canceller_;
  absl::Mutex mu_;
  std::deque<absl::StatusOr<v1::PlanResponse>> ready_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool loop_done_ ABSL_GUARDED_BY(mu_) = false;  // Loop returned
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;  // the watchdog cancelled the stream
  // Since when the feed has been waiting for the planner: the last plan's
  // arrival, or the moment ready_ stopped being full. The watchdog's clock;
  // it does not run while ready_ is full (the driver is behind, not the planner).
  absl::Time waiting_since_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  std::thread watchdog_;
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_PLAN_FEED_H_
