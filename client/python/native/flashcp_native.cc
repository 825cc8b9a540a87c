// _flashcp_native: the Python package's binding to the C++ core (pybind11).
// Thin adapters only: planning is proto::PlanBatch (what the
// service runs), the exchange layout is worker::BuildCpRankLayout (the CPU
// engine's and the GPU step's layout, from core::BuildCommLayout), the attention is the CPU
// kernels of worker/attention_cpu.h, or on CUDA tensors the project's cuDNN
// path (cuda_backend.h). Tensors cross as (address, element count) pairs that
// the Python side takes from contiguous torch tensors; every count is checked
// here against what the layout needs before a kernel touches memory. Errors:
// ValueError for InvalidArgument, NotImplementedError for Unimplemented (a
// build without CUDA), RuntimeError naming the status code otherwise.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <thread>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/python/native/cuda_backend.h"
#include "core/analysis.h"
#include "core/global_batch.h"
#include "core/strategies.h"
#include "core/plan_hash.h"
#include "core/pipeline.h"
#include "core/pipeline_json.h"
#include "core/types.h"
#include "flashcp/v1/planner.pb.h"
#include "core/clock.h"
#include "core/cost_model.h"
#include "proto/convert.h"
#include "proto/plan_batch.h"
#include "worker/attention_cpu.h"
#include "worker/attention_masked_cpu.h"
#include "worker/cp_layout.h"
#include "worker/thread_pool.h"

namespace py = pybind11;

namespace flashcp::python {
namespace {

[[noreturn]] void Raise(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    throw py::value_error(std::string(status.message()));
  }
  if (status.code() == absl::StatusCode::kUnimplemented) {
    PyErr_SetString(PyExc_NotImplementedError, std::string(status.message()).c_str());
    throw py::error_already_set();
  }
  throw std::runtime_error(absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                                        status.message()));
}

template <typename T>
T ValueOrRaise(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// InvalidArgument unless [address, address + bytes) is float-aligned and
// mapped in this process (mincore: ENOMEM for an unmapped page), so that a
// bad (address, count) pair raises instead of crashing the interpreter. A
// mapped but read-only range is not detected.
void CheckMapped(const char* name, uintptr_t address, int64_t bytes) {
  if (bytes <= 0) return;
  if (address % alignof(float) != 0) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat(name, ": address 0x", absl::Hex(address), " is not float-aligned")));
  }
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = address & ~(page - 1);
  if (address + static_cast<uintptr_t>(bytes) < address) {
    Raise(absl::InvalidArgumentError(absl::StrCat(name, ": address range wraps around")));
  }
  const uintptr_t end = address + static_cast<uintptr_t>(bytes);
  std::vector<unsigned char> pages((end - first + page - 1) / page);
  if (mincore(reinterpret_cast<void*>(first), end - first, pages.data()) != 0) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        name, ": ", bytes, " bytes at address 0x", absl::Hex(address),
        " are not mapped in this process (not a live tensor's data_ptr())")));
  }
}

// The `ilp` strategy's solver in this module: the ILP links CBC, which the
// extension does not (core, proto and the engine only), so `ilp` plans where
// it does.
absl::StatusOr<core::Plan> IlpNotInProcess(const core::Batch&, const core::IlpOptions&,
                                           const core::StopToken&, core::PlanInfo*) {
  return absl::FailedPreconditionError(
      "strategy: ilp is not planned in process (the Python extension links no CBC): plan it "
      "with the planner service (flashcp-planner --allow_ilp; flashcp.Client(address).plan("
      "..., \"ilp\")) or with flashcp-plan --strategy ilp");
}

// A serialized flashcp.v1.PlanRequest in, a serialized PlanResponse out, in
// process, through the service's own steps: validation
// (proto::RequestFromProto under `limits`), the plan's bounds
// (CheckPlanBounds under `bounds`), planning (PlanBatch) and a checked
// serialization (SerializeResponse). flashcp.plan passes the service's
// defaults (ServiceBounds below) unless its caller overrides them; named cost
// profiles plan with their shipped coefficients (calibration lives in a
// planner). Planning runs with the GIL released and stops at its next check
// (core::StopToken) once a signal handler has raised (Ctrl-C: the
// KeyboardInterrupt propagates) or `timeout_seconds` (> 0) has passed
// (DEADLINE_EXCEEDED). `ilp`: FAILED_PRECONDITION (IlpNotInProcess).
py::bytes Plan(const std::string& request_bytes, int64_t max_docs, int64_t max_tokens,
               int32_t max_cp_size, int64_t max_shard_ranks, int64_t max_response_bytes,
               double timeout_seconds) {
  v1::PlanRequest request;
  if (!request.ParseFromString(request_bytes)) {
    Raise(absl::InvalidArgumentError("request: not a serialized flashcp.v1.PlanRequest"));
  }
  if (!(timeout_seconds >= 0) || !std::isfinite(timeout_seconds)) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("timeout: must be a finite number of seconds >= 0, got ", timeout_seconds)));
  }
  const core::BatchLimits limits{max_docs, max_tokens, max_cp_size};
  proto::PlanInput input = ValueOrRaise(proto::RequestFromProto(request, limits));
  ValueOrRaise(proto::CheckPlanBounds(
      input, proto::PlanBounds{max_shard_ranks, max_response_bytes}));
  input.options.ilp.solver = IlpNotInProcess;
  proto::NullPlanObserver observer;
  const core::RealClock clock;  // metrics.planning_seconds, as the service reports it
  const absl::Time start = clock.Now();
  const absl::Duration timeout = absl::Seconds(timeout_seconds);
  // The stop check runs on the planning threads; signals are checked (the
  // GIL taken) at most every 20 ms, on the calling thread only.
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> interrupted{false};
  absl::Time last_signal_check = start;
  input.options.stop = core::StopToken([&]() -> absl::Status {
    if (interrupted.load()) return absl::CancelledError("flashcp.plan: interrupted");
    const absl::Time now = clock.Now();
    if (timeout_seconds > 0 && now - start >= timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "flashcp.plan: no plan within the timeout of ", timeout_seconds, " s"));
    }
    if (std::this_thread::get_id() == caller && now - last_signal_check >= absl::Milliseconds(20)) {
      last_signal_check = now;
      py::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) {  // the handler's exception stays set
        interrupted.store(true);
        return absl::CancelledError("flashcp.plan: interrupted");
      }
    }
    return absl::OkStatus();
  });
  absl::StatusOr<std::string> out;
  {
    py::gil_scoped_release release;  // planning may take a while
    absl::StatusOr<v1::PlanResponse> response =
        proto::PlanBatch(input, clock, observer);
    out = response.ok() ? proto::SerializeResponse(*response) : response.status();
  }
  if (interrupted.load()) throw py::error_already_set();  // KeyboardInterrupt, usually
  return py::bytes(ValueOrRaise(std::move(out)));
}

// The service's default bounds (kDefaultBatchLimits, PlanBounds{}), by the
// names Plan takes them.
py::dict ServiceBounds() {
  const core::BatchLimits limits = proto::kDefaultBatchLimits;
  const proto::PlanBounds bounds;
  py::dict d;
  d["max_docs"] = limits.max_docs;
  d["max_tokens"] = limits.max_tokens;
  d["max_cp_size"] = limits.max_cp_size;
  d["max_shard_ranks"] = bounds.max_shard_ranks;
  d["max_response_bytes"] = bounds.max_response_bytes;
  return d;
}

// A pipeline plan (core/pipeline.h) in process, as flashcp-plan --pipeline's
// JSON line (core/pipeline_json.h). Zeros take the request's documented
// defaults. Checkpointing is the planner's greedy one (ckpt_solver "greedy"
// for the DPP strategies): the checkpoint ILP links CBC, which the extension
// does not; the planner service's PlanPipeline and flashcp-plan --pipeline
// run it.
std::string PlanPipeline(const std::vector<int64_t>& doc_lens, int32_t pp_size,
                         const std::string& strategy, int32_t sp_size, double memory_budget_bytes,
                         int32_t layers, int32_t hidden, int32_t kv_hidden, int32_t ffn_hidden,
                         int32_t vocab, const std::string& profile, int32_t slice_count,
                         const std::map<std::string, double>& coefficients) {
  core::PipelineRequest r;
  r.doc_lens = doc_lens;
  r.pp_size = pp_size;
  if (sp_size != 0) r.sp_size = sp_size;
  if (memory_budget_bytes != 0) r.memory_budget_bytes = memory_budget_bytes;
  if (layers != 0) r.model.layers = layers;
  if (hidden != 0) r.model.hidden = hidden;
  if (kv_hidden != 0) r.model.kv_hidden = kv_hidden;
  if (ffn_hidden != 0) r.model.ffn_hidden = ffn_hidden;
  if (vocab != 0) r.model.vocab = vocab;
  r.profile = ValueOrRaise(core::NamedPipelineProfile(
      profile.empty() ? std::string(core::kDefaultPipelineProfile) : profile));
  for (const auto& [name, value] : coefficients) {
    if (absl::Status s = core::SetPipelineCoefficient(r.profile, name, value); !s.ok()) Raise(s);
  }
  core::PipelineOptions o;
  if (!strategy.empty()) o.strategy = ValueOrRaise(core::ParsePipelineStrategy(strategy));
  o.slice_count = slice_count;
  o.ckpt_solver = nullptr;  // greedy checkpointing: no CBC in the extension
  std::string out;
  {
    py::gil_scoped_release release;  // the K search may take a while
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<core::PipelinePlan> plan = core::PlanPipeline(r, o);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!plan.ok()) {
      py::gil_scoped_acquire acquire;
      Raise(plan.status());
    }
    out = core::PipelinePlanToJson(*plan, 0, seconds);
  }
  return out;
}

// Per stage, one pipeline's op order as (chunk, backward) pairs
// (core::PipelineStageOrder): what flashcp.torch.pipeline runs.
std::vector<std::vector<std::pair<int32_t, bool>>> PipelineStageOrder(
    int32_t pp_size, const std::vector<int32_t>& forward, const std::vector<int32_t>& backward) {
  if (pp_size < 1 || forward.size() != backward.size()) {
    throw py::value_error("pipeline_stage_order: pp_size must be >= 1 and backward a permutation of forward");
  }
  std::vector<int32_t> f = forward, b = backward;
  std::sort(f.begin(), f.end());
  std::sort(b.begin(), b.end());
  if (f != b || (!f.empty() && f.front() < 0)) {
    throw py::value_error("pipeline_stage_order: backward must be a permutation of forward");
  }
  std::vector<std::vector<std::pair<int32_t, bool>>> out(pp_size);
  const auto orders = core::PipelineStageOrder(pp_size, core::PipelineGroup{forward, backward});
  for (int32_t p = 0; p < pp_size; ++p) {
    for (const core::PipelineOp& op : orders[p]) out[p].emplace_back(op.chunk, op.backward);
  }
  return out;
}

py::bytes Int64Bytes(const std::vector<int64_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

using ShardTuple = std::tuple<int32_t, int64_t, int64_t, int32_t>;  // doc, start, len, rank
using Segment = std::tuple<int32_t, int64_t, int64_t>;              // peer, first, rows

// block_size > 0: a block-diffusion plan (core/mask.h) of that block size;
// 0: the causal document mask.
core::Plan MakePlan(const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
                    const std::vector<ShardTuple>& shards, int64_t block_size = 0) {
  core::Plan plan;
  if (block_size != 0) plan.mask = {core::MaskKind::kBlockDiffusion, block_size};
  plan.cp_size = cp_size;
  plan.doc_lens = doc_lens;
  plan.padding = padding;
  plan.shards.reserve(shards.size());
  for (const auto& [doc, start, len, rank] : shards) {
    plan.shards.push_back(core::Shard{doc, start, len, rank});
  }
  return plan;
}

// One rank's view of a plan: the exchange layout (worker::CpRankLayout) and
// where every local row comes from in the packed global batch.
class RankLayout {
 public:
  // `group`: a mixed plan's rank group holding `rank` (empty: the whole
  // plan), the scheme run within it (worker::BuildCpRankLayout's).
  RankLayout(const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
             const std::vector<ShardTuple>& shards, int32_t rank, const std::string& scheme,
             int64_t block_size, const std::vector<int32_t>& group) {
    plan_ = MakePlan(doc_lens, cp_size, padding, shards, block_size);
    Check(core::ValidatePlan(plan_));
    const core::CommScheme s = ValueOrRaise(core::ParseCommScheme(scheme));
    layout_ = ValueOrRaise(core::BuildCommLayout(plan_));
    rank_plan_ = ValueOrRaise(worker::BuildCpRankLayout(plan_, layout_, rank, s, group));
    total_ = core::TotalTokens(plan_.doc_lens);
    doc_first_.assign(plan_.doc_lens.size(), 0);
    for (size_t d = 1; d < plan_.doc_lens.size(); ++d) {
      doc_first_[d] = doc_first_[d - 1] + plan_.doc_lens[d - 1];
    }
  }

  const worker::CpRankLayout& rank_plan() const { return rank_plan_; }
  int32_t rank() const { return rank_plan_.rank; }
  int32_t size() const { return rank_plan_.size; }
  int64_t local_rows() const { return rank_plan_.local_rows; }
  int64_t total_tokens() const { return total_; }

  // Per local row of rank `r`: its token's index in the packed global batch
  // [total real tokens, then the `padding` padding tokens]; the padding row of
  // a rank (the last row of each of the last `padding` ranks) is
  // total + (r - (N - padding)).
  std::vector<int64_t> GlobalRows(int32_t r) const {
    CheckRank(r);
    std::vector<int64_t> rows(rank_plan_.local_rows, -1);
    const core::RankLayout& rl = layout_.ranks[r];
    for (size_t i = 0; i < rl.shards.size(); ++i) {
      const core::Shard& s = plan_.shards[rl.shards[i]];
      for (int64_t t = 0; t < s.len; ++t) rows[rl.shard_offset[i] + t] = doc_first_[s.doc] + s.start + t;
    }
    const int32_t n = plan_.cp_size;
    if (r >= n - plan_.padding) rows.back() = total_ + (r - (n - plan_.padding));
    return rows;
  }

  // Per local row of this rank: the token's position within its document
  // (0 for a padding row).
  std::vector<int64_t> Positions() const {
    std::vector<int64_t> pos(rank_plan_.local_rows, 0);
    for (const Segment3& s : Segments()) {
      for (int64_t t = 0; t < std::get<2>(s); ++t) pos[std::get<0>(s) + t] = std::get<1>(s) + t;
    }
    return pos;
  }

  // This rank's shards in local order: (first local row, start in document, len, doc).
  using Segment3 = std::tuple<int64_t, int64_t, int64_t, int32_t>;
  std::vector<Segment3> Segments() const {
    std::vector<Segment3> out;
    const core::RankLayout& rl = layout_.ranks[rank_plan_.rank];
    for (size_t i = 0; i < rl.shards.size(); ++i) {
      const core::Shard& s = plan_.shards[rl.shards[i]];
      out.emplace_back(rl.shard_offset[i], s.start, s.len, s.doc);
    }
    return out;
  }

  static std::vector<Segment> Segs(const std::vector<worker::RowSegment>& v) {
    std::vector<Segment> out;
    for (const worker::RowSegment& s : v) out.emplace_back(s.peer, s.first, s.rows);
    return out;
  }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) Raise(s);
  }
  void CheckRank(int32_t r) const {
    if (r < 0 || r >= plan_.cp_size) {
      Raise(absl::InvalidArgumentError(absl::StrCat("rank ", r, " outside [0, ", plan_.cp_size, ")")));
    }
  }

  core::Plan plan_;
  core::CommLayout layout_;
  worker::CpRankLayout rank_plan_;
  int64_t total_ = 0;
  std::vector<int64_t> doc_first_;
};

// (address, element count) of a contiguous float32 buffer.
using Buf = std::pair<uintptr_t, int64_t>;

// Document-masked attention of one rank's shards on the CPU kernels, in the
// layout's two groups: whole shards (keys = their own local rows of k, v) and
// prefixed shards (keys = their staged rows [prefix pieces, own rows] in the
// stage buffers, consecutive in layout order). Q and KV heads are equal here
// (the Python side repeats KV heads for GQA before staging).
class CpuAttention {
 public:
  CpuAttention(const RankLayout& layout, int32_t heads, int32_t head_dim, float scale, int threads)
      : pool_(ValueOrRaise(worker::ThreadPool::Create(threads))) {
    shape_ = worker::AttentionShape{heads, head_dim, scale};
    if (heads < 1 || head_dim < 1 || !(scale > 0.0f)) {
      Raise(absl::InvalidArgumentError(absl::StrCat("shape: heads ", heads, ", head_dim ", head_dim,
                                                    ", scale ", scale, " (each must be positive)")));
    }
    const worker::CpRankLayout& p = layout.rank_plan();
    if (p.block_size > 0) masked_ = p;  // block diffusion: the masked kernel on staged rows
    rows_ = worker::AttentionRows(p);  // all_to_all: the head-parallel rows
    stage_rows_ = static_cast<int64_t>(p.stage_src.size());
    for (size_t i = 0; i < p.whole_start.size(); ++i) {
      whole_.push_back({p.whole_start[i], p.whole_len[i]});
    }
    int64_t at = 0;
    for (size_t i = 0; i < p.prefix_q_start.size(); ++i) {
      prefix_.push_back({p.prefix_q_start[i], p.prefix_q_len[i], p.prefix_kv_len[i], at});
      at += p.prefix_kv_len[i];
    }
  }

  int64_t stage_rows() const { return stage_rows_; }

  void Forward(Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse) {
    CheckForwardBuffers(q, k, v, ks, vs, o, lse);
    absl::Status st;
    if (masked_.block_size > 0) {
      const std::vector<worker::MaskedShardAttention> shards =
          worker::MaskedStagedShards(masked_, F(ks), F(vs), nullptr, nullptr, RowFloats());
      py::gil_scoped_release release;
      st = worker::MaskedAttentionForwardCpu(shape_, masked_.block_size, shards, rows_, F(q),
                                             F(o), F(lse), *pool_);
    } else {
      const std::vector<worker::DocAttention> docs = Docs(k, v, ks, vs, {}, {}, {}, {});
      py::gil_scoped_release release;
      st = worker::AttentionForwardCpu(shape_, docs, rows_, F(q), F(o), F(lse), *pool_);
    }
    if (!st.ok()) Raise(st);
  }

  // dk, dv ([local rows]) receive the whole shards' key gradients; dks, dvs
  // ([stage rows]) the staged keys'. Every output is overwritten where the
  // layout names it; the caller zero-fills (rows no shard names stay as given).
  void Backward(Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse, Buf dout, Buf dq, Buf dk,
                Buf dv, Buf dks, Buf dvs) {
    CheckForwardBuffers(q, k, v, ks, vs, o, lse);
    CheckRows("dout", dout, rows_);
    CheckRows("dq", dq, rows_);
    CheckRows("dk", dk, rows_);
    CheckRows("dv", dv, rows_);
    CheckRows("dk_stage", dks, stage_rows_);
    CheckRows("dv_stage", dvs, stage_rows_);
    absl::Status st;
    if (masked_.block_size > 0) {
      const std::vector<worker::MaskedShardAttention> shards =
          worker::MaskedStagedShards(masked_, F(ks), F(vs), F(dks), F(dvs), RowFloats());
      py::gil_scoped_release release;
      st = worker::MaskedAttentionBackwardCpu(shape_, masked_.block_size, shards, rows_, F(q),
                                              F(o), F(lse), F(dout), F(dq), *pool_);
    } else {
      const std::vector<worker::DocAttention> docs = Docs(k, v, ks, vs, dk, dv, dks, dvs);
      py::gil_scoped_release release;
      st = worker::AttentionBackwardCpu(shape_, docs, rows_, F(q), F(o), F(lse), F(dout), F(dq),
                                        *pool_);
    }
    if (!st.ok()) Raise(st);
  }

 private:
  struct Whole {
    int64_t row, len;
  };

  // The sizes of what Forward takes (Backward takes them too).
  void CheckForwardBuffers(Buf q, Buf k, Buf v, Buf ks, Buf vs, Buf o, Buf lse) const {
    CheckRows("q", q, rows_);
    CheckRows("k", k, rows_);
    CheckRows("v", v, rows_);
    CheckRows("k_stage", ks, stage_rows_);
    CheckRows("v_stage", vs, stage_rows_);
    CheckRows("o", o, rows_);
    CheckCount("lse", lse, rows_ * shape_.heads);
  }
  struct Prefixed {
    int64_t q_row, q_len, kv_len, stage_row;
  };

  static float* F(Buf b) { return reinterpret_cast<float*>(b.first); }
  int64_t RowFloats() const { return int64_t{shape_.heads} * shape_.head_dim; }
  void CheckCount(const char* name, Buf b, int64_t want) const {
    if (b.second != want || (want > 0 && b.first == 0)) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat(name, ": ", b.second, " elements, expected ", want)));
    }
    CheckMapped(name, b.first, want * static_cast<int64_t>(sizeof(float)));
  }
  void CheckRows(const char* name, Buf b, int64_t rows) const {
    CheckCount(name, b, rows * RowFloats());
  }

  std::vector<worker::DocAttention> Docs(Buf k, Buf v, Buf ks, Buf vs, Buf dk, Buf dv, Buf dks,
                                         Buf dvs) const {
    const int64_t e = RowFloats();
    auto at = [e](Buf b, int64_t row) { return b.first ? F(b) + row * e : nullptr; };
    std::vector<worker::DocAttention> docs;
    docs.reserve(whole_.size() + prefix_.size());
    for (const Whole& w : whole_) {
      docs.push_back(worker::DocAttention{at(k, w.row), at(v, w.row), w.len, {{w.row, 0, w.len}},
                                          at(dk, w.row), at(dv, w.row)});
    }
    for (const Prefixed& p : prefix_) {
      docs.push_back(worker::DocAttention{at(ks, p.stage_row), at(vs, p.stage_row), p.kv_len,
                                          {{p.q_row, p.kv_len - p.q_len, p.q_len}},
                                          at(dks, p.stage_row), at(dvs, p.stage_row)});
    }
    return docs;
  }

  worker::AttentionShape shape_;
  std::unique_ptr<worker::ThreadPool> pool_;
  worker::CpRankLayout masked_;  // block_size 0 unless the plan is block diffusion
  int64_t rows_ = 0, stage_rows_ = 0;
  std::vector<Whole> whole_;
  std::vector<Prefixed> prefix_;
};

// The CUDA calls' buffers of one layout (bf16 device buffers, the layout's
// two shard groups as in CpuAttention, KV heads as they are: cuDNN's GQA),
// each (address, count) checked for its size.
class CudaBufferCheck {
 public:
  CudaBufferCheck(const worker::CpRankLayout& p, int32_t heads_q, int32_t heads_kv,
                  int32_t head_dim)
      : rows_(p.local_rows),
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
}  // namespace flashcp::python

PYBIND11_MODULE(_flashcp_native, m) {
  using flashcp::python::CpuAttention;
  using flashcp::python::Int64Bytes;
  using flashcp::python::RankLayout;
  m.doc() = "FlashCP's C++ core for the flashcp Python package (planner, layout, CPU attention)";
  m.def("plan", &flashcp::python::Plan, py::arg("request"), py::arg("max_docs"),
        py::arg("max_tokens"), py::arg("max_cp_size"), py::arg("max_shard_ranks"),
        py::arg("max_response_bytes"), py::arg("timeout") = 0.0,
        "Serialized flashcp.v1.PlanRequest -> serialized PlanResponse (the service's "
        "validation, bounds and PlanBatch, under the bounds given); Ctrl-C and timeout stop it");
  m.def("service_bounds", &flashcp::python::ServiceBounds,
        "The planner service's default bounds, as plan() takes them");
  m.def(
      "plan_hash",
      [](const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
         const std::vector<flashcp::python::ShardTuple>& shards, int64_t block_size) {
        return flashcp::core::PlanHashHex(flashcp::core::PlanHash(
            flashcp::python::MakePlan(doc_lens, cp_size, padding, shards, block_size)));
      },
      py::arg("doc_lens"), py::arg("cp_size"), py::arg("padding"), py::arg("shards"),
      py::arg("block_size") = 0,
      "core::PlanHash as PlanResponse.plan_hash writes it (16 hex digits); shards as "
      "(doc, start, len, rank)");
  m.attr("planner_version") = std::string(flashcp::core::PlannerVersion());
  m.def(
      "plan_rank_features",
      [](const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
         const std::vector<flashcp::python::ShardTuple>& shards) {
        const flashcp::core::Plan plan =
            flashcp::python::MakePlan(doc_lens, cp_size, padding, shards);
        if (absl::Status s = flashcp::core::ValidatePlan(plan); !s.ok()) flashcp::python::Raise(s);
        std::vector<std::tuple<double, double, double, double>> out;
        for (const flashcp::core::RankFeatures& f : flashcp::core::PlanRankFeatures(plan)) {
          out.emplace_back(f.whole_pairs, f.prefixed_pairs, f.sequences, f.tokens);
        }
        return out;
      },
      py::arg("doc_lens"), py::arg("cp_size"), py::arg("padding"), py::arg("shards"),
      "core::PlanRankFeatures of a valid plan (ValueError naming the field otherwise): per "
      "rank (whole_pairs, prefixed_pairs, sequences, tokens), ReportStepTimes' features");
m.def("plan_pipeline", &flashcp::python::PlanPipeline, py::arg("doc_lens"), py::arg("pp_size"),
        py::arg("strategy"), py::arg("sp_size"), py::arg("memory_budget_bytes"),
        py::arg("layers"), py::arg("hidden"), py::arg("kv_hidden"), py::arg("ffn_hidden"),
        py::arg("vocab"), py::arg("profile"), py::arg("slice_count"),
        py::arg("coefficients") = std::map<std::string, double>{},
        "A pipeline plan (core/pipeline.h) as flashcp-plan --pipeline's JSON line, with the "
        "greedy checkpointing (no CBC in process)");
  m.def(
      "plan_global_batch",
      [](const std::vector<int64_t>& doc_lens, int32_t dp_size, int32_t cp_size, int64_t context,
         const std::string& strategy) {
        namespace core = flashcp::core;
        core::GlobalBatchOptions o;
        o.dp_size = dp_size;
        o.cp_size = cp_size;
        o.context = context;
        o.strategy = flashcp::python::ValueOrRaise(core::ParseStrategy(strategy));
        absl::StatusOr<core::GlobalBatchPlan> g;
        {
          py::gil_scoped_release release;
          g = core::PlanGlobalBatch(doc_lens, o);
        }
        const core::GlobalBatchPlan plan = flashcp::python::ValueOrRaise(std::move(g));
        py::list replicas;
        for (const core::ReplicaBatch& r : plan.replicas) {
          std::vector<std::tuple<int32_t, int64_t, int64_t, int32_t>> shards;
          for (const core::Shard& s : r.plan.shards) shards.emplace_back(s.doc, s.start, s.len, s.rank);
          py::dict d;
          d["pieces"] = r.pieces;
          d["doc_lens"] = r.doc_lens;
          d["workload"] = r.workload;
          d["padding"] = r.plan.padding;
          d["shards"] = shards;
          replicas.append(d);
        }
        py::dict out;
        out["piece_lens"] = plan.pieces.lens;
        out["piece_doc"] = plan.pieces.doc;
        out["imbalance"] = plan.imbalance;
        out["first_fit_imbalance"] = plan.first_fit_imbalance;
        out["replicas"] = replicas;
        return out;
      },
      py::arg("doc_lens"), py::arg("dp_size"), py::arg("cp_size"), py::arg("context"),
      py::arg("strategy"),
      "core::PlanGlobalBatch: which pieces each DP replica packs and its CP plan (dict)");
  m.def("pipeline_stage_order", &flashcp::python::PipelineStageOrder, py::arg("pp_size"),
        py::arg("forward"), py::arg("backward"),
        "Per stage, one pipeline's 1F1B op order as (chunk, backward) pairs");
  py::class_<RankLayout>(m, "RankLayout")
      .def(py::init<const std::vector<int64_t>&, int32_t, int64_t,
                    const std::vector<flashcp::python::ShardTuple>&, int32_t, const std::string&,
                    int64_t, const std::vector<int32_t>&>(),
           py::arg("doc_lens"), py::arg("cp_size"), py::arg("padding"), py::arg("shards"),
           py::arg("rank"), py::arg("scheme"), py::arg("block_size") = 0,
           py::arg("group") = std::vector<int32_t>{})
      .def_property_readonly("rank", &RankLayout::rank)
      .def_property_readonly("size", &RankLayout::size)
      .def_property_readonly("local_rows", &RankLayout::local_rows)
      .def_property_readonly("total_tokens", &RankLayout::total_tokens)
      .def_property_readonly("all_gather", [](const RankLayout& l) {
        return l.rank_plan().collective == flashcp::worker::Collective::kAllGather;
      })
      .def_property_readonly("calls_exchange",
                             [](const RankLayout& l) { return flashcp::worker::CallsExchange(l.rank_plan()); })
      .def_property_readonly("block_rows", [](const RankLayout& l) { return l.rank_plan().block_rows; })
      .def_property_readonly("recv_rows", [](const RankLayout& l) { return l.rank_plan().recv_rows; })
      .def_property_readonly("back_first", [](const RankLayout& l) { return l.rank_plan().back_first; })
      .def_property_readonly("back_rows", [](const RankLayout& l) { return l.rank_plan().back_rows; })
      .def_property_readonly("pack_rows",
                             [](const RankLayout& l) { return Int64Bytes(l.rank_plan().pack_rows); })
      .def_property_readonly("stage_src",
                             [](const RankLayout& l) { return Int64Bytes(l.rank_plan().stage_src); })
      .def_property_readonly("sends", [](const RankLayout& l) { return RankLayout::Segs(l.rank_plan().sends); })
      .def_property_readonly("recvs", [](const RankLayout& l) { return RankLayout::Segs(l.rank_plan().recvs); })
      .def("global_rows", [](const RankLayout& l, int32_t r) { return Int64Bytes(l.GlobalRows(r)); },
           py::arg("rank"))
      .def("positions", [](const RankLayout& l) { return Int64Bytes(l.Positions()); })
      .def("segments", &RankLayout::Segments)
      // all_to_all (worker/a2a_layout.h): the group, this rank's position,
      // per position its real rows and first gathered row, the head-parallel
      // rows S and doc_row (gathered row -> head-parallel row, int64 bytes).
      .def_property_readonly("all_to_all", [](const RankLayout& l) {
        return l.rank_plan().collective == flashcp::worker::Collective::kAllToAll;
      })
      .def_property_readonly("a2a_group", [](const RankLayout& l) { return l.rank_plan().a2a.group; })
      .def_property_readonly("a2a_position", [](const RankLayout& l) { return l.rank_plan().a2a.position; })
      .def_property_readonly("a2a_tokens", [](const RankLayout& l) { return l.rank_plan().a2a.tokens; })
      .def_property_readonly("a2a_first", [](const RankLayout& l) { return l.rank_plan().a2a.first; })
      .def_property_readonly("a2a_rows", [](const RankLayout& l) { return l.rank_plan().a2a.rows; })
      .def_property_readonly("a2a_doc_row",
                             [](const RankLayout& l) { return Int64Bytes(l.rank_plan().a2a.doc_row); })
      .def(
          "a2a_heads",
          [](const RankLayout& l, int32_t query_heads, int32_t kv_heads, int32_t head_dim) {
            const flashcp::core::AllToAllHeads h = flashcp::python::ValueOrRaise(
                flashcp::worker::AllToAllLayoutHeads(l.rank_plan().a2a, query_heads, kv_heads,
                                                     head_dim));
            std::vector<std::tuple<int32_t, int32_t, int32_t, int32_t>> out;
            for (size_t j = 0; j < h.query.size(); ++j) {
              out.emplace_back(h.query[j].first, h.query[j].count, h.kv[j].first, h.kv[j].count);
            }
            return out;
          },
          py::arg("query_heads"), py::arg("kv_heads"), py::arg("head_dim"),
          "Per position of the group: (first query head, query heads, first KV head, KV heads) "
          "(core::AllToAllGroupHeads; RuntimeError FAILED_PRECONDITION naming query_heads where "
          "the group's size does not divide Hq)");
  py::class_<CpuAttention>(m, "CpuAttention")
      .def(py::init<const RankLayout&, int32_t, int32_t, float, int>(), py::arg("layout"),
           py::arg("heads"), py::arg("head_dim"), py::arg("scale"), py::arg("threads"))
      .def_property_readonly("stage_rows", &CpuAttention::stage_rows)
      .def("forward", &CpuAttention::Forward)
      .def("backward", &CpuAttention::Backward);
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
