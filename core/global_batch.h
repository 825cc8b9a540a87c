// PlanGlobalBatch (issue 27): the documents of one global batch over DP
// replicas, each a CP group of N ranks with a context of C tokens. Which
// documents each replica packs (at most C tokens each; documents whole, but
// one longer than C is cut into C-token pieces, each packed as its own
// sequence, as a data pipeline truncates), chosen to balance the replicas'
// attention workload (SPEC Eq. 3 of whole documents, summed), and each
// replica's CP plan (MakePlan), which balances within the group. The
// baseline is first fit in arrival order (FirstFitReplicas). Pure.
//
// Algorithm: two starts, first fit in arrival order and longest-processing-
// time (heaviest piece first, onto the lightest replica with room; skipped
// where some piece then fits nowhere), each improved by local search on the
// heaviest replica (the single move or pairwise swap with another replica,
// within capacity, that lowers the pair's larger workload most) until no
// move lowers it; the better of the two is kept, so the result's imbalance
// is never above first fit's.
#ifndef FLASHCP_CORE_GLOBAL_BATCH_H_
#define FLASHCP_CORE_GLOBAL_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core {

struct GlobalBatchOptions {
  int32_t dp_size = 1;   // replicas
  int32_t cp_size = 1;   // N, ranks per replica's CP group
  int64_t context = 0;   // C, tokens a replica packs at most
  Strategy strategy = Strategy::kFlashCp;  // each replica's CP plan
  PlanOptions plan;
};

// The pieces of `doc_lens`: every document, those longer than `context` cut
// into pieces of `context` tokens (the last shorter). piece_doc[i]: the
// document piece i comes from.
struct Pieces {
  std::vector<int64_t> lens;
  std::vector<int32_t> doc;
};
Pieces CutToContext(const std::vector<int64_t>& doc_lens, int64_t context);

// Per replica, the pieces it packs (indices into `lens`, ascending) by first
// fit in arrival order: each piece onto the first replica with room.
// FailedPrecondition naming doc_lens where some piece fits nowhere.
absl::StatusOr<std::vector<std::vector<int32_t>>> FirstFitReplicas(
    const std::vector<int64_t>& lens, int32_t dp_size, int64_t context);

// max / mean over replicas of the attention workload of their pieces (each
// whole: ShardWorkload(0, len)); 1 where every replica is empty.
double ReplicaImbalance(const std::vector<int64_t>& lens,
                        const std::vector<std::vector<int32_t>>& replicas);

struct ReplicaBatch {
  std::vector<int32_t> pieces;    // indices into GlobalBatchPlan::pieces, ascending
  std::vector<int64_t> doc_lens;  // their lengths: the replica's batch
  double workload = 0;            // attention pairs (Eq. 3, whole pieces)
  Plan plan;                      // the replica's CP plan of doc_lens
};
struct GlobalBatchPlan {
  Pieces pieces;
  std::vector<ReplicaBatch> replicas;
  double imbalance = 1.0;             // ReplicaImbalance of this assignment
  double first_fit_imbalance = 1.0;   // ReplicaImbalance of FirstFitReplicas'
};

// InvalidArgument naming dp_size, cp_size, context or doc_lens (a length
// below 1, or more tokens than dp_size x context); FailedPrecondition naming
// doc_lens where first fit in arrival order places not every piece (the
// global batch is more than the replicas hold whole); a replica's MakePlan
// error with the replica named.
absl::StatusOr<GlobalBatchPlan> PlanGlobalBatch(const std::vector<int64_t>& doc_lens,
                                                const GlobalBatchOptions& options);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_GLOBAL_BATCH_H_
