#include "client/pipelined_planner.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/testing/mock_planner_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::client {
namespace {

using ::flashcp::client::testing::MockPlannerClient;
using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// A scripted PlanStream. It holds requests until `hold` are pending (or the
// client half-closes) and then answers them newest first, so replies arrive
// out of order. A request with cp_size 0 gets a per-item INVALID_ARGUMENT.
// After `break_after` responses it breaks with UNAVAILABLE; `rogue_id`, when
// set, is the batch_id of its first response.
class FakePlanStream : public PlanStream {
 public:
  struct Script {
    int hold = 1;
    int break_after = -1;
    std::optional<uint64_t> rogue_id = std::nullopt;
    // Runs after each accepted Write with the number of writes so far.
    std::function<void(int64_t writes)> on_write = nullptr;
  };
  // `max_outstanding` (written requests not yet read back, at most) is
  // reported through a pointer because the helper destroys the stream.
  FakePlanStream(Script script, int64_t* max_outstanding)
      : script_(script), max_outstanding_(max_outstanding) {}

  bool Write(const v1::PlanRequest& request) override {
    absl::MutexLock lock(&mu_);
    if (broken_ || cancelled_) return false;
    ++writes_;
    *max_outstanding_ = std::max(*max_outstanding_, writes_ - reads_);
    pending_.push_back(request);
    if (static_cast<int>(pending_.size()) >= script_.hold) Release();
    if (script_.on_write) script_.on_write(writes_);
    return true;
  }
  bool WritesDone() override {
    absl::MutexLock lock(&mu_);
    writes_done_ = true;
    Release();
    return true;
  }
  bool Read(v1::PlanResponse* response) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &FakePlanStream::Readable));
    if (cancelled_ || broken_ || replies_.empty()) return false;
    *response = replies_.front();
    replies_.pop_front();
    ++reads_;
    if (reads_ == script_.break_after) broken_ = true;
    return true;
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  absl::Status Finish() override {
    absl::MutexLock lock(&mu_);
    if (broken_) return absl::UnavailableError("connection reset");
    if (cancelled_) return absl::CancelledError("cancelled by the client");
    return absl::OkStatus();
  }

 private:
  bool Readable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || broken_ || !replies_.empty() || (writes_done_ && pending_.empty());
  }
  void Release() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!pending_.empty()) {
      const v1::PlanRequest& request = pending_.back();
      v1::PlanResponse response;
      response.set_batch_id(request.batch_id());
      if (script_.rogue_id.has_value()) {
        response.set_batch_id(*script_.rogue_id);
        script_.rogue_id.reset();
      }
      if (request.cp_size() == 0) {
        response.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
        response.mutable_error()->set_message("cp_size must be >= 1, got 0");
      } else {
        response.set_cp_size(request.cp_size());
        response.mutable_doc_lens()->CopyFrom(request.doc_lens());
      }
      replies_.push_back(std::move(response));
      pending_.pop_back();
    }
  }

  absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::PlanRequest> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::PlanResponse> replies_ ABSL_GUARDED_BY(mu_);
  int64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t* max_outstanding_ ABSL_PT_GUARDED_BY(mu_);
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// Request i has one document of i + 1 tokens (its identity in the response);
// those listed in `bad` have cp_size 0.
struct Source {
  int64_t count;
  std::vector<int64_t> bad = {};
  int64_t next = 0;
  std::optional<v1::PlanRequest> operator()() {
    if (next == count) return std::nullopt;
    v1::PlanRequest r;
    r.set_batch_id(1000 + next);  // replaced by the helper
    r.add_doc_lens(next + 1);
    r.set_cp_size(std::count(bad.begin(), bad.end(), next) ? 0 : 1);
    ++next;
    return r;
  }
};

// Sources and sinks are passed as std::ref: absl::FunctionRef calls a const
// callable, and these keep state.
struct Collected {
  std::vector<int64_t> indices;
  std::vector<int64_t> first_doc;  // doc_lens[0] of a plan, -1 for an error
  std::vector<absl::Status> errors;
  void operator()(int64_t index, PlanResult result) {
    indices.push_back(index);
    if (result.ok()) {
      first_doc.push_back(result->doc_lens(0));
    } else {
      first_doc.push_back(-1);
      errors.push_back(result.status());
    }
  }
};

std::vector<int64_t> Iota(int64_t n, int64_t from = 0) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

struct Harness {
  MockPlannerClient client;
  int64_t max_outstanding = 0;
  explicit Harness(FakePlanStream::Script script) {
    EXPECT_CALL(client, OpenPlanStream(_)).WillOnce([this, script](const CallOptions&) {
      return std::make_unique<FakePlanStream>(script, &max_outstanding);
    });
  }
};

TEST(PlanPipelinedTest, ReordersRepliesIntoInputOrder) {
  for (int k : {1, 2, 3, 8}) {
    SCOPED_TRACE(k);
    Harness h({.hold = k});
    Source source{.count = 10};
    Collected got;
    const absl::Status status = PlanPipelined(h.client, {.inflight = k}, std::ref(source),
                                              std::ref(got));
    ASSERT_THAT(status, IsOk());
    EXPECT_THAT(got.indices, ElementsAreArray(Iota(10)));
    EXPECT_THAT(got.first_doc, ElementsAreArray(Iota(10, 1)));
    EXPECT_EQ(h.max_outstanding, k);
  }
}

TEST(PlanPipelinedTest, PerItemErrorsKeepTheirPlaceCodeAndMessage) {
  Harness h({.hold = 4});
  Source source{.count = 6, .bad = {1, 4}};
  Collected got;
  ASSERT_THAT(PlanPipelined(h.client, {.inflight = 4}, std::ref(source), std::ref(got)), IsOk());
  EXPECT_THAT(got.indices, ElementsAreArray(Iota(6)));
  EXPECT_THAT(got.first_doc, ElementsAre(1, -1, 3, 4, -1, 6));
  EXPECT_THAT(got.errors,
              ElementsAre(absl::InvalidArgumentError("cp_size must be >= 1, got 0"),
                          absl::InvalidArgumentError("cp_size must be >= 1, got 0")));
}

TEST(PlanPipelinedTest, EmptySourceIsOk) {
  Harness h({.hold = 2});
  Source source{.count = 0};
  Collected got;
  ASSERT_THAT(PlanPipelined(h.client, {.inflight = 2}, std::ref(source), std::ref(got)), IsOk());
  EXPECT_TRUE(got.indices.empty());
}

TEST(PlanPipelinedTest, BrokenStreamReportsItsCodeAndHowFarItGot) {
  // One at a time: the stream breaks as it delivers the 3rd response, so the
  // 4th request's Write fails and 3 of the 3 requests sent were answered.
  Harness h({.hold = 1, .break_after = 3});
  Source source{.count = 10};
  Collected got;
  const absl::Status status =
      PlanPipelined(h.client, {.inflight = 1}, std::ref(source), std::ref(got));
  EXPECT_EQ(status, absl::UnavailableError(
                        "PlanStream ended after 3 of 3 results: connection reset"));
  EXPECT_THAT(got.indices, ElementsAre(0, 1, 2));
}

TEST(PlanPipelinedTest, UnknownBatchIdIsInternal) {
  Harness h({.hold = 1, .rogue_id = 99});
  Source source{.count = 3};
  Collected got;
  EXPECT_EQ(PlanPipelined(h.client, {.inflight = 2}, std::ref(source), std::ref(got)),
            absl::InternalError("server answered batch_id 99, which is not in flight"));
  EXPECT_TRUE(got.indices.empty());
}

TEST(PlanPipelinedTest, CancellerEndsACallWaitingOnAPlannerThatNeverAnswers) {
  // hold > count: the fake answers nothing, so without the cancel the call
  // would wait forever for result 0.
  absl::Notification window_full;
  Harness h({.hold = 100, .on_write = [&](int64_t writes) {
               if (writes == 2) window_full.Notify();
             }});
  PipelineCanceller canceller;
  std::thread watchdog([&] {
    window_full.WaitForNotification();
    canceller.Cancel();
  });
  Source source{.count = 10};
  Collected got;
  const absl::Status status = PlanPipelined(
      h.client, {.inflight = 2, .canceller = &canceller}, std::ref(source), std::ref(got));
  watchdog.join();
  EXPECT_EQ(status, absl::CancelledError("PlanStream ended after 0 of 2 results: cancelled"));
  EXPECT_TRUE(got.indices.empty());
  EXPECT_TRUE(canceller.cancelled());
}

TEST(PlanPipelinedTest, CancelledBeforeTheCallOpensNoStream) {
  MockPlannerClient client;
  EXPECT_CALL(client, OpenPlanStream(_)).Times(0);
  PipelineCanceller canceller;
  canceller.Cancel();
  Source source{.count = 1};
  Collected got;
  EXPECT_EQ(PlanPipelined(client, {.inflight = 1, .canceller = &canceller}, std::ref(source),
                          std::ref(got)),
            absl::CancelledError("PlanStream cancelled before it opened"));
  EXPECT_EQ(source.next, 0);
}

TEST(PlanPipelinedTest, InflightMustBePositive) {
  MockPlannerClient client;
  EXPECT_CALL(client, OpenPlanStream(_)).Times(0);
  Source source{.count = 1};
  Collected got;
  EXPECT_THAT(PlanPipelined(client, {.inflight = 0}, std::ref(source), std::ref(got)),
              StatusIs(absl::StatusCode::kInvalidArgument, "inflight must be >= 1, got 0"));
}

}  // namespace
}  // namespace flashcp::client
