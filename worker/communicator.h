// The collectives the execution engine needs, behind one interface, so that
// the Gloo backend (CPU, TCP) and a NCCL backend (GPU; buffers are device
// memory and calls are ordered on the backend's stream, both inside the
// implementation) plug in alike.
//
// Contract, every backend:
//  - Every rank of the group calls the same operations in the same order
//    (a collective); sizes are known to all ranks beforehand (the plan says
//    them), so no operation exchanges sizes.
//  - Every call returns absl::Status with context: the operation, the peer
//    where known, and the byte counts. A peer that dies gives kUnavailable; a
//    peer that does not take part within the communicator's timeout gives
//    kDeadlineExceeded; nothing hangs and no exception escapes. After a
//    failed call the communicator is broken: later calls return
//    kFailedPrecondition naming the first failure.
//  - stats() counts logical payload bytes: what this rank's collectives carry
//    for it, as core::AnalyzePlan counts them (SchemeBytes). An all-gather
//    sends the rank's input to each of the N-1 peers and receives each peer's
//    block once; a reduce-scatter sends block j to rank j (j != self) and
//    receives the N-1 blocks for itself; grouped send/recv counts each message
//    once. The rank's own block never counts. Barriers carry no payload.
//  - Zero-byte messages are skipped by both sides (sizes are symmetric).
#ifndef FLASHCP_WORKER_COMMUNICATOR_H_
#define FLASHCP_WORKER_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace flashcp::worker {

struct CommStats {
  int64_t bytes_sent = 0;      // logical payload bytes sent, all operations so far
  int64_t bytes_received = 0;  // logical payload bytes received
};

struct SendOp {
  int32_t peer = 0;
  absl::Span<const std::byte> data;
};
struct RecvOp {
  int32_t peer = 0;
  absl::Span<std::byte> data;  // exactly the size the peer sends
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;

  // All-gather of variable sizes: rank r contributes counts[r] bytes
  // (input.size() == counts[rank()]); output (sum of counts bytes) receives
  // the blocks in rank order, this rank's own block copied from input.
  virtual absl::Status AllGatherV(absl::Span<const std::byte> input, absl::Span<std::byte> output,
                                  absl::Span<const int64_t> counts) = 0;

  // Grouped point-to-point: posts every send and receive, then waits for all.
  // At most one send and one receive per peer; never to or from self.
  virtual absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) = 0;

  // Reduce-scatter of fp32 sums: input holds size() blocks, block j of
  // counts[j] floats destined for rank j; output (counts[rank()] floats) gets
  // the sum over all ranks of their block rank(), added in rank order (so the
  // result is bitwise deterministic).
  virtual absl::Status ReduceScatterV(absl::Span<const float> input, absl::Span<float> output,
                                      absl::Span<const int64_t> counts) = 0;

  virtual absl::Status Barrier() = 0;

  virtual CommStats stats() const = 0;
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_COMMUNICATOR_H_
