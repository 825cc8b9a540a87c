// Unit tests of the integration-test helpers themselves.
#include <signal.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/metrics_text.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/worker_process.h"

namespace flashcp::tests::testing {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

TEST(ParseListeningLineTest, Accepts) {
  absl::StatusOr<ListeningAddresses> a =
      ParseListeningLine("LISTENING grpc=127.0.0.1:4000 metrics=127.0.0.1:4001");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->grpc, "127.0.0.1:4000");
  EXPECT_EQ(a->metrics, "127.0.0.1:4001");
  a = ParseListeningLine("LISTENING grpc=[::1]:4000 metrics=-");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->grpc, "[::1]:4000");
  EXPECT_EQ(a->metrics, "");
}

TEST(ParseListeningLineTest, Rejects) {
  for (const char* line : {"", "LISTENING", "LISTENING grpc=x:1", "LISTENING metrics=- grpc=x:1",
                           "LISTENING grpc= metrics=-", "LISTENING grpc=a:1 metrics=b"}) {
    EXPECT_THAT(ParseListeningLine(line), StatusIs(absl::StatusCode::kInvalidArgument)) << line;
  }
}

TEST(ParseWorkerLineTest, AcceptsTheWorkerLineOnly) {
  absl::StatusOr<WorkerAddresses> a =
      ParseWorkerLine("WORKER rank=3 control=127.0.0.1:4000 metrics=127.0.0.1:4001");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->rank, 3);
  EXPECT_EQ(a->control, "127.0.0.1:4000");
  EXPECT_EQ(a->metrics, "127.0.0.1:4001");
  for (const char* line : {"", "WORKER", "WORKER rank=x control=a:1 metrics=b:2",
                           "WORKER rank=0 metrics=b:2 control=a:1",
                           "LISTENING grpc=a:1 metrics=b:2"}) {
    EXPECT_THAT(ParseWorkerLine(line), StatusIs(absl::StatusCode::kInvalidArgument,
                                                absl::StrCat("not a WORKER line: \"", line, "\"")))
        << line;
  }
}

constexpr char kExposition[] = R"(# HELP x_total help
# TYPE x_total counter
x_total{code="OK",method="Plan"} 3
x_total{code="INVALID_ARGUMENT",method="Plan"} 1
y_gauge 2.5
z_summary{quantile="0.5"} Nan
w{a="q\"uote"} 7 1700000000
)";

TEST(FindSampleTest, ExactLabelSets) {
  EXPECT_EQ(*FindSample(kExposition, "x_total", {{"method", "Plan"}, {"code", "OK"}}), 3);
  EXPECT_EQ(*FindSample(kExposition, "x_total", {{"code", "INVALID_ARGUMENT"}, {"method", "Plan"}}),
            1);
  EXPECT_EQ(*FindSample(kExposition, "y_gauge"), 2.5);
  EXPECT_EQ(*FindSample(kExposition, "w", {{"a", "q\"uote"}}), 7);
  EXPECT_TRUE(std::isnan(*FindSample(kExposition, "z_summary", {{"quantile", "0.5"}})));
  EXPECT_THAT(FindSample(kExposition, "x_total", {{"method", "Plan"}}),
              StatusIs(absl::StatusCode::kNotFound, "no sample x_total{method=\"Plan\",}"));
  EXPECT_THAT(FindSample("x{a=\"b} 1", "x", {}), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(SubprocessTest, ReadsLinesAndExitCode) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start({"/bin/sh", "-c", "echo one; printf 'two\\nrest'; exit 3"});
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(*(*p)->ReadLine(In(absl::Seconds(30))), "one");
  EXPECT_EQ(*(*p)->ReadLine(In(absl::Seconds(30))), "two");
  EXPECT_THAT((*p)->ReadLine(In(absl::Seconds(30))),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("unterminated rest: \"rest\"")));
  EXPECT_EQ(*(*p)->Wait(In(absl::Seconds(30))), 3);
}

TEST(SubprocessTest, DeadlinesAndSignals) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start({"/bin/sleep", "600"});
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT((*p)->ReadLine(absl::Now()), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT((*p)->Wait(absl::Now()), StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_THAT((*p)->Signal(SIGTERM), IsOk());
  EXPECT_EQ(*(*p)->Wait(In(absl::Seconds(30))), 128 + SIGTERM);
}

TEST(SubprocessTest, MissingBinaryExits127) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start({"/nonexistent/binary"});
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(*(*p)->Wait(In(absl::Seconds(30))), 127);
}

TEST(RunCommandTest, FeedsStdinAndCollectsOutput) {
  const std::string big(1 << 20, 'x');  // larger than a pipe buffer both ways
  absl::StatusOr<CommandResult> r = RunCommand({"/bin/cat"}, big, In(absl::Seconds(60)));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->output, big);
  r = RunCommand({"/bin/sh", "-c", "echo err >&2; exit 2"}, "", In(absl::Seconds(30)));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_EQ(r->output, "err\n");
}

}  // namespace
}  // namespace flashcp::tests::testing
