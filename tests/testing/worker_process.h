// The real flashcp-worker binary as a child process, for tests that run CP
// groups against a real planner:
//   auto w = WorkerProcess::Start(FLASHCP_WORKER_BIN,
//                                 {"--rank", "0", "--planner", address}, deadline);
//   ... w->control (WorkerControl), w->metrics (/metrics) ...
//   EXPECT_EQ(w->Finish(deadline).value(), 0) << w->output;
#ifndef FLASHCP_TESTS_TESTING_WORKER_PROCESS_H_
#define FLASHCP_TESTS_TESTING_WORKER_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tests/testing/subprocess.h"

namespace flashcp::tests::testing {

// The worker's startup line, `WORKER rank=R control=HOST:PORT metrics=HOST:PORT`.
struct WorkerAddresses {
  int rank = 0;
  std::string control;  // HOST:PORT of flashcp.v1.WorkerControl
  std::string metrics;  // HOST:PORT of /metrics
};
// InvalidArgument for any other line.
absl::StatusOr<WorkerAddresses> ParseWorkerLine(absl::string_view line);

struct WorkerProcess {
  // Runs `binary <args>` with stderr merged into stdout and waits until
  // `deadline` for its WORKER line (earlier lines are kept in `output`).
  // DeadlineExceeded if none comes by then; OutOfRange, with what it printed,
  // if the worker exits first.
  static absl::StatusOr<WorkerProcess> Start(const std::string& binary,
                                             const std::vector<std::string>& args,
                                             absl::Time deadline);

  // Reads the rest of the output into `output` and returns the exit code (128
  // + the signal for a killed worker). DeadlineExceeded if the worker has not
  // closed its output or exited by `deadline`.
  absl::StatusOr<int> Finish(absl::Time deadline);

  std::unique_ptr<Subprocess> process;
  std::string control, metrics;  // from the WORKER line
  std::string output;            // stdout and stderr read so far
};

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_WORKER_PROCESS_H_
