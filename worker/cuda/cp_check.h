// Correctness checks of the GPU backend against the CPU reference
// (worker/attention_reference.h, fp32 in / double accumulation), shared by
// the GPU tests and flashcp-gpu-bench's `check` mode (the device check).
//
// Inputs are random N(0, 1) values rounded to bf16, so the reference sees
// exactly what the GPU sees; errors are then the GPU's bf16 rounding (of P
// before P.V in cuDNN, and of every output) and fp32 summation order.
// Outputs are poisoned with NaN before each run where the code under test
// must write them itself; a non-finite value anywhere fails the check.
#ifndef FLASHCP_WORKER_CUDA_CP_CHECK_H_
#define FLASHCP_WORKER_CUDA_CP_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/analysis.h"
#include "core/types.h"
#include "worker/cuda/attention.h"
#include "worker/cuda/gpu_cp_step.h"

namespace flashcp::worker::cuda {

// The project's error measure (worker::MaxRelError), with its floor
// worker::kRelErrFloor in both denominators: where the exact gradient is 0 (dq
// and dk of one-token documents), fp32 rounding leaves about 1e-7 on the GPU,
// which a bare relative error turned into 1e23 (device check, 2026-11-29).
struct ErrorStats {
  double max_rel = 0;      // max |got - want| / max(max |want|, kRelErrFloor)
  double l2_rel = 0;       // ||got - want|| / max(||want||, kRelErrFloor * sqrt(count))
  int64_t nonfinite = 0;   // NaN or Inf in `got` (never passes)
  int64_t count = 0;
};
ErrorStats Compare(const std::vector<float>& got, const std::vector<float>& want);

// Stated tolerances for bf16 storage with fp32 accumulation (see the header
// comment): O, dQ, dK, dV within max_rel 2e-2 and l2_rel 1e-2; LSE (fp32,
// values ~ log of the key count) within max_rel 1e-3.
struct Tolerance {
  double max_rel = 2e-2;
  double l2_rel = 1e-2;
};
inline constexpr Tolerance kBf16Tolerance{2e-2, 1e-2};
inline constexpr Tolerance kLseTolerance{1e-3, 1e-3};
bool Within(const ErrorStats& e, const Tolerance& t);

struct AttentionCheck {
  ErrorStats out, lse, dq, dk, dv;
  bool ok() const;
  std::string ToString() const;
};

// One varlen batch (q_len[i] <= kv_len[i], bottom-right causal) through
// `attention`, forward and backward, against the reference run per sequence
// as a document of kv_len[i] tokens whose first kv_len - q_len queries have
// zero output gradient (so they add nothing to dK, dV). With `gaps`, the
// sequences are placed with unused rows between them (the CP step's layout).
absl::StatusOr<AttentionCheck> CheckAttention(Attention& attention, const AttentionShape& shape,
                                              const std::vector<int32_t>& q_len,
                                              const std::vector<int32_t>& kv_len, uint64_t seed,
                                              bool gaps = false);

enum class AttentionBackend { kCudnn, kPlain };

// The reference's outputs for one (documents, seed, shape): RunCpCheck fills
// it and reuses it when the next call has the same key (the fp64 reference is
// the slow part of a check; strategies, schemes and backends share it).
struct CpReferenceCache {
  std::vector<int64_t> docs;
  core::AttentionMask mask;  // the plan's; block diffusion uses mask_reference.h
  uint64_t seed = 0;
  int32_t heads_q = 0, heads_kv = 0, head_dim = 0;
  std::vector<float> o, lse, dq, dk, dv;
};

struct CpCheckOptions {
  core::CommScheme scheme = core::CommScheme::kAllGather;
  AttentionShape shape;
  AttentionBackend backend = AttentionBackend::kCudnn;
  uint64_t seed = 1;
  int device = 0;
  absl::Duration timeout = absl::Seconds(120);
  CpReferenceCache* reference_cache = nullptr;  // optional, owned by the caller
  // > 0 (scheme kAllToAll): the two-level scheme (core/two_level.h) over one
  // group of every rank, this many ranks a node; bytes predicted by
  // core::GroupedSchemeBytes.
  int32_t two_level_ranks_per_node = 0;
};

struct CpCheck {
  AttentionCheck errors;                       // over the whole packed batch
  std::vector<int64_t> bytes_sent, bytes_received;          // per rank, measured
  std::vector<int64_t> predicted_sent, predicted_received;  // core::AnalyzePlan
  std::vector<CpAttentionTimes> times;         // per rank (ranks share one GPU: see below)
  std::string fallback;                        // cuDNN's fallback reason, if any
  bool ok() const;
};

// The whole CP step for `plan` (under plan.mask: the causal oracle, or the
// block-diffusion one, worker/mask_reference.h): N ranks as threads on one GPU through a
// DeviceLocalGroup, each a GpuCpRank on its own streams; O, LSE, dQ, dK, dV
// gathered from all ranks against the reference over the packed batch, and
// the bytes each rank moved against the analysis (bf16; KV heads, and Hq for
// all_to_all, whose LSE stays with the heads and is not compared; the
// two-level scheme as all_to_all, against core::GroupedSchemeBytes). The ranks
// run concurrently on the one GPU, so the times are not per-rank compute
// times; flashcp-gpu-bench measures those one rank after another.
absl::StatusOr<CpCheck> RunCpCheck(const core::Plan& plan, const CpCheckOptions& options);

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_CP_CHECK_H_
