#include "worker/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <cstdint>
#include <exception>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "cudnn_frontend.h"
#include "worker/cuda/cuda_status.h"

namespace flashcp::worker::cuda {
namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the variant pack. K and V share one ragged offset tensor, Q,
// O, dO and dQ another (same row width heads_q * D).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv,
  kSeqQ, kSeqKv, kRagQ, kRagKv, kRagStats,
};

// A frontend error_t (or a caught exception) as a Status naming the step.
absl::Status FeStatus(const fe::error_t& err, absl::string_view step) {
  if (err.is_good()) return absl::OkStatus();
  std::ostringstream code;
  code << err.code;
  return absl::FailedPreconditionError(
      absl::StrCat("cuDNN frontend ", step, ": ", code.str(), ": ", err.err_msg));
}

absl::Status CudnnStatus(cudnnStatus_t s, absl::string_view step) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuDNN ", step, ": ", cudnnGetErrorString(s)));
}

// Strides of a packed [tokens, heads, D] tensor seen as cuDNN's (b, h, s, d).
// The batch stride is nominal: the ragged offsets place each sequence.
std::vector<int64_t> ThdStrides(int64_t s, int64_t h, int64_t d) { return {s * h * d, d, h * d, 1}; }

}  // namespace

class CudnnAttention::Graphs {
 public:
  struct Entry {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;  // bytes, for the selected plan (all plans' max until a tune succeeds)
    bool tuned = false;     // autotune ran (or was not asked for)
  };
  explicit Graphs(size_t capacity) : cache(capacity) {}
  // A rejected shape is cached as its build status (not retried each call).
  GraphCache<Entry> cache;
};

namespace {

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr Int32Vector(fe::graph::Graph& g, Uid uid, const char* name, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_uid(uid)
                      .set_name(name)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

TensorPtr Thd(fe::graph::Graph& g, Uid uid, const char* name, int64_t b, int64_t h, int64_t s,
              int64_t d, const TensorPtr& ragged) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_uid(uid)
                      .set_name(name)
                      .set_dim({b, h, s, d})
                      .set_stride(ThdStrides(s, h, d))
                      .set_ragged_offset(ragged));
}

// Builds one graph: the frontend's validate -> operation graph -> heuristics
// -> support check -> plans sequence, each step's error kept.
absl::StatusOr<CudnnAttention::Graphs::Entry> BuildGraph(const AttentionShape& shape,
                                                         const GraphKey& key, bool all_plans,
                                                         cudnnHandle_t handle) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t b = key.sequences, hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  auto rag_q = Int32Vector(*g, kRagQ, "ragged_q", b + 1);
  auto rag_kv = Int32Vector(*g, kRagKv, "ragged_kv", b + 1);
  auto rag_stats = Int32Vector(*g, kRagStats, "ragged_stats", b + 1);
  auto seq_q = Int32Vector(*g, kSeqQ, "seq_q", b);
  auto seq_kv = Int32Vector(*g, kSeqKv, "seq_kv", b);
  auto q = Thd(*g, kQ, "Q", b, hq, key.max_q, d, rag_q);
  auto k = Thd(*g, kK, "K", b, hkv, key.max_kv, d, rag_kv);
  auto v = Thd(*g, kV, "V", b, hkv, key.max_kv, d, rag_kv);
  const std::vector<int64_t> stats_dim = {b, hq, key.max_q, 1};
  const std::vector<int64_t> stats_stride = {key.max_q * hq, 1, hq, 1};  // LSE [tokens, heads]
  const auto alignment =
      key.top_left ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT;

  if (!key.backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("flashcp_sdpa_fwd")
                     .set_generate_stats(true)
                     .set_attn_scale(shape.EffectiveScale())
                     .set_diagonal_alignment(alignment)
                     .set_diagonal_band_right_bound(0)  // causal
                     .set_padding_mask(true)
                     .set_seq_len_q(seq_q)
                     .set_seq_len_kv(seq_kv);
    auto [o, stats] = g->sdpa(q, k, v, attrs);
    o->set_output(true).set_uid(kO).set_dim({b, hq, key.max_q, d})
        .set_stride(ThdStrides(key.max_q, hq, d)).set_ragged_offset(rag_q);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim).set_stride(stats_stride).set_ragged_offset(rag_stats);
  } else {
    auto o = Thd(*g, kO, "O", b, hq, key.max_q, d, rag_q);
    auto dout = Thd(*g, kDo, "dO", b, hq, key.max_q, d, rag_q);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_uid(kStats)
                               .set_name("stats")
                               .set_dim(stats_dim)
                               .set_stride(stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT)
                               .set_ragged_offset(rag_stats));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("flashcp_sdpa_bwd")
                     .set_attn_scale(shape.EffectiveScale())
                     .set_diagonal_alignment(alignment)
                     .set_diagonal_band_right_bound(0)  // causal
                     .set_padding_mask(true)
                     .set_seq_len_q(seq_q)
                     .set_seq_len_kv(seq_kv);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attrs);
    dq->set_output(true).set_uid(kDq).set_dim({b, hq, key.max_q, d})
        .set_stride(ThdStrides(key.max_q, hq, d)).set_ragged_offset(rag_q);
    dk->set_output(true).set_uid(kDk).set_dim({b, hkv, key.max_kv, d})
        .set_stride(ThdStrides(key.max_kv, hkv, d)).set_ragged_offset(rag_kv);
    dv->set_output(true).set_uid(kDv).set_dim({b, hkv, key.max_kv, d})
        .set_stride(ThdStrides(key.max_kv, hkv, d)).set_ragged_offset(rag_kv);
  }

  FLASHCP_RETURN_IF_ERROR(FeStatus(g->validate(), "validate"));
  FLASHCP_RETURN_IF_ERROR(FeStatus(g->build_operation_graph(handle), "build_operation_graph"));
  FLASHCP_RETURN_IF_ERROR(
      FeStatus(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"));
  FLASHCP_RETURN_IF_ERROR(FeStatus(g->check_support(handle), "check_support"));
  CudnnAttention::Graphs::Entry entry;
  if (all_plans) {  // for autotune: every plan the heuristics offer, sized for the largest
    FLASHCP_RETURN_IF_ERROR(FeStatus(g->build_plans(fe::BuildPlanPolicy_t::ALL), "build_plans"));
    entry.workspace = g->get_autotune_workspace_size();
  } else {
    FLASHCP_RETURN_IF_ERROR(FeStatus(g->build_plans(), "build_plans"));
    FLASHCP_RETURN_IF_ERROR(FeStatus(g->get_workspace_size(entry.workspace), "get_workspace_size"));
    entry.tuned = true;
  }
  entry.graph = std::move(g);
  return entry;
}

}  // namespace

int64_t CudnnRuntimeVersion() { return static_cast<int64_t>(cudnnGetVersion()); }

CudnnAttention::CudnnAttention(const AttentionShape& shape, CudnnOptions options)
    : shape_(shape), options_(options), graphs_(std::make_unique<Graphs>(options.max_graphs)) {}

CudnnAttention::~CudnnAttention() {
  graphs_.reset();  // plans hold the handle's resources: drop them first
  if (handle_ != nullptr) (void)cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

absl::StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(const AttentionShape& shape,
                                                                       CudnnOptions options) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  std::unique_ptr<CudnnAttention> a(new CudnnAttention(shape, options));
  cudnnHandle_t h = nullptr;
  if (cudnnStatus_t s = cudnnCreate(&h); s != CUDNN_STATUS_SUCCESS)
    return absl::FailedPreconditionError(
        absl::StrCat("cudnnCreate: ", cudnnGetErrorString(s), " (cuDNN ", cudnnGetVersion(), ")"));
  a->handle_ = h;
  if (options.allow_fallback) {
    auto plain = PlainAttention::Create(shape);
    // head_dims the plain kernels lack just mean no fallback for this shape.
    if (plain.ok()) a->fallback_ = *std::move(plain);
  }
  return a;
}

namespace {

// Runs `body` with frontend exceptions (it throws from a few helpers, e.g.
// JSON) turned into Internal: none may cross the library boundary.
template <typename F>
absl::Status NoThrow(absl::string_view what, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": exception from the cuDNN frontend: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": unknown exception from the cuDNN frontend"));
  }
}

// The variant pack's batch entries, the same in both directions: per-sequence
// lengths and the ragged offsets.
std::unordered_map<int64_t, void*> BatchPack(const VarlenBatch& batch) {
  return {{kSeqQ, const_cast<int32_t*>(batch.d_seq_q())},
          {kSeqKv, const_cast<int32_t*>(batch.d_seq_kv())},
          {kRagQ, const_cast<int32_t*>(batch.d_q_elems())},
          {kRagKv, const_cast<int32_t*>(batch.d_kv_elems())},
          {kRagStats, const_cast<int32_t*>(batch.d_lse_elems())}};
}

}  // namespace

absl::Status CudnnAttention::Run(bool backward, const VarlenBatch& batch,
                                 std::unordered_map<int64_t, void*>& pack, cudaStream_t stream,
                                 WorkspaceFn workspace) {
  const GraphKey key = MakeGraphKey(backward, options_.always_bottom_right, batch.q_len(),
                                    batch.kv_len());
  const cudnnHandle_t h = static_cast<cudnnHandle_t>(handle_);
  return NoThrow(backward ? "SDPA backward" : "SDPA forward", [&]() -> absl::Status {
    std::vector<absl::StatusOr<Graphs::Entry>> evicted;
    absl::StatusOr<Graphs::Entry>& found = graphs_->cache.Get(
        key, [&] { return BuildGraph(shape_, key, options_.autotune, h); }, &evicted);
    if (!evicted.empty()) {
      // An evicted graph may still run on some stream: let the device finish
      // before its plans go (only on eviction, never in a steady state whose
      // shape classes fit max_graphs).
      FLASHCP_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "graph cache eviction: sync");
      evicted.clear();
    }
    if (!found.ok()) return found.status();
    Graphs::Entry& entry = *found;
    void* ws = nullptr;
    if (entry.workspace > 0) {
      FLASHCP_ASSIGN_OR_RETURN(ws, workspace(static_cast<size_t>(entry.workspace)));
    }
    FLASHCP_RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(h, stream), "cudnnSetStream"));
    if (!entry.tuned) {
      entry.tuned = true;
      // Not fatal: a failed tune leaves the heuristics' choice selected.
      if (entry.graph->autotune(h, pack, ws).is_good()) {
        int64_t tuned_ws = 0;
        if (entry.graph->get_workspace_size(tuned_ws).is_good()) entry.workspace = tuned_ws;
      }
    }
    return FeStatus(entry.graph->execute(h, pack, ws),
                    backward ? "execute backward" : "execute forward");
  });
}

absl::StatusOr<void*> CudnnAttention::OwnWorkspace(size_t bytes) {
  FLASHCP_RETURN_IF_ERROR(workspace_.Reserve(bytes));
  return static_cast<void*>(workspace_.data());
}

GraphCacheStats CudnnAttention::graph_stats() const { return graphs_->cache.stats(); }

bool CudnnAttention::TakeFallback(const absl::Status& status) {
  if (status.ok() || !options_.allow_fallback || !fallback_ ||
      status.code() != absl::StatusCode::kFailedPrecondition)
    return false;
  fallback_reason_ = std::string(status.message());
  ++fallback_calls_;
  return true;
}

absl::Status CudnnAttention::Forward(const VarlenBatch& batch, const AttentionForwardArgs& a,
                                     cudaStream_t stream) {
  return Forward(batch, a, stream, [this](size_t bytes) { return OwnWorkspace(bytes); });
}

absl::Status CudnnAttention::Backward(const VarlenBatch& batch, const AttentionBackwardArgs& a,
                                      cudaStream_t stream) {
  return Backward(batch, a, stream, [this](size_t bytes) { return OwnWorkspace(bytes); });
}

absl::Status CudnnAttention::Forward(const VarlenBatch& batch, const AttentionForwardArgs& a,
                                     cudaStream_t stream, WorkspaceFn workspace) {
  if (batch.total_q() == 0) return absl::OkStatus();
  std::unordered_map<int64_t, void*> pack = BatchPack(batch);
  pack.insert({{kQ, const_cast<bf16*>(a.q)},
               {kK, const_cast<bf16*>(a.k)},
               {kV, const_cast<bf16*>(a.v)},
               {kO, a.out},
               {kStats, a.lse}});
  absl::Status status = Run(/*backward=*/false, batch, pack, stream, workspace);
  return TakeFallback(status) ? fallback_->Forward(batch, a, stream) : status;
}

absl::Status CudnnAttention::Backward(const VarlenBatch& batch, const AttentionBackwardArgs& a,
                                      cudaStream_t stream, WorkspaceFn workspace) {
  if (batch.total_kv() == 0) return absl::OkStatus();
  std::unordered_map<int64_t, void*> pack = BatchPack(batch);
  pack.insert({{kQ, const_cast<bf16*>(a.q)},
               {kK, const_cast<bf16*>(a.k)},
               {kV, const_cast<bf16*>(a.v)},
               {kO, const_cast<bf16*>(a.out)},
               {kDo, const_cast<bf16*>(a.dout)},
               {kStats, const_cast<float*>(a.lse)},
               {kDq, a.dq},
               {kDk, a.dk},
               {kDv, a.dv}});
  absl::Status status = Run(/*backward=*/true, batch, pack, stream, workspace);
  return TakeFallback(status) ? fallback_->Backward(batch, a, stream) : status;
}

}  // namespace flashcp::worker::cuda
