// Child processes for integration tests: start a real binary, read its stdout
// line by line with a deadline, signal it, wait for its exit code with a
// deadline. Never sleeps for luck: every wait is on an event or a deadline.
#ifndef FLASHCP_TESTS_TESTING_SUBPROCESS_H_
#define FLASHCP_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flashcp::tests::testing {

struct CommandResult {
  int exit_code = 0;
  std::string output;  // stdout and stderr, interleaved
};

class Subprocess {
 public:
  struct Options {
    bool pipe_stdin = false;    // else stdin is /dev/null
    bool merge_stderr = false;  // stderr into the stdout pipe; else inherited (test log)
  };

  // fork + execv(argv[0], argv). Internal if the pipes or the fork fail;
  // a binary that cannot be executed exits 127.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const Options& options);
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv) {
    return Start(argv, Options{});
  }
  // SIGKILLs and reaps the child if it is still running.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // The next stdout line, without its '\n'. DeadlineExceeded if none by
  // `deadline`; OutOfRange at end of output (the rest, if any, is in the message).
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);
  // Everything left on stdout until the child closes it. DeadlineExceeded if
  // it has not by `deadline`.
  absl::StatusOr<std::string> ReadAll(absl::Time deadline);

  // Writes all of `data` to the child's stdin (Options::pipe_stdin).
  absl::Status WriteStdin(absl::string_view data, absl::Time deadline);
  void CloseStdin();

  absl::Status Signal(int sig);

  // The exit code, or 128 + the signal number if a signal killed it.
  // DeadlineExceeded if it is still running at `deadline`.
  absl::StatusOr<int> Wait(absl::Time deadline);

 private:
  friend absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                                  absl::string_view input, absl::Time deadline);
  Subprocess() = default;
  // Reads what is available into buffer_; false at EOF.
  absl::StatusOr<bool> Fill(absl::Time deadline);

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int stdin_fd_ = -1;
  std::string buffer_;  // read from stdout, not yet returned
  bool eof_ = false;
  std::optional<int> exit_code_;
};

// Runs argv to completion with `input` on its stdin. DeadlineExceeded (and the
// child killed) if it runs past `deadline`.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::string_view input, absl::Time deadline);

// A tool's run with its stdout and stderr apart.
struct ToolRun {
  int exit_code = -1;  // -1: the run could not be made (a test failure is recorded)
  std::string out;
  std::string err;
};

// Runs argv to completion as RunCommand does, stderr kept apart through a
// file under `scratch_dir` (removed after). A run that cannot be made or
// passes `deadline` is recorded as a test failure (ADD_FAILURE).
ToolRun RunTool(const std::vector<std::string>& argv, absl::string_view input,
                absl::Time deadline, const std::string& scratch_dir);

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_SUBPROCESS_H_
