#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace flashcp::tests::testing {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Milliseconds until `deadline` for poll(), at least 0, at most a minute.
int PollTimeoutMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60'000));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const Options& options) {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Errno("pipe2");
  int in[2] = {-1, -1};
  if (options.pipe_stdin && pipe2(in, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return Errno("pipe2");
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return Errno("fork");
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the test may have blocked some
    dup2(out[1], STDOUT_FILENO);
    if (options.merge_stderr) dup2(out[1], STDERR_FILENO);
    if (options.pipe_stdin) {
      dup2(in[0], STDIN_FILENO);
    } else {
      const int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  if (options.pipe_stdin) close(in[0]);
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;
  p->stdout_fd_ = out[0];
  p->stdin_fd_ = options.pipe_stdin ? in[1] : -1;
  // Non-blocking, so that a write never waits for a child that is itself
  // waiting for us to read its output; writers poll for POLLOUT instead.
  if (p->stdin_fd_ >= 0) fcntl(p->stdin_fd_, F_SETFL, O_NONBLOCK);
  return p;
}

Subprocess::~Subprocess() {
  CloseStdin();
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (pid_ > 0 && !exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

absl::StatusOr<bool> Subprocess::Fill(absl::Time deadline) {
  if (eof_) return false;
  pollfd pfd{stdout_fd_, POLLIN, 0};
  for (;;) {
    const int rc = poll(&pfd, 1, PollTimeoutMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Errno("poll");
    if (rc == 0) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("no output from pid ", pid_, " before the deadline"));
      }
      continue;
    }
    char buf[4096];
    const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("read");
    if (n == 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Time deadline) {
  for (;;) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    absl::StatusOr<bool> more = Fill(deadline);
    if (!more.ok()) return more.status();
    if (!*more) {
      return absl::OutOfRangeError(
          absl::StrCat("pid ", pid_, " closed stdout; unterminated rest: \"", buffer_, "\""));
    }
  }
}

absl::StatusOr<std::string> Subprocess::ReadAll(absl::Time deadline) {
  for (;;) {
    absl::StatusOr<bool> more = Fill(deadline);
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  std::string all;
  all.swap(buffer_);
  return all;
}

absl::Status Subprocess::WriteStdin(absl::string_view data, absl::Time deadline) {
  if (stdin_fd_ < 0) return absl::FailedPreconditionError("stdin is not a pipe (or closed)");
  pollfd pfd{stdin_fd_, POLLOUT, 0};
  while (!data.empty()) {
    const int rc = poll(&pfd, 1, PollTimeoutMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Errno("poll");
    if (rc == 0) {
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("stdin write timed out");
      continue;
    }
    const ssize_t n = write(stdin_fd_, data.data(), data.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return Errno("write");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

void Subprocess::CloseStdin() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

absl::Status Subprocess::Signal(int sig) {
  if (exit_code_.has_value()) return absl::FailedPreconditionError("the process has exited");
  if (kill(pid_, sig) != 0) return Errno("kill");
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  // waitpid has no timeout; poll it in 1 ms steps until the deadline. This
  // waits on the event (the child's exit), not on luck.
  while (!exit_code_.has_value()) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("waitpid");
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return *exit_code_;
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::string_view input, absl::Time deadline) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(argv, Subprocess::Options{/*pipe_stdin=*/true, /*merge_stderr=*/true});
  if (!p.ok()) return p.status();
  // The child may write before it has read everything: interleave so neither
  // side blocks on a full pipe.
  signal(SIGPIPE, SIG_IGN);  // a child that exits early must not kill the test
  std::string output;
  const int in_fd = (*p)->stdin_fd_;
  size_t written = 0;
  bool out_open = true;
  while (out_open) {
    pollfd fds[2] = {{(*p)->stdout_fd_, POLLIN, 0}, {(*p)->stdin_fd_, POLLOUT, 0}};
    const int nfds = (*p)->stdin_fd_ >= 0 ? 2 : 1;
    const int rc = poll(fds, nfds, PollTimeoutMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Errno("poll");
    if (rc == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(argv[0], " ran past its deadline"));
    }
    if (nfds == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t n = write(in_fd, input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        (*p)->CloseStdin();
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[4096];
      const ssize_t n = read((*p)->stdout_fd_, buf, sizeof(buf));
      if (n > 0) {
        output.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        out_open = false;
      }
    }
    if (input.empty() && (*p)->stdin_fd_ >= 0) (*p)->CloseStdin();
  }
  (*p)->CloseStdin();
  absl::StatusOr<int> code = (*p)->Wait(deadline);
  if (!code.ok()) return code.status();
  return CommandResult{*code, std::move(output)};
}

ToolRun RunTool(const std::vector<std::string>& argv, absl::string_view input,
                absl::Time deadline, const std::string& scratch_dir) {
  static std::atomic<int> counter{0};
  const std::string err_path =
      absl::StrCat(scratch_dir, "/run_tool_", getpid(), "_", counter++, ".err");
  // Single quotes keep every byte but ' itself, written as '\''.
  const auto quote = [](const std::string& a) {
    return absl::StrCat("'", absl::StrReplaceAll(a, {{"'", "'\\''"}}), "'");
  };
  std::vector<std::string> quoted;
  for (const std::string& a : argv) quoted.push_back(quote(a));
  const std::string cmd =
      absl::StrCat("exec ", absl::StrJoin(quoted, " "), " 2>", quote(err_path));
  ToolRun run;
  absl::StatusOr<CommandResult> r = RunCommand({"/bin/sh", "-c", cmd}, input, deadline);
  if (r.ok()) {
    run.exit_code = r->exit_code;
    run.out = r->output;
  } else {
    ADD_FAILURE() << argv[0] << ": " << r.status();
  }
  std::ifstream err(err_path);
  run.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  unlink(err_path.c_str());
  return run;
}

}  // namespace flashcp::tests::testing
