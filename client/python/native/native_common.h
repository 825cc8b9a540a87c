// The _flashcp_native module's shared pieces: the status -> Python
// exception mapping, the (address, count) checks and the plan/layout types
// that the planning, CPU and CUDA bindings use (flashcp_native.cc says what
// the module is). Each Bind* adds one concept's functions and classes to the
// module.
#ifndef FLASHCP_CLIENT_PYTHON_NATIVE_NATIVE_COMMON_H_
#define FLASHCP_CLIENT_PYTHON_NATIVE_NATIVE_COMMON_H_

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
#include "worker/two_level_layout.h"

namespace flashcp::python {

namespace py = pybind11;

[[noreturn]] inline void Raise(const absl::Status& status) {
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
void CheckMapped(const char* name, uintptr_t address, int64_t bytes);

py::bytes Int64Bytes(const std::vector<int64_t>& v);

using ShardTuple = std::tuple<int32_t, int64_t, int64_t, int32_t>;  // doc, start, len, rank
using Segment = std::tuple<int32_t, int64_t, int64_t>;              // peer, first, rows

// block_size > 0: a block-diffusion plan (core/mask.h) of that block size;
// 0: the causal document mask.
core::Plan MakePlan(const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
                    const std::vector<ShardTuple>& shards, int64_t block_size = 0);

// One rank's view of a plan: the exchange layout (worker::CpRankLayout) and
// where every local row comes from in the packed global batch.
class RankLayout {
 public:
  // `group`: a mixed plan's rank group holding `rank` (empty: the whole
  // plan), the scheme run within it (worker::BuildCpRankLayout's). Scheme
  // "two_level": the two-level scheme over `group` with ranks_per_node
  // (worker::BuildTwoLevelRankLayout).
  RankLayout(const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
             const std::vector<ShardTuple>& shards, int32_t rank, const std::string& scheme,
             int64_t block_size, const std::vector<int32_t>& group, int32_t ranks_per_node = 0) {
    plan_ = MakePlan(doc_lens, cp_size, padding, shards, block_size);
    Check(core::ValidatePlan(plan_));
    layout_ = ValueOrRaise(core::BuildCommLayout(plan_));
    if (scheme == "two_level") {
      rank_plan_ = ValueOrRaise(
          worker::BuildTwoLevelRankLayout(plan_, layout_, rank, group, ranks_per_node));
    } else {
      const core::CommScheme s = ValueOrRaise(core::ParseCommScheme(scheme));
      rank_plan_ = ValueOrRaise(worker::BuildCpRankLayout(plan_, layout_, rank, s, group));
    }
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


// planner, plan_hash, pipelines (native_plan.cc).
void BindPlanning(py::module_& m);
// RankLayout and CpuAttention (native_cpu.cc).
void BindCpu(py::module_& m);
// The CUDA attention classes and constants (native_cuda.cc).
void BindCuda(py::module_& m);

}  // namespace flashcp::python

#endif  // FLASHCP_CLIENT_PYTHON_NATIVE_NATIVE_COMMON_H_
