// flashcp-cpstep with ranks as separate processes (fork/exec, Gloo TCP on
// loopback, FileStore rendezvous in a mkdtemp directory): results and bytes,
// and a rank that is killed or hangs.
#include <stdio.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct CpStepRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  absl::Duration took;
};

CpStepRun CpStep(const std::string& batch, const std::string& flags) {
  const std::string cmd =
      absl::StrCat("echo '", batch, "' | ", FLASHCP_CPSTEP_BIN, " ", flags, " 2>&1");
  CpStepRun run;
  const absl::Time start = absl::Now();
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  const int status = pclose(pipe);
  run.took = absl::Now() - start;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The JSON's bytes arrays must equal the predicted ones character for character.
std::string Field(const std::string& json, const std::string& name) {
  const size_t at = json.find(absl::StrCat("\"", name, "\":"));
  if (at == std::string::npos) return "";
  const size_t begin = json.find(':', at) + 1;
  const size_t end = json[begin] == '[' ? json.find(']', begin) + 1 : json.find_first_of(",}", begin);
  return json.substr(begin, end - begin);
}

struct ProcessCase {
  int cp;
  const char* strategy;
  const char* scheme;
};

class EngineProcessTest : public ::testing::TestWithParam<ProcessCase> {};

TEST_P(EngineProcessTest, ProcessesMatchReferenceAndPredictedBytes) {
  const ProcessCase& c = GetParam();
  const CpStepRun run = CpStep("300,20,5,700,1,1,64,9",
                         absl::StrCat("--cp ", c.cp, " --strategy ", c.strategy, " --scheme ",
                                      c.scheme, " --heads 2 --head_dim 8 --ranks processes "
                                      "--threads_per_rank 1 --seed 5"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("\"ranks\":\"processes\""));
  EXPECT_THAT(run.output, HasSubstr("\"ok\":true"));
  EXPECT_EQ(Field(run.output, "bytes_sent"), Field(run.output, "predicted_bytes_sent"));
  EXPECT_EQ(Field(run.output, "bytes_received"), Field(run.output, "predicted_bytes_received"));
  for (const char* out : {"out", "lse", "dq", "dk", "dv"}) {
    const double err = std::stod(Field(run.output, out));
    EXPECT_LE(err, 1e-5) << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, EngineProcessTest,
                         ::testing::Values(ProcessCase{2, "llama3", "full_kv"},
                                           ProcessCase{3, "zigzag", "targeted"},
                                           ProcessCase{4, "per_doc", "allgather"}));

// Block diffusion (--attention_mask=block_diffusion --block_size=b): the
// step over the batch's 2C rows, ranks as processes, against the mask's
// dense oracle, bytes as predicted.
struct MaskCase {
  int cp;
  const char* strategy;
  const char* scheme;
  int block_size;
};

class EngineProcessMaskTest : public ::testing::TestWithParam<MaskCase> {};

TEST_P(EngineProcessMaskTest, ProcessesMatchTheMaskOracleAndPredictedBytes) {
  const MaskCase& c = GetParam();
  const CpStepRun run = CpStep(
      "90,1,17,3,1,40", absl::StrCat("--cp ", c.cp, " --strategy ", c.strategy, " --scheme ",
                                     c.scheme, " --attention_mask=block_diffusion --block_size=",
                                     c.block_size,
                                     " --heads 2 --head_dim 8 --ranks processes "
                                     "--threads_per_rank 1 --seed 5"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("\"ok\":true"));
  EXPECT_EQ(Field(run.output, "bytes_sent"), Field(run.output, "predicted_bytes_sent"));
  EXPECT_EQ(Field(run.output, "bytes_received"), Field(run.output, "predicted_bytes_received"));
  for (const char* out : {"out", "lse", "dq", "dk", "dv"}) {
    const double err = std::stod(Field(run.output, out));
    EXPECT_LE(err, 1e-5) << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, EngineProcessMaskTest,
                         ::testing::Values(MaskCase{2, "csbp", "allgather", 4},
                                           MaskCase{3, "flashcp", "targeted", 16},
                                           MaskCase{4, "llama3", "full_kv", 1}));

TEST(EngineProcessCliTest, BadBlockSizeExitsTwoNamingIt) {
  const CpStepRun run = CpStep("5", "--cp 2 --strategy csbp --scheme targeted --heads 1 "
                                    "--head_dim 4 --attention_mask=block_diffusion --block_size=0");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("--block_size: must be in [1, 2^40]"));
}

// A rank process that SIGKILLs itself after connecting: every other rank fails
// fast with Unavailable (closed sockets), far inside the 30 s communicator
// timeout. Rank 0 talks to rank 1 first, so its error names rank 1 (as a
// failed send to it or a failed receive from it, whichever the closed socket
// hits first); rank 2 may see rank 0's exit first.
TEST(EngineProcessFaultTest, KilledRankMakesOthersUnavailable) {
  const CpStepRun run = CpStep("300,20,5,91", "--cp 3 --strategy zigzag --scheme allgather --heads 1 "
                                        "--head_dim 4 --ranks processes --timeout_ms 30000 "
                                        "--fault crash --fault_rank 1");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              AllOf(HasSubstr("step failed"),
                    ::testing::ContainsRegex("UNAVAILABLE: rank 0: UNAVAILABLE: gloo allgather on "
                                             "rank 0 of 3 [^;]* (from|to) rank 1"),
                    HasSubstr("rank 1: ABORTED: process killed by signal 9"),
                    HasSubstr("rank 2: UNAVAILABLE: gloo allgather on rank 2 of 3")));
  EXPECT_LT(run.took, absl::Seconds(15));
}

// A rank process that stops taking part: the other fails with
// DeadlineExceeded after its 1 s timeout, and the launcher kills the hung
// process one timeout later; bounded, never a hang.
TEST(EngineProcessFaultTest, HungRankMakesOtherDeadlineExceeded) {
  const CpStepRun run = CpStep("300,20,5,91", "--cp 2 --strategy zigzag --scheme targeted --heads 1 "
                                        "--head_dim 4 --ranks processes --timeout_ms 1000 "
                                        "--fault hang --fault_rank 1");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output,
              AllOf(HasSubstr("DEADLINE_EXCEEDED: rank 0: DEADLINE_EXCEEDED: gloo sendrecv on "
                              "rank 0 of 2 (timeout 1s): recv of"),
                    HasSubstr("from rank 1"), HasSubstr("rank 1: ABORTED: process killed by signal 9")));
  EXPECT_GE(run.took, absl::Seconds(1));
  EXPECT_LT(run.took, absl::Seconds(15));
}

TEST(EngineProcessCliTest, BadUsageExitsTwo) {
  const CpStepRun run = CpStep("5", "--cp 2 --strategy nope --scheme targeted --heads 1 --head_dim 4");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("strategy"));
}

}  // namespace
