// The CPU bindings: RankLayout (the exchange layout) and CpuAttention.
#include "client/python/native/native_common.h"
#include "core/rank_groups.h"

namespace flashcp::python {
namespace {

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

// core::GroupedSchemeBytes of a mixed plan: `groups` as (ranks, scheme)
// with scheme "targeted", "allgather", "full_kv", "all_to_all" or
// "two_level". Per rank: sent and received bytes (forward plus backward)
// and one phase's bytes to and from other nodes.
py::dict GroupedSchemeBytes(const std::vector<int64_t>& doc_lens, int32_t cp_size, int64_t padding,
                            const std::vector<ShardTuple>& shards,
                            const std::vector<std::pair<std::vector<int32_t>, std::string>>& groups,
                            int32_t heads, int32_t query_heads, int32_t head_dim,
                            int32_t dtype_bytes, int32_t ranks_per_node) {
  const core::Plan plan = MakePlan(doc_lens, cp_size, padding, shards);
  if (absl::Status st = core::ValidatePlan(plan); !st.ok()) Raise(st);
  core::ModelShape shape;
  shape.heads = heads;
  shape.query_heads = query_heads;
  shape.head_dim = head_dim;
  shape.dtype_bytes = dtype_bytes;
  std::vector<core::RankGroup> rank_groups;
  for (const auto& [ranks, scheme] : groups) {
    core::RankGroup g{ranks, core::CommScheme::kAllToAll, scheme == "two_level"};
    if (!g.two_level) g.scheme = ValueOrRaise(core::ParseCommScheme(scheme));
    rank_groups.push_back(std::move(g));
  }
  const core::PlanMetrics metrics = ValueOrRaise(core::AnalyzePlan(plan, shape, ranks_per_node));
  const core::SchemeBytes b =
      ValueOrRaise(core::GroupedSchemeBytes(plan, metrics, rank_groups, shape, ranks_per_node));
  py::dict out;
  out["sent"] = b.sent;
  out["received"] = b.received;
  out["inter_sent"] = b.phase.inter_node_sent_bytes;
  out["inter_received"] = b.phase.inter_node_received_bytes;
  return out;
}

}  // namespace

void BindCpu(py::module_& m) {
  m.def("grouped_scheme_bytes", &GroupedSchemeBytes, py::arg("doc_lens"), py::arg("cp_size"),
        py::arg("padding"), py::arg("shards"), py::arg("groups"), py::arg("heads"),
        py::arg("query_heads"), py::arg("head_dim"), py::arg("dtype_bytes"),
        py::arg("ranks_per_node"),
        "core::GroupedSchemeBytes of a mixed plan (groups: (ranks, scheme), scheme one of "
        "targeted, allgather, full_kv, all_to_all, two_level): dict of per-rank sent and "
        "received bytes (both phases) and inter_sent, inter_received (one phase, across nodes)");
  py::class_<RankLayout>(m, "RankLayout")
      .def(py::init<const std::vector<int64_t>&, int32_t, int64_t,
                    const std::vector<flashcp::python::ShardTuple>&, int32_t, const std::string&,
                    int64_t, const std::vector<int32_t>&, int32_t>(),
           py::arg("doc_lens"), py::arg("cp_size"), py::arg("padding"), py::arg("shards"),
           py::arg("rank"), py::arg("scheme"), py::arg("block_size") = 0,
           py::arg("group") = std::vector<int32_t>{}, py::arg("ranks_per_node") = 0)
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
      // Scheme "two_level": a2a_* describe the rank's node part, and the KV-row
      // fields the exchange across nodes over head-parallel rows.
      .def_property_readonly("a2a_two_level",
                             [](const RankLayout& l) { return l.rank_plan().a2a.two_level; })
      .def_property_readonly("a2a_doc_row",
                             [](const RankLayout& l) { return Int64Bytes(l.rank_plan().a2a.doc_row); })
      // The attention batches over AttentionRows (C/N local rows, or the
      // head-parallel rows under all_to_all and two_level): whole shards
      // (start, rows), and prefixed shards (first query row, query rows, staged
      // KV rows; staged contiguously in this order, the queries the last rows).
      .def_property_readonly("whole_batches",
                             [](const RankLayout& l) {
                               const flashcp::worker::CpRankLayout& p = l.rank_plan();
                               std::vector<std::pair<int64_t, int32_t>> out;
                               for (size_t i = 0; i < p.whole_start.size(); ++i) {
                                 out.emplace_back(p.whole_start[i], p.whole_len[i]);
                               }
                               return out;
                             })
      .def_property_readonly("prefix_batches",
                             [](const RankLayout& l) {
                               const flashcp::worker::CpRankLayout& p = l.rank_plan();
                               std::vector<std::tuple<int64_t, int32_t, int32_t>> out;
                               for (size_t i = 0; i < p.prefix_q_start.size(); ++i) {
                                 out.emplace_back(p.prefix_q_start[i], p.prefix_q_len[i],
                                                  p.prefix_kv_len[i]);
                               }
                               return out;
                             })
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
}

}  // namespace flashcp::python
