#include "worker/grpc_store.h"

#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/inprocess_rendezvous.h"

namespace flashcp::worker {
namespace {

using ::flashcp::core::testing::IsOk;

class TraceGroupFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<tests::testing::InProcessRendezvous>> r =
        tests::testing::InProcessRendezvous::Start();
    ASSERT_THAT(r.status(), IsOk());
    rendezvous_ = *std::move(r);
    for (int32_t rank = 0; rank < 3; ++rank) {
      ranks_.push_back(std::make_unique<RendezvousClient>(rendezvous_->stub(), "g", rank, 1));
      ASSERT_THAT(ranks_.back()->Join(3).status(), IsOk());
    }
  }
  RendezvousClient& rank(int32_t r) { return *ranks_[r]; }

  std::unique_ptr<tests::testing::InProcessRendezvous> rendezvous_;
  std::vector<std::unique_ptr<RendezvousClient>> ranks_;
};

// Rank 2 is lost. Rank 0 timed out on rank 1 before rank 1 timed out on rank
// 2 (and so before rank 1 published): rank 0 waits for rank 1's failure and
// names rank 2 through it; the group's abort ends its wait on rank 2.
TEST_F(TraceGroupFailureTest, ATimeoutOnALivePeerWaitsForItsFailureAndFollowsIt) {
  const absl::Status on_1 = absl::DeadlineExceededError("recv of 8 bytes from rank 1: timed out");
  const absl::Status on_2 = absl::DeadlineExceededError("recv of 8 bytes from rank 2: timed out");
  absl::Status traced_0;
  const absl::Time start = absl::Now();
  std::thread rank0([&] { traced_0 = TraceGroupFailure(rank(0), on_1, absl::Seconds(30)); });
  // Rank 2 publishes nothing: rank 1's own failure as it is, after its wait.
  EXPECT_EQ(TraceGroupFailure(rank(1), on_2, absl::Milliseconds(200)), on_2);
  ASSERT_THAT(rank(1).Abort("gave up"), IsOk());
  rank0.join();
  EXPECT_EQ(traced_0,
            absl::DeadlineExceededError("recv of 8 bytes from rank 1: timed out; rank 1 failed: "
                                        "DEADLINE_EXCEEDED: recv of 8 bytes from rank 2: timed out"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // the abort, not the 30 s wait, ended it
  EXPECT_THAT(rank(0).Get({FailureKey(0)}, absl::ZeroDuration()),
              ::flashcp::core::testing::StatusIs(absl::StatusCode::kAborted));
}

// A peer that closed its connection published before closing, or died: its
// failure is only looked up, not waited for.
TEST_F(TraceGroupFailureTest, AClosedPeerIsLookedUpNotWaitedFor) {
  const absl::Status closed = absl::UnavailableError("recv of 8 bytes from rank 1: closed by peer");
  const absl::Time start = absl::Now();
  EXPECT_EQ(TraceGroupFailure(rank(0), closed, absl::Seconds(30)), closed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // Rank 1 traces back to rank 0, seen before: the chain ends there.
  const absl::Status back = absl::UnavailableError("send of 8 bytes to rank 0: closed by peer");
  EXPECT_EQ(TraceGroupFailure(rank(1), back, absl::Seconds(30)),
            absl::UnavailableError("send of 8 bytes to rank 0: closed by peer; rank 0 failed: "
                                   "UNAVAILABLE: recv of 8 bytes from rank 1: closed by peer"));
}

// Nothing to trace: no peer named, or the group already aborted.
TEST_F(TraceGroupFailureTest, NoPeerOrAnAbortedGroupGivesTheFailureAsItIs) {
  const absl::Status internal = absl::InternalError("plan for 4 ranks in a group of 3");
  EXPECT_EQ(TraceGroupFailure(rank(0), internal, absl::Seconds(30)), internal);
  ASSERT_THAT(rank(2).Abort("lost"), IsOk());
  const absl::Status on_2 = absl::DeadlineExceededError("recv of 8 bytes from rank 2: timed out");
  EXPECT_EQ(TraceGroupFailure(rank(1), on_2, absl::Seconds(30)), on_2);
}

}  // namespace
}  // namespace flashcp::worker
