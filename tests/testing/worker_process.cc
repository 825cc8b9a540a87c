#include "tests/testing/worker_process.h"

#include <regex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flashcp::tests::testing {

absl::StatusOr<WorkerAddresses> ParseWorkerLine(absl::string_view line) {
  static const std::regex re("^WORKER rank=(\\d+) control=(\\S+) metrics=(\\S+)$");
  const std::string s(line);
  std::smatch m;
  WorkerAddresses a;
  if (!std::regex_match(s, m, re) || !absl::SimpleAtoi(m[1].str(), &a.rank)) {
    return absl::InvalidArgumentError(absl::StrCat("not a WORKER line: \"", line, "\""));
  }
  a.control = m[2];
  a.metrics = m[3];
  return a;
}

absl::StatusOr<WorkerProcess> WorkerProcess::Start(const std::string& binary,
                                                   const std::vector<std::string>& args,
                                                   absl::Time deadline) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(argv, {.pipe_stdin = false, .merge_stderr = true});
  if (!p.ok()) return p.status();
  WorkerProcess w;
  w.process = *std::move(p);
  for (;;) {
    absl::StatusOr<std::string> line = w.process->ReadLine(deadline);
    if (!line.ok()) {
      return absl::Status(line.status().code(),
                          absl::StrCat("flashcp-worker printed no WORKER line: ",
                                       line.status().message(), "; output: ", w.output));
    }
    w.output += *line + "\n";
    if (absl::StatusOr<WorkerAddresses> a = ParseWorkerLine(*line); a.ok()) {
      w.control = a->control;
      w.metrics = a->metrics;
      return w;
    }
  }
}

absl::StatusOr<int> WorkerProcess::Finish(absl::Time deadline) {
  absl::StatusOr<std::string> rest = process->ReadAll(deadline);
  if (!rest.ok()) return rest.status();
  output += *rest;
  return process->Wait(deadline);
}

}  // namespace flashcp::tests::testing
