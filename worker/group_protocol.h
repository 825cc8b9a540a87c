// The messages a worker group exchanges over its Communicator each round
// (worker/daemon.h says when): the driver's StepHeader, the plan that follows
// a step header, and every rank's RankReport. Encoding is native layout at a
// fixed size (every rank runs the same binary on the same architecture);
// decoding validates every field, so a corrupt or mismatched message is a
// Status naming the field, never a wrong step.
#ifndef FLASHCP_WORKER_GROUP_PROTOCOL_H_
#define FLASHCP_WORKER_GROUP_PROTOCOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/analysis.h"
#include "core/strategies.h"
#include "worker/communicator.h"

namespace flashcp::worker {

// What the driver tells the group to do this round.
enum class RoundKind : uint32_t {
  kStep = 1,     // run one step of the plan that follows (payload_bytes of it)
  kIdle = 2,     // no run going: a heartbeat
  kWaiting = 3,  // a run is going, its next plan has not come yet: a heartbeat
  kExit = 4,     // the group ends cleanly; no report follows
};

struct StepHeader {
  RoundKind kind = RoundKind::kIdle;
  // kStep only: for the other kinds the wire carries zeros here (Encode
  // writes them, Decode refuses anything else) and Decode leaves these
  // defaults.
  core::Strategy strategy = core::Strategy::kFlashCp;  // the run's strategy
  core::CommScheme scheme = core::CommScheme::kAllGather;
  int64_t batch = 0;          // batch index (seeds the step's data)
  int64_t steps_total = 0;    // steps of the current run
  int64_t payload_bytes = 0;  // serialized flashcp.v1.PlanResponse that follows
};

inline constexpr int64_t kStepHeaderBytes = 40;
// Bound on a plan's serialized size; the driver refuses to send larger.
inline constexpr int64_t kMaxPlanPayloadBytes = int64_t{1} << 30;

std::array<std::byte, kStepHeaderBytes> EncodeStepHeader(const StepHeader& header);
// InvalidArgument when `bytes` is not kStepHeaderBytes long (the caller's
// buffer); DataLoss naming the field for an unknown kind, strategy or scheme,
// a payload outside [0, kMaxPlanPayloadBytes] or a non-step header with
// step fields set.
absl::StatusOr<StepHeader> DecodeStepHeader(absl::Span<const std::byte> bytes);

// One rank's report after a step or heartbeat round.
struct RankReport {
  // CPU: forward + backward minus communication; CUDA: kernel time. 0 on a
  // heartbeat.
  double attention_seconds = 0;
  double attention_cpu_seconds = 0;  // StepMeasurement's; 0 where not measured
  bool stop = false;                 // this rank wants the group to stop
};

// Every rank's report, indexed by rank (an all-gather of `mine`).
absl::StatusOr<std::vector<RankReport>> GatherReports(Communicator& comm,
                                                      const RankReport& mine);

// Rank 0's `data` to every rank (an all-gather only rank 0 contributes to);
// every rank passes a buffer of the same size.
absl::Status Broadcast(Communicator& comm, absl::Span<std::byte> data);

// The driver's header (and for a step, `payload`) to every rank: on rank 0
// `header` and `payload` are what it sends, elsewhere they are filled with
// what rank 0 sent; rank 0 sets header.payload_bytes. On every rank DataLoss
// ("from the driver: ...") when rank 0's header does not decode; on rank 0
// ResourceExhausted, before sending anything, for a plan larger than
// kMaxPlanPayloadBytes.
absl::Status BroadcastRound(Communicator& comm, StepHeader& header, std::string& payload);

// What every rank of a group must run alike: a step's buffers and messages
// are sized from these on each rank, so ranks that differ would exchange
// messages of different sizes (Gloo then aborts the process from its own
// thread) or allocate from another rank's sizes.
struct GroupShape {
  int64_t context = 0;      // tokens per batch (--context)
  int64_t heads = 0;        // --heads
  int64_t head_dim = 0;     // --head_dim
  int64_t dtype_bytes = 0;  // the backend's element size
};
// Every rank's shape (a fixed-size all-gather, so it cannot mismatch
// itself), compared with rank 0's: FailedPrecondition on every rank naming
// the first field and rank that differ, before any step.
absl::Status AgreeOnShape(Communicator& comm, const GroupShape& mine);

// What the group's reports of one step say.
struct GroupTimes {
  double measured_imbalance = 1.0;  // max / mean attention seconds; 1 where the mean is 0
  double mean_attention_seconds = 0;
  // max / mean of thread CPU attention seconds; 0 unless every rank measured it.
  double cpu_imbalance = 0;
  // The time the calibration fits: every rank's CPU seconds where all ranks
  // measured them (one kernel thread each), else attention seconds.
  bool use_cpu_seconds = false;
  double min_fit_seconds = 0;  // the least of those times; 0 for no reports
  bool stop = false;           // some rank wants the group to stop
};
GroupTimes SummarizeReports(absl::Span<const RankReport> reports);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_GROUP_PROTOCOL_H_
