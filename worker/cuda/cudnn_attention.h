// The fast path: cuDNN's fused flash attention (SDPA) forward and backward,
// built through the cuDNN C++ frontend graph API, behind the Attention
// interface of attention.h. Packed THD layout with ragged offsets, per-sequence
// query and KV lengths (the padding mask), and the bottom-right causal mask,
// so each CP shard attends to its document's prefix plus itself. Where every
// sequence of a call has q_len == kv_len (whole documents) the top-left mask is
// the same mask, and it is what the call uses: cuDNN 9.19's backward ran at half
// the speed with the bottom-right one on such batches (docs/gpu.md).
//
// Graphs are built once per shape class (worker/graph_cache.h: direction,
// mask, sequences, max lengths rounded up to a power of two, at least 64) so
// that the many shapes of a training run share few graphs (the true lengths
// come in the seq_len tensors), and held in a bounded LRU cache
// (CudnnOptions::max_graphs) with hit / miss / build counters. A long-lived
// object (one per device and attention shape: the flashcp Python binding's
// CudaAttentionCache) keeps its handle and graphs across training steps; the
// workspace comes from the object (grown by cudaMalloc, kept) or, per call,
// from the caller (WorkspaceFn: the binding hands out torch's caching
// allocator's memory, so a steady-state step calls no cudaMalloc / cudaFree).
// Where cuDNN rejects a graph (check_support or build fails: an old library,
// an unsupported shape), the call falls back to our plain kernels and the
// reason is kept in fallback_reason(): a result, never a silent switch.
#ifndef FLASHCP_WORKER_CUDA_CUDNN_ATTENTION_H_
#define FLASHCP_WORKER_CUDA_CUDNN_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/cuda/attention.h"
#include "worker/cuda/attention_kernels.h"
#include "worker/cuda/device_memory.h"
#include "worker/graph_cache.h"

namespace flashcp::worker::cuda {

// The cuDNN library version the process loaded (cudnnGetVersion), e.g. 91900.
int64_t CudnnRuntimeVersion();

struct CudnnOptions {
  // A graph cuDNN rejects runs on the plain kernels instead (fallback_reason()
  // says why); false makes it an error (the device check measures cuDNN only).
  bool allow_fallback = true;
  // On a graph's first call, time every plan cuDNN's heuristics offer (on the
  // call's own tensors, inside the call: a device sync and a few executions
  // each; the workspace reserved for the largest plan stays) and keep the
  // fastest; else the heuristics' first choice. A failed tune keeps that
  // choice. Off where the workers run: no consistent gain measured (docs/gpu.md).
  bool autotune = false;
  // The bottom-right mask even where the top-left one is the same mask: to
  // measure and check what the choice costs (flashcp-gpu-bench).
  bool always_bottom_right = false;
  // Graphs held at most (least recently used evicted first; an eviction
  // synchronizes the device once before the graph is destroyed, since it may
  // still be running). A training run of one attention shape needs about
  // four per distinct (sequences, rounded lengths) class of its ranks.
  size_t max_graphs = 64;
};

// Device memory for one graph execution's workspace: `bytes` (> 0) bytes,
// usable on the call's stream until the stream passes the call's work (the
// memory of a caching allocator's block freed after the call is enqueued,
// as torch's is, qualifies). Called at most once per graph execution.
using WorkspaceFn = absl::FunctionRef<absl::StatusOr<void*>(size_t bytes)>;

class CudnnAttention final : public Attention {
 public:
  // FailedPrecondition where no cuDNN handle can be made (no device, no
  // library); InvalidArgument for a bad shape.
  static absl::StatusOr<std::unique_ptr<CudnnAttention>> Create(const AttentionShape& shape,
                                                                CudnnOptions options = {});
  ~CudnnAttention() override;

  absl::string_view name() const override { return "cudnn"; }
  absl::Status Forward(const VarlenBatch& batch, const AttentionForwardArgs& args,
                       cudaStream_t stream) override;
  absl::Status Backward(const VarlenBatch& batch, const AttentionBackwardArgs& args,
                        cudaStream_t stream) override;

  // As above, with the workspace from `workspace` instead of this object's.
  absl::Status Forward(const VarlenBatch& batch, const AttentionForwardArgs& args,
                       cudaStream_t stream, WorkspaceFn workspace);
  absl::Status Backward(const VarlenBatch& batch, const AttentionBackwardArgs& args,
                        cudaStream_t stream, WorkspaceFn workspace);

  // The graph cache's counters (worker/graph_cache.h) since Create.
  GraphCacheStats graph_stats() const;

  // Empty while every call ran on cuDNN; else why the last fallback happened.
  const std::string& fallback_reason() const { return fallback_reason_; }
  int64_t fallback_calls() const { return fallback_calls_; }

  class Graphs;  // the cached frontend graphs (cudnn_attention.cc)

 private:
  CudnnAttention(const AttentionShape& shape, CudnnOptions options);
  // Runs the cached graph for (direction, batch) on the variant pack (tensor
  // uid -> device pointer), building it on first use and autotuning it then
  // where options_.autotune.
  absl::Status Run(bool backward, const VarlenBatch& batch,
                   std::unordered_map<int64_t, void*>& pack, cudaStream_t stream,
                   WorkspaceFn workspace);
  // This object's own workspace, grown to `bytes` (WorkspaceFn for the
  // overloads without one).
  absl::StatusOr<void*> OwnWorkspace(size_t bytes);
  // Whether a failed Run goes to the plain kernels (a rejected graph, with a
  // fallback allowed and available); records why when it does.
  bool TakeFallback(const absl::Status& status);

  AttentionShape shape_;
  CudnnOptions options_;
  void* handle_ = nullptr;  // cudnnHandle_t, kept opaque so this header needs no cuDNN
  std::unique_ptr<Graphs> graphs_;
  std::unique_ptr<PlainAttention> fallback_;
  DeviceBuffer<uint8_t> workspace_;
  std::string fallback_reason_;
  int64_t fallback_calls_ = 0;
};

}  // namespace flashcp::worker::cuda

#endif  // FLASHCP_WORKER_CUDA_CUDNN_ATTENTION_H_
