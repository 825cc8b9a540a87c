// flashcp-cpstep's machinery, as a library so that tests drive it directly:
// seeded inputs for a packed batch, one rank's forward+backward step, N ranks
// as threads (HashStore rendezvous) or as processes (FileStore in a temporary
// directory, fork/exec of the binary), and the comparison with the
// single-process reference over the whole batch.
#ifndef FLASHCP_WORKER_CPSTEP_H_
#define FLASHCP_WORKER_CPSTEP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/analysis.h"
#include "core/types.h"
#include "gloo/rendezvous/store.h"
#include "worker/attention_cpu.h"
#include "worker/communicator.h"

namespace flashcp::worker {

// Global inputs of the packed batch, [total tokens][H][D], uniform in [-1, 1)
// from a splitmix64 stream of `seed` (the same on every machine).
struct StepInputs {
  std::vector<float> q, k, v, dout;
};
StepInputs MakeInputs(int64_t tokens, const AttentionShape& shape, uint64_t seed);

// Testing only: makes one rank fail after it has connected and passed the
// first barrier, so that the others fail inside the forward exchange. kCrash:
// a thread rank destroys its communicator; a process rank kills itself with
// SIGKILL. kHang: the rank stops taking part (a thread waits until the others
// have returned; a process blocks until killed).
struct Fault {
  enum Kind { kNone, kCrash, kHang };
  Kind kind = kNone;
  int32_t rank = -1;
};

struct StepConfig {
  AttentionShape shape;
  core::CommScheme scheme = core::CommScheme::kAllGather;
  int threads_per_rank = 1;                // kernel parallelism of each rank
  absl::Duration timeout = absl::Seconds(60);  // communicator timeout
  Fault fault;
};

// One rank's local outputs ([local rows][H][D], lse [local rows][H]; lse
// empty under all_to_all, whose log-sum-exps stay with the heads, and then
// left out of CompareWithReference's lse error), its
// communication counts and the wall time of its forward+backward.
struct RankResult {
  std::vector<float> o, lse, dq, dk, dv;
  CommStats stats;          // Forward and Backward
  CommStats forward_stats;  // Forward alone (one phase: K and V out)
  double seconds = 0.0;
};

// Slices rank `rank`'s rows out of `inputs`, then Forward and Backward on
// `comm` between two barriers (the time is between them). `after_barrier`,
// if set, runs after the first barrier (fault injection); if it returns an
// error, RunRank returns it without touching `comm` again.
absl::StatusOr<RankResult> RunRank(const core::Plan& plan, int32_t rank, const StepConfig& config,
                                   const StepInputs& inputs, Communicator& comm,
                                   const std::function<absl::Status()>& after_barrier = {});

// All ranks as threads of this process. On failure, the status of the lowest
// failing rank (other than an injected fault's rank) with every rank's error
// in the message.
absl::StatusOr<std::vector<RankResult>> RunThreads(const core::Plan& plan, const StepConfig& config,
                                                   const StepInputs& inputs);

// One rank as this process (the child side of RunProcesses): reads the plan
// RunProcesses wrote to `dir`, makes the inputs from `seed`, connects through
// a FileStore in `dir`, runs the step and writes its result (or its error) to
// `dir`.
absl::Status RankProcessMain(int32_t rank, const StepConfig& config, uint64_t seed,
                             const std::string& dir);

// The Status a failed rank process wrote to its error file: the numeric
// absl::StatusCode (1..16) on the first line, then the message. A first line
// that is not such a code (a torn or foreign file) gives UNKNOWN with the
// whole text, so nothing is silently turned into another code, or into OK.
absl::Status ParseRankError(const std::string& text);

// All ranks as processes: fork/execs `argv` + {"--internal_rank", r,
// "--internal_dir", dir} for each rank (argv[0] the binary), waits for them
// (killing any left once another has failed and `config.timeout` has
// passed), and reads their results back. It waits for those pids only, never
// for other children of the process. The directory is made with
// mkdtemp and removed.
absl::StatusOr<std::vector<RankResult>> RunProcesses(const core::Plan& plan,
                                                     const StepConfig& config,
                                                     const std::vector<std::string>& argv);

// Max relative errors (MaxRelError) of the gathered rank outputs against the
// reference over the whole batch, real tokens only.
struct StepErrors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};
absl::StatusOr<StepErrors> CompareWithReference(const core::Plan& plan,
                                                const AttentionShape& shape,
                                                const StepInputs& inputs,
                                                const std::vector<RankResult>& results);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_CPSTEP_H_
