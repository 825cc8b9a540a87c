// _flashcp_engine_bench: the CPU engine (worker::CpAttentionStep over a Gloo
// communicator) callable from Python, so that bench/torch_attention_bench.py
// times flashcp.torch.attention() and the engine on the same plan, the same
// inputs and the same processes. A benchmark tool, not part of the package.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/analysis.h"
#include "core/types.h"
#include "gloo/rendezvous/file_store.h"
#include "worker/engine.h"
#include "worker/gloo_communicator.h"
#include "worker/thread_pool.h"

namespace py = pybind11;

namespace flashcp::bench {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) throw std::runtime_error(std::string(s.ToString()));
}

using ShardTuple = std::tuple<int32_t, int64_t, int64_t, int32_t>;
using Buf = std::pair<uintptr_t, int64_t>;  // (address, float count)

absl::Span<const float> In(Buf b) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(b.first), b.second);
}
absl::Span<float> Out(Buf b) { return absl::MakeSpan(reinterpret_cast<float*>(b.first), b.second); }

class EngineStep {
 public:
  EngineStep(const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
             const std::vector<ShardTuple>& shards, int32_t rank, const std::string& scheme,
             int32_t heads, int32_t head_dim, float scale, int threads)
      : pool_(threads) {
    core::Plan plan;
    plan.cp_size = cp_size;
    plan.doc_lens = doc_lens;
    plan.padding = padding;
    for (const auto& [doc, start, len, r] : shards) plan.shards.push_back({doc, start, len, r});
    absl::StatusOr<core::CommScheme> s = core::ParseCommScheme(scheme);
    Check(s.status());
    absl::StatusOr<worker::CpAttentionStep> step =
        worker::CpAttentionStep::Create(plan, rank, {heads, head_dim, scale}, *s);
    Check(step.status());
    step_ = std::make_unique<worker::CpAttentionStep>(*std::move(step));
    rank_ = rank;
    size_ = cp_size;
  }

  int64_t local_rows() const { return step_->local_rows(); }

  // Joins the group through a FileStore in `dir` (shared by the ranks).
  void Connect(const std::string& dir, double timeout_s) {
    worker::IgnoreSigpipe();  // this process is the benchmark's (see gloo_communicator.h)
    gloo::rendezvous::FileStore store(dir);
    worker::GlooOptions options;
    options.timeout = absl::Seconds(timeout_s);
    py::gil_scoped_release release;
    absl::StatusOr<std::unique_ptr<worker::Communicator>> comm =
        worker::ConnectGloo(store, rank_, size_, options);
    Check(comm.status());
    comm_ = *std::move(comm);
  }

  void Barrier() {
    py::gil_scoped_release release;
    Check(comm_->Barrier());
  }

  // Forward then backward; returns the wall seconds of the two.
  double Step(Buf q, Buf k, Buf v, Buf dout, Buf o, Buf lse, Buf dq, Buf dk, Buf dv) {
    py::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    Check(step_->Forward(*comm_, pool_, In(q), In(k), In(v), Out(o), Out(lse)));
    Check(step_->Backward(*comm_, pool_, In(dout), Out(dq), Out(dk), Out(dv)));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  worker::ThreadPool pool_;
  std::unique_ptr<worker::CpAttentionStep> step_;
  std::unique_ptr<worker::Communicator> comm_;
  int32_t rank_ = 0, size_ = 1;
};

}  // namespace
}  // namespace flashcp::bench

PYBIND11_MODULE(_flashcp_engine_bench, m) {
  using flashcp::bench::EngineStep;
  py::class_<EngineStep>(m, "EngineStep")
      .def(py::init<const std::vector<int64_t>&, int32_t, int64_t,
                    const std::vector<flashcp::bench::ShardTuple>&, int32_t, const std::string&,
                    int32_t, int32_t, float, int>())
      .def_property_readonly("local_rows", &EngineStep::local_rows)
      .def("connect", &EngineStep::Connect)
      .def("barrier", &EngineStep::Barrier)
      .def("step", &EngineStep::Step);
}
