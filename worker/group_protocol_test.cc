#include "worker/group_protocol.h"

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/testing/gloo_ranks.h"

namespace flashcp::worker {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;

StepHeader AStep() {
  StepHeader h;
  h.kind = RoundKind::kStep;
  h.strategy = core::Strategy::kMagi;
  h.scheme = core::CommScheme::kTargeted;
  h.batch = 12;
  h.steps_total = 40;
  h.payload_bytes = 4096;
  return h;
}

// The header's bytes with the 32-bit word at `offset` (bytes) replaced.
std::array<std::byte, kStepHeaderBytes> WithWord(const StepHeader& h, size_t offset,
                                                 uint32_t value) {
  std::array<std::byte, kStepHeaderBytes> w = EncodeStepHeader(h);
  std::memcpy(w.data() + offset, &value, sizeof(value));
  return w;
}

std::array<std::byte, kStepHeaderBytes> WithInt64(const StepHeader& h, size_t offset,
                                                  int64_t value) {
  std::array<std::byte, kStepHeaderBytes> w = EncodeStepHeader(h);
  std::memcpy(w.data() + offset, &value, sizeof(value));
  return w;
}

TEST(StepHeaderTest, RoundTripsEveryKind) {
  const absl::StatusOr<StepHeader> step = DecodeStepHeader(EncodeStepHeader(AStep()));
  ASSERT_THAT(step.status(), IsOk());
  EXPECT_EQ(step->kind, RoundKind::kStep);
  EXPECT_EQ(step->strategy, core::Strategy::kMagi);
  EXPECT_EQ(step->scheme, core::CommScheme::kTargeted);
  EXPECT_EQ(step->batch, 12);
  EXPECT_EQ(step->steps_total, 40);
  EXPECT_EQ(step->payload_bytes, 4096);
  for (const RoundKind kind : {RoundKind::kIdle, RoundKind::kWaiting, RoundKind::kExit}) {
    StepHeader h = AStep();
    h.kind = kind;  // the step fields are not sent
    const absl::StatusOr<StepHeader> d = DecodeStepHeader(EncodeStepHeader(h));
    ASSERT_THAT(d.status(), IsOk());
    EXPECT_EQ(d->kind, kind);
    EXPECT_EQ(d->batch, 0);
    EXPECT_EQ(d->payload_bytes, 0);
  }
}

TEST(StepHeaderTest, AHeaderOfTheWrongSizeIsInvalidArgument) {
  const std::array<std::byte, kStepHeaderBytes> good = EncodeStepHeader(AStep());
  EXPECT_THAT(DecodeStepHeader(absl::MakeConstSpan(good).subspan(0, kStepHeaderBytes - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, "step header: 39 bytes, want 40"));
  const std::vector<std::byte> longer(kStepHeaderBytes + 1);
  EXPECT_THAT(DecodeStepHeader(longer),
              StatusIs(absl::StatusCode::kInvalidArgument, "step header: 41 bytes, want 40"));
}

TEST(StepHeaderTest, EveryBadFieldIsDataLossNamingIt) {
  StepHeader idle;
  idle.kind = RoundKind::kIdle;
  const uint32_t strategies = static_cast<uint32_t>(core::StrategyIdBound());
  // Layout: kind, strategy, scheme, reserved (u32 at 0, 4, 8, 12), then
  // batch, steps_total, payload_bytes (i64 at 16, 24, 32).
  struct Case {
    std::array<std::byte, kStepHeaderBytes> bytes;
    std::string message;
  };
  const std::vector<Case> cases = {
      {WithWord(AStep(), 0, 0), "step header: unknown kind 0"},
      {WithWord(AStep(), 0, 5), "step header: unknown kind 5"},
      {WithWord(AStep(), 4, strategies),
       absl::StrCat("step header: unknown strategy ", strategies)},
      {WithWord(AStep(), 8, static_cast<uint32_t>(core::kNumCommSchemes)),
       absl::StrCat("step header: unknown scheme ", core::kNumCommSchemes)},
      {WithWord(AStep(), 8, 0xffffffffu), "step header: unknown scheme 4294967295"},
      {WithWord(AStep(), 12, 1), "step header: batch 12, steps 40, reserved 1"},
      {WithInt64(AStep(), 16, -1), "step header: batch -1, steps 40, reserved 0"},
      {WithInt64(AStep(), 24, 0), "step header: batch 12, steps 0, reserved 0"},
      {WithInt64(AStep(), 32, -1), "step header: payload of -1 bytes, want [0, 1073741824]"},
      {WithInt64(AStep(), 32, kMaxPlanPayloadBytes + 1),
       "step header: payload of 1073741825 bytes, want [0, 1073741824]"},
      // A heartbeat carries no step fields.
      {WithWord(idle, 8, 1), "step header: kind 2 carries step fields"},
      {WithInt64(idle, 32, 8), "step header: kind 2 carries step fields"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(DecodeStepHeader(c.bytes), StatusIs(absl::StatusCode::kDataLoss, c.message));
  }
  EXPECT_THAT(DecodeStepHeader(WithInt64(AStep(), 32, kMaxPlanPayloadBytes)).status(), IsOk());
}

TEST(SummarizeReportsTest, ImbalanceAndTheFitsTime) {
  // Wall 1, 2, 3 s (mean 2): measured 1.5; CPU 0.5, 1, 1.5: CPU imbalance 1.5.
  const std::vector<RankReport> all = {{1.0, 0.5, false}, {2.0, 1.0, true}, {3.0, 1.5, false}};
  const GroupTimes t = SummarizeReports(all);
  EXPECT_EQ(t.measured_imbalance, 1.5);
  EXPECT_EQ(t.mean_attention_seconds, 2.0);
  EXPECT_EQ(t.cpu_imbalance, 1.5);
  EXPECT_TRUE(t.use_cpu_seconds);
  EXPECT_EQ(t.min_fit_seconds, 0.5);
  EXPECT_TRUE(t.stop);
  // One rank without CPU time: the fit takes wall time, no CPU imbalance.
  const GroupTimes wall =
      SummarizeReports(std::vector<RankReport>{{1.0, 0.5, false}, {4.0, 0.0, false}});
  EXPECT_FALSE(wall.use_cpu_seconds);
  EXPECT_EQ(wall.cpu_imbalance, 0.0);
  EXPECT_EQ(wall.min_fit_seconds, 1.0);
  EXPECT_EQ(wall.measured_imbalance, 1.6);
  EXPECT_FALSE(wall.stop);
  // Heartbeat reports: no time anywhere.
  const GroupTimes idle = SummarizeReports(std::vector<RankReport>{{0, 0, false}, {0, 0, false}});
  EXPECT_EQ(idle.measured_imbalance, 1.0);
  EXPECT_EQ(idle.min_fit_seconds, 0.0);
  EXPECT_EQ(SummarizeReports(std::vector<RankReport>{}).min_fit_seconds, 0.0);
}

// Over a real three-rank Gloo group: the driver's step header and plan reach
// every rank, and every rank's report reaches every rank.
TEST(GroupProtocolTest, RoundAndReportsReachEveryRank) {
  testing::RunRanks(3, absl::Seconds(30), [](int32_t rank, Communicator& comm) {
    StepHeader h;
    std::string payload;
    if (rank == 0) {
      h = AStep();
      h.payload_bytes = 0;  // BroadcastRound sets it from the payload
      payload = "a plan";
    }
    ASSERT_THAT(BroadcastRound(comm, h, payload), IsOk());
    EXPECT_EQ(h.kind, RoundKind::kStep);
    EXPECT_EQ(h.strategy, core::Strategy::kMagi);
    EXPECT_EQ(h.scheme, core::CommScheme::kTargeted);
    EXPECT_EQ(h.batch, 12);
    EXPECT_EQ(h.payload_bytes, 6);
    EXPECT_EQ(payload, "a plan");
    StepHeader exit;
    if (rank == 0) exit.kind = RoundKind::kExit;
    std::string none;
    ASSERT_THAT(BroadcastRound(comm, exit, none), IsOk());
    EXPECT_EQ(exit.kind, RoundKind::kExit);
    EXPECT_EQ(none, "");
    const absl::StatusOr<std::vector<RankReport>> all =
        GatherReports(comm, {0.5 * (rank + 1), 0.25 * rank, rank == 2});
    ASSERT_THAT(all.status(), IsOk());
    ASSERT_EQ(all->size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ((*all)[r].attention_seconds, 0.5 * (r + 1));
      EXPECT_EQ((*all)[r].attention_cpu_seconds, 0.25 * r);
      EXPECT_EQ((*all)[r].stop, r == 2);
    }
  });
}

// A driver whose header does not decode fails every rank with DataLoss.
TEST(GroupProtocolTest, ACorruptDriverHeaderFailsEveryRank) {
  testing::RunRanks(2, absl::Seconds(30), [](int32_t rank, Communicator& comm) {
    StepHeader h;
    std::string payload;
    if (rank == 0) h.kind = static_cast<RoundKind>(9);
    EXPECT_THAT(BroadcastRound(comm, h, payload),
                StatusIs(absl::StatusCode::kDataLoss,
                         "from the driver: step header: unknown kind 9"));
  });
}

// Issue 31 item 8: ranks with different shapes fail with a Status naming
// the field, before any step (not SIGABRT from Gloo's thread).
TEST(GroupProtocolTest, RanksWithDifferentShapesFailBeforeAnyStep) {
  testing::RunRanks(3, absl::Seconds(30), [](int32_t rank, Communicator& comm) {
    GroupShape shape{4096, 2, 32, 4};
    EXPECT_THAT(AgreeOnShape(comm, shape), IsOk());
    if (rank == 2) shape.heads = 4;
    EXPECT_EQ(AgreeOnShape(comm, shape),
              absl::FailedPreconditionError(
                  "group shape: rank 2 has --heads 4, rank 0 has 2; every rank of a group must "
                  "run the same context and model shape"));
  });
}

}  // namespace
}  // namespace flashcp::worker
