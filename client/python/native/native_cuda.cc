// The CUDA bindings: CudaAttention, CudaBatch and CudaAttentionCache over
// cuda_backend.h (the cuDNN path, or Unimplemented in a build without CUDA).
#include "client/python/native/native_common.h"

namespace flashcp::python {
namespace {

// The CUDA calls' buffers of one layout (bf16 device buffers, the layout's
// two shard groups as in CpuAttention, KV heads as they are: cuDNN's GQA),
// each (address, count) checked for its size. Query-side rows: C/N, or under
// all_to_all the head-parallel rows (cp_layout.h's AttentionRows).
class CudaBufferCheck {
 public:
  CudaBufferCheck(const worker::CpRankLayout& p, int32_t heads_q, int32_t heads_kv,
                  int32_t head_dim)
      : rows_(worker::AttentionRows(p)),
        stage_rows_(static_cast<int64_t>(p.stage_src.size())),
        q_row_(int64_t{heads_q} * head_dim),
        kv_row_(int64_t{heads_kv} * head_dim),
        heads_q_(heads_q) {}

  int64_t stage_rows() const { return stage_rows_; }

  // Forward's buffers (also Backward's inputs). groups: kCudaWholeShards |
  // kCudaPrefixedShards (cuda_backend.h); the buffers of a group that does
  // not run are not read (pass (0, 0)).
  CudaShardBuffers Forward(Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse,
                           uint32_t groups) const {
    if (groups == 0 || (groups & ~(kCudaWholeShards | kCudaPrefixedShards)) != 0) {
      Raise(absl::InvalidArgumentError(absl::StrCat("groups: ", groups, "; expected 1, 2 or 3")));
    }
    CudaShardBuffers b;
    b.q = Q("q", q);
    std::tie(b.k, b.v) = KvPair(groups, kCudaWholeShards, "k", k, "v", v);
    std::tie(b.k_stage, b.v_stage) =
        KvPair(groups, kCudaPrefixedShards, "k_stage", ks, "v_stage", vs);
    b.out = Q("o", o);
    b.lse = Check("lse", lse, rows_ * heads_q_);
    return b;
  }
  CudaShardBuffers Backward(Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse, Buf dout, Buf dq,
                            Buf dk, Buf dv, Buf dks, Buf dvs, uint32_t groups) const {
    CudaShardBuffers b = Forward(q, k, v, ks, vs, o, lse, groups);
    b.dout = Q("dout", dout);
    b.dq = Q("dq", dq);
    std::tie(b.dk, b.dv) = KvPair(groups, kCudaWholeShards, "dk", dk, "dv", dv);
    std::tie(b.dk_stage, b.dv_stage) =
        KvPair(groups, kCudaPrefixedShards, "dk_stage", dks, "dv_stage", dvs);
    return b;
  }

 private:
  static uintptr_t Check(const char* name, Buf b, int64_t want) {
    if (b.second != want || (want > 0 && b.first == 0)) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat(name, ": ", b.second, " elements, expected ", want)));
    }
    return b.first;
  }
  uintptr_t Q(const char* name, Buf b) const { return Check(name, b, rows_ * q_row_); }
  uintptr_t Kv(const char* name, Buf b, int64_t rows) const {
    return Check(name, b, rows * kv_row_);
  }
  // A group's two KV-shaped buffers (local rows for the whole shards, staged
  // rows for the prefixed ones), checked where `group` runs; (0, 0) where not.
  std::pair<uintptr_t, uintptr_t> KvPair(uint32_t groups, uint32_t group, const char* a_name,
                                         Buf a, const char* b_name, Buf b) const {
    if (!(groups & group)) return {0, 0};
    const int64_t rows = group == kCudaWholeShards ? rows_ : stage_rows_;
    return {Kv(a_name, a, rows), Kv(b_name, b, rows)};
  }

  int64_t rows_ = 0, stage_rows_ = 0, q_row_ = 0, kv_row_ = 0;
  int32_t heads_q_ = 0;
};

// Runs `call` without the GIL (a graph's first call builds it: cuDNN, up to
// seconds); raises its error.
template <typename F>
void RunCuda(F&& call) {
  absl::Status st;
  {
    py::gil_scoped_release release;
    st = call();
  }
  if (!st.ok()) Raise(st);
}

// One rank's shard attention on the CUDA path for one layout, on its own
// cuDNN handle, graphs and workspace (all made per object, so per step): the
// block-diffusion layouts' path. flashcp.torch runs the causal layouts on the
// long-lived CudaAttentionCache below.
class CudaAttention {
 public:
  CudaAttention(const RankLayout& layout, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
                float scale, uintptr_t stream)
      : check_(layout.rank_plan(), heads_q, heads_kv, head_dim) {
    absl::StatusOr<std::unique_ptr<CudaShardAttention>> a;
    {
      py::gil_scoped_release release;
      a = MakeCudaShardAttention(layout.rank_plan(), heads_q, heads_kv, head_dim, scale, stream);
    }
    impl_ = ValueOrRaise(std::move(a));
  }

  int64_t stage_rows() const { return check_.stage_rows(); }
  std::string fallback_reason() const { return impl_->fallback_reason(); }

  void Forward(Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse, uintptr_t stream,
               uint32_t groups) {
    const CudaShardBuffers b = check_.Forward(q, k, v, ks, vs, o, lse, groups);
    RunCuda([&] { return impl_->Forward(b, stream, groups); });
  }

  // As CpuAttention::Backward: the caller zero-fills dk, dv, dk_stage, dv_stage.
  void Backward(Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse, Buf dout, Buf dq, Buf dk,
                Buf dv, Buf dks, Buf dvs, uintptr_t stream, uint32_t groups) {
    const CudaShardBuffers b =
        check_.Backward(q, k, v, ks, vs, o, lse, dout, dq, dk, dv, dks, dvs, groups);
    RunCuda([&] { return impl_->Backward(b, stream, groups); });
  }

 private:
  CudaBufferCheck check_;
  std::unique_ptr<CudaShardAttention> impl_;
};

// One step's shard groups for a CudaAttentionCache (CudaAttentionCache.describe):
// `tables` (int32, as bytes) go to device memory the caller allocates (a
// torch tensor) and hands over with use_device_tables, which keeps it alive.
class CudaBatch {
 public:
  CudaBatch(std::unique_ptr<CudaShardBatch> batch, CudaBufferCheck check)
      : batch_(std::move(batch)), check_(check) {}

  py::bytes tables() const {
    const std::vector<int32_t>& t = batch_->tables();
    return py::bytes(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(int32_t));
  }
  int64_t table_entries() const { return static_cast<int64_t>(batch_->tables().size()); }
  int64_t stage_rows() const { return check_.stage_rows(); }
  bool ready() const { return ready_ || batch_->tables().empty(); }

  // `tensor`: an int32 CUDA tensor holding tables() (anything with data_ptr()
  // and numel()); held by this object from now on.
  void UseDeviceTables(py::object tensor) {
    const auto address = tensor.attr("data_ptr")().cast<uintptr_t>();
    const auto count = tensor.attr("numel")().cast<int64_t>();
    if (absl::Status s = batch_->UseDeviceTables(address, count); !s.ok()) Raise(s);
    tables_ = std::move(tensor);
    ready_ = true;
  }

  const CudaShardBatch& batch() const { return *batch_; }
  const CudaBufferCheck& check() const { return check_; }

 private:
  std::unique_ptr<CudaShardBatch> batch_;
  CudaBufferCheck check_;
  py::object tables_;  // the device memory the batch reads
  bool ready_ = false;
};

// The long-lived CUDA attention of one device and attention shape
// (cuda_backend.h's CudaAttentionCache): cuDNN handle and graph cache shared by
// every step; per call, cuDNN's workspace from `workspace(nbytes)`, a
// Python callable returning an object with data_ptr() (a torch uint8 tensor
// from torch's caching allocator, made for the call's stream), held until the
// call is enqueued. Calls are serialized by a mutex (autograd's backward
// runs on its own thread), taken after the GIL is released.
class CudaAttentionCacheBinding {
 public:
  CudaAttentionCacheBinding(int32_t heads_q, int32_t heads_kv, int32_t head_dim, float scale,
                            int64_t max_graphs)
      : heads_q_(heads_q), heads_kv_(heads_kv), head_dim_(head_dim) {
    absl::StatusOr<std::unique_ptr<CudaAttentionCache>> a;
    {
      py::gil_scoped_release release;
      a = MakeCudaAttentionCache(heads_q, heads_kv, head_dim, scale, max_graphs);
    }
    impl_ = ValueOrRaise(std::move(a));
  }

  CudaBatch Describe(const RankLayout& layout) {
    std::unique_ptr<CudaShardBatch> b = ValueOrRaise(impl_->Describe(layout.rank_plan()));
    return CudaBatch(std::move(b),
                     CudaBufferCheck(layout.rank_plan(), heads_q_, heads_kv_, head_dim_));
  }

  void Forward(const CudaBatch& batch, Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse,
               uintptr_t stream, uint32_t groups, py::function workspace) {
    Ready(batch);
    const CudaShardBuffers b = batch.check().Forward(q, k, v, ks, vs, o, lse, groups);
    Call(workspace, [&](CudaWorkspaceFn ws) {
      return impl_->Forward(batch.batch(), b, stream, groups, ws);
    });
  }

  // As CpuAttention::Backward: the caller zero-fills dk, dv, dk_stage, dv_stage.
  void Backward(const CudaBatch& batch, Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse,
                Buf dout, Buf dq, Buf dk, Buf dv, Buf dks, Buf dvs, uintptr_t stream,
                uint32_t groups, py::function workspace) {
    Ready(batch);
    const CudaShardBuffers b =
        batch.check().Backward(q, k, v, ks, vs, o, lse, dout, dq, dk, dv, dks, dvs, groups);
    Call(workspace, [&](CudaWorkspaceFn ws) {
      return impl_->Backward(batch.batch(), b, stream, groups, ws);
    });
  }

  std::string fallback_reason() const {
    absl::MutexLock lock(&mu_);
    return impl_->fallback_reason();
  }
  py::dict Stats() const {
    worker::GraphCacheStats s;
    {
      absl::MutexLock lock(&mu_);
      s = impl_->graph_stats();
    }
    py::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["builds"] = s.builds;
    d["rejected"] = s.rejected;
    d["evictions"] = s.evictions;
    d["size"] = s.size;
    d["capacity"] = s.capacity;
    return d;
  }

 private:
  static void Ready(const CudaBatch& batch) {
    if (!batch.ready()) {
      Raise(absl::FailedPreconditionError(
          "CudaBatch: its tables are not on the device (use_device_tables first)"));
    }
  }

  // Runs `call` without the GIL, under the mutex; its workspace requests
  // call `workspace` with the GIL held, and the tensors it returns live
  // until `call` has enqueued its work.
  template <typename F>
  void Call(const py::function& workspace, F&& call) {
    std::vector<py::object> held;
    absl::Status st;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&mu_);
      auto ws = [&](size_t bytes) -> absl::StatusOr<uintptr_t> {
        py::gil_scoped_acquire acquire;
        try {
          py::object t = workspace(bytes);
          const auto address = t.attr("data_ptr")().cast<uintptr_t>();
          held.push_back(std::move(t));
          if (address == 0) {
            return absl::InternalError(absl::StrCat("workspace(", bytes, ") gave address 0"));
          }
          return address;
        } catch (py::error_already_set& e) {
          return absl::ResourceExhaustedError(
              absl::StrCat("workspace(", bytes, " bytes): ", e.what()));
        } catch (const std::exception& e) {
          return absl::InternalError(absl::StrCat("workspace(", bytes, " bytes): ", e.what()));
        }
      };
      st = call(CudaWorkspaceFn(ws));
    }
    held.clear();  // with the GIL: the tensors go back to torch's allocator
    if (!st.ok()) Raise(st);
  }

  int32_t heads_q_, heads_kv_, head_dim_;
  mutable absl::Mutex mu_;
  std::unique_ptr<CudaAttentionCache> impl_;
};

}  // namespace

void BindCuda(py::module_& m) {
  using flashcp::python::CudaAttention;
  m.attr("cuda_built") = flashcp::python::CudaBackendBuilt();
  py::class_<CudaAttention>(m, "CudaAttention")
      .def(py::init<const RankLayout&, int32_t, int32_t, int32_t, float, uintptr_t>(),
           py::arg("layout"), py::arg("heads_q"), py::arg("heads_kv"), py::arg("head_dim"),
           py::arg("scale"), py::arg("stream"))
      .def_property_readonly("stage_rows", &CudaAttention::stage_rows)
      .def_property_readonly("fallback_reason", &CudaAttention::fallback_reason)
      .def("forward", &CudaAttention::Forward)
      .def("backward", &CudaAttention::Backward);
  using flashcp::python::CudaAttentionCacheBinding;
  using flashcp::python::CudaBatch;
  py::class_<CudaBatch>(m, "CudaBatch")
      .def_property_readonly("tables", &CudaBatch::tables)
      .def_property_readonly("table_entries", &CudaBatch::table_entries)
      .def_property_readonly("stage_rows", &CudaBatch::stage_rows)
      .def_property_readonly("ready", &CudaBatch::ready)
      .def("use_device_tables", &CudaBatch::UseDeviceTables, py::arg("tensor"));
  py::class_<CudaAttentionCacheBinding>(m, "CudaAttentionCache")
      .def(py::init<int32_t, int32_t, int32_t, float, int64_t>(), py::arg("heads_q"),
           py::arg("heads_kv"), py::arg("head_dim"), py::arg("scale"), py::arg("max_graphs") = 64)
      .def("describe", &CudaAttentionCacheBinding::Describe, py::arg("layout"))
      .def("forward", &CudaAttentionCacheBinding::Forward)
      .def("backward", &CudaAttentionCacheBinding::Backward)
      .def_property_readonly("fallback_reason", &CudaAttentionCacheBinding::fallback_reason)
      .def_property_readonly("stats", &CudaAttentionCacheBinding::Stats);
  m.attr("CUDA_WHOLE_SHARDS") = flashcp::python::kCudaWholeShards;
  m.attr("CUDA_PREFIXED_SHARDS") = flashcp::python::kCudaPrefixedShards;
}

}  // namespace flashcp::python
