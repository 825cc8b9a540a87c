#include "tests/testing/planner_process.h"

#include <signal.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/http.h"

namespace flashcp::tests::testing {

absl::StatusOr<ListeningAddresses> ParseListeningLine(absl::string_view line) {
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[0] != "LISTENING" || !absl::StartsWith(parts[1], "grpc=") ||
      !absl::StartsWith(parts[2], "metrics=")) {
    return absl::InvalidArgumentError(absl::StrCat("not a LISTENING line: \"", line, "\""));
  }
  ListeningAddresses a;
  a.grpc = std::string(parts[1].substr(5));
  const absl::string_view metrics = parts[2].substr(8);
  if (metrics != "-") a.metrics = std::string(metrics);
  if (a.grpc.empty() || a.grpc.find(':') == std::string::npos ||
      (!a.metrics.empty() && a.metrics.find(':') == std::string::npos)) {
    return absl::InvalidArgumentError(absl::StrCat("not a LISTENING line: \"", line, "\""));
  }
  return a;
}

absl::StatusOr<std::unique_ptr<PlannerProcess>> PlannerProcess::Start(
    const std::string& binary, const std::vector<std::string>& extra_args,
    absl::Duration timeout, const Subprocess::Options& options) {
  std::vector<std::string> argv = {binary, "--listen", "127.0.0.1:0", "--metrics",
                                   "127.0.0.1:0"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(argv, options);
  if (!process.ok()) return process.status();
  std::unique_ptr<PlannerProcess> p(new PlannerProcess());
  p->process_ = *std::move(process);
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<std::string> line = p->process_->ReadLine(deadline);
    if (!line.ok()) {
      return absl::Status(line.status().code(),
                          absl::StrCat(binary, " printed no LISTENING line: ",
                                       line.status().message()));
    }
    if (!absl::StartsWith(*line, "LISTENING ")) continue;
    absl::StatusOr<ListeningAddresses> addresses = ParseListeningLine(*line);
    if (!addresses.ok()) return addresses.status();
    p->addresses_ = *std::move(addresses);
    return p;
  }
}

std::unique_ptr<PlannerProcess> PlannerProcess::StartOrFail(
    const std::string& binary, const std::vector<std::string>& extra_args,
    absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<PlannerProcess>> p = Start(binary, extra_args, timeout);
  if (!p.ok()) {
    ADD_FAILURE() << binary << ": " << p.status();
    return nullptr;
  }
  return *std::move(p);
}

std::shared_ptr<grpc::Channel> PlannerProcess::NewChannel() const {
  return grpc::CreateChannel(addresses_.grpc, grpc::InsecureChannelCredentials());
}

absl::StatusOr<std::string> PlannerProcess::ScrapeMetrics(absl::Duration timeout) const {
  if (addresses_.metrics.empty()) return absl::FailedPreconditionError("metrics are disabled");
  absl::StatusOr<HttpResponse> r = HttpGet(addresses_.metrics, "/metrics", absl::Now() + timeout);
  if (!r.ok()) return r.status();
  if (r->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET /metrics: HTTP ", r->status));
  }
  return r->body;
}

absl::StatusOr<int> PlannerProcess::Terminate(absl::Duration timeout) {
  if (absl::Status s = process_->Signal(SIGTERM); !s.ok()) return s;
  return process_->Wait(absl::Now() + timeout);
}

}  // namespace flashcp::tests::testing
