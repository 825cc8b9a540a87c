// The planning bindings: plan (PlanBatch in process), service_bounds,
// plan_hash, plan_rank_features, pipelines and the global batch.
#include "client/python/native/native_common.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"

namespace flashcp::python {
namespace {

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
  // Planning runs on its own thread while this (the calling, main) thread
  // checks for signals every 20 ms with the GIL taken: Python runs signal
  // handlers on the main thread only, and a planning stage may keep every
  // other thread busy for seconds. The stop token reads the result.
  std::atomic<bool> interrupted{false};
  input.options.stop = core::StopToken([&]() -> absl::Status {
    if (interrupted.load()) return absl::CancelledError("flashcp.plan: interrupted");
    if (timeout_seconds > 0 && clock.Now() - start >= timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "flashcp.plan: no plan within the timeout of ", timeout_seconds, " s"));
    }
    return absl::OkStatus();
  });
  absl::StatusOr<std::string> out;
  {
    py::gil_scoped_release release;  // planning may take a while
    absl::Notification done;
    std::thread planner([&] {
      absl::StatusOr<v1::PlanResponse> response = proto::PlanBatch(input, clock, observer);
      out = response.ok() ? proto::SerializeResponse(*response) : response.status();
      done.Notify();
    });
    while (!interrupted.load() && !done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
      py::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) interrupted.store(true);  // the exception stays set
    }
    planner.join();  // an interrupted plan ends at its next stop check
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

}  // namespace

void BindPlanning(py::module_& m) {
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
}

}  // namespace flashcp::python
