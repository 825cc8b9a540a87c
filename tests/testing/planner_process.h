// The real flashcp-planner binary as a child process, for tests of the server
// and of its clients:
//   auto planner = PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
//   auto stub = flashcp::v1::Planner::NewStub(planner.value()->NewChannel());
//   ... scrape planner.value()->metrics_address() ...
//   EXPECT_EQ(planner.value()->Terminate(absl::Seconds(30)).value(), 0);
#ifndef FLASHCP_TESTS_TESTING_PLANNER_PROCESS_H_
#define FLASHCP_TESTS_TESTING_PLANNER_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/subprocess.h"

namespace flashcp::tests::testing {

// The planner's startup line, `LISTENING grpc=HOST:PORT metrics=HOST:PORT`.
struct ListeningAddresses {
  std::string grpc;     // HOST:PORT
  std::string metrics;  // HOST:PORT; empty for "metrics=-" (disabled)
};
// InvalidArgument for any other line.
absl::StatusOr<ListeningAddresses> ParseListeningLine(absl::string_view line);

class PlannerProcess {
 public:
  // Runs `binary --listen 127.0.0.1:0 --metrics 127.0.0.1:0 <extra_args>` and
  // waits up to `timeout` for its LISTENING line (other stdout lines are
  // skipped; stderr goes to the test's log, or with options.merge_stderr
  // into stdout, for process().ReadAll). An error if it exits first.
  static absl::StatusOr<std::unique_ptr<PlannerProcess>> Start(
      const std::string& binary, const std::vector<std::string>& extra_args = {},
      absl::Duration timeout = absl::Seconds(60), const Subprocess::Options& options = {});
  // Start for a test's setup: a planner that does not start is a test
  // failure (ADD_FAILURE, with the status) and null.
  static std::unique_ptr<PlannerProcess> StartOrFail(const std::string& binary,
                                                     const std::vector<std::string>& extra_args,
                                                     absl::Duration timeout);

  const std::string& grpc_address() const { return addresses_.grpc; }
  const std::string& metrics_address() const { return addresses_.metrics; }
  Subprocess& process() { return *process_; }

  // A new insecure channel to grpc_address().
  std::shared_ptr<grpc::Channel> NewChannel() const;

  // GET /metrics; the body. An error unless HTTP 200.
  absl::StatusOr<std::string> ScrapeMetrics(absl::Duration timeout = absl::Seconds(10)) const;

  // SIGTERM, then the exit code (0 after a clean drain). The destructor
  // SIGKILLs a planner still running.
  absl::StatusOr<int> Terminate(absl::Duration timeout = absl::Seconds(60));

 private:
  PlannerProcess() = default;
  std::unique_ptr<Subprocess> process_;
  ListeningAddresses addresses_;
};

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_PLANNER_PROCESS_H_
