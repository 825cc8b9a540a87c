// flashcp-gpu-bench: the device check's measuring tool (tests/gpu/device_check.sh).
//
//   flashcp-gpu-bench --mode=check    correctness of every kernel and of the
//                                     whole CP step against the CPU reference
//                                     (fresh random inputs; exit 1 on failure)
//   flashcp-gpu-bench --mode=kernels  fwd/bwd TFLOP/s of cuDNN SDPA (and the
//                                     plain kernels at one size): single
//                                     documents 512..16K, packed data-set batches
//   flashcp-gpu-bench --mode=cp       per-strategy, per-rank attention time of
//                                     128K batches at N = 4 and 8, ranks one
//                                     after another on one GPU
//
// Every result is one JSON object per line on stdout (and in --json_out);
// a short table goes to stderr. Times are CUDA-event medians after warm-up.
// FLOPs follow SPEC.md: 4 * H * D * pairs forward, 2.5x that backward.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/analysis.h"
#include "core/datasets.h"
#include "core/flags.h"
#include "core/status_macros.h"
#include "core/strategies.h"
#include "worker/cp_layout.h"
#include "worker/cuda/attention_kernels.h"
#include "worker/cuda/comm_kernels.h"
#include "worker/cuda/cp_check.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/cudnn_attention.h"

ABSL_FLAG(std::string, mode, "check", "check | kernels | cp");
ABSL_FLAG(uint64_t, seed, 0, "random seed; 0 draws a fresh one (printed)");
ABSL_FLAG(int32_t, heads, 32, "query heads H for kernels and cp (D = 128)");
ABSL_FLAG(int32_t, kv_heads, 0, "KV heads (GQA); 0 means = heads");
ABSL_FLAG(int32_t, warmup, 3, "untimed runs before timing");
ABSL_FLAG(int32_t, iters, 10, "timed runs; the median is reported");
ABSL_FLAG(int64_t, kernel_tokens, 16384, "tokens per timed batch of single documents");
ABSL_FLAG(int64_t, packed_context, 16384, "context of the packed data-set batches (kernels mode)");
ABSL_FLAG(int64_t, cp_context, 131072, "context of the CP batches (cp mode)");
ABSL_FLAG(int32_t, cp_batches, 2, "batches per data set in cp mode");
ABSL_FLAG(std::string, cp_sizes, "4,8", "CP sizes N in cp mode");
ABSL_FLAG(std::string, datasets, "wlbllm,pile", "data sets for packed batches");
ABSL_FLAG(std::string, json_out, "", "also append the JSON lines to this file");
ABSL_FLAG(std::string, shapes_out, "", "kernels mode: write the timed shapes (for sdpa_baseline.py)");
ABSL_FLAG(std::string, check_cases, "",
          "check mode: only these kernel cases (comma-separated names) and no CP step; empty: all");
ABSL_FLAG(uint64_t, check_input_seed, 0,
          "check mode: nonzero gives every kernel case and implementation the inputs of this "
          "seed, so implementations compare like for like (0: a fresh seed for each)");

namespace flashcp::worker::cuda {
namespace {

std::ofstream* json_file = nullptr;
// `s` as the inside of a JSON string (status messages quote cuDNN's JSON).
std::string JsonEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

void Emit(const std::string& json) {
  std::cout << json << "\n" << std::flush;
  if (json_file != nullptr) *json_file << json << "\n" << std::flush;
}

// cuDNN with no fallback in the three configurations check and kernels
// mode compare: as the workers run it ("cudnn": top-left mask on whole
// documents, the heuristics' plan), with its plans autotuned
// ("cudnn_tuned"), and with the bottom-right mask always ("cudnn_br").
struct CudnnConfigs {
  std::unique_ptr<CudnnAttention> run, tuned, br;
  std::vector<std::pair<const char*, Attention*>> Named() const {
    return {{"cudnn", run.get()}, {"cudnn_tuned", tuned.get()}, {"cudnn_br", br.get()}};
  }
};
absl::StatusOr<CudnnConfigs> MakeCudnnConfigs(const AttentionShape& shape) {
  CudnnConfigs c;
  FLASHCP_ASSIGN_OR_RETURN(c.run, CudnnAttention::Create(shape, {.allow_fallback = false}));
  FLASHCP_ASSIGN_OR_RETURN(
      c.tuned, CudnnAttention::Create(shape, {.allow_fallback = false, .autotune = true}));
  FLASHCP_ASSIGN_OR_RETURN(c.br, CudnnAttention::Create(shape, {.allow_fallback = false,
                                                                .always_bottom_right = true}));
  return c;
}

// A number as JSON: non-finite (a size mismatch gives infinity) as null.
std::string JsonNumber(double x) {
  return std::isfinite(x) ? absl::StrFormat("%.4g", x) : std::string("null");
}
std::string ErrJson(const ErrorStats& e) {
  return absl::StrCat("{\"max_rel\":", JsonNumber(e.max_rel), ",\"l2_rel\":", JsonNumber(e.l2_rel),
                      ",\"nonfinite\":", e.nonfinite, "}");
}
std::string CheckJson(const AttentionCheck& c) {
  return absl::StrCat("\"out\":", ErrJson(c.out), ",\"lse\":", ErrJson(c.lse), ",\"dq\":",
                      ErrJson(c.dq), ",\"dk\":", ErrJson(c.dk), ",\"dv\":", ErrJson(c.dv));
}

absl::StatusOr<std::vector<core::Dataset>> Datasets() {
  std::vector<core::Dataset> out;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_datasets), ',', absl::SkipEmpty())) {
    FLASHCP_ASSIGN_OR_RETURN(core::Dataset d, core::ParseDataset(name));
    out.push_back(d);
  }
  return out;
}

// ---- check -----------------------------------------------------------------
struct KernelCase {
  const char* name;
  std::vector<int32_t> q, kv;
  bool gaps;
};

// One kernel check's JSON line and console line.
void ReportKernelCheck(const char* impl, const KernelCase& c, const AttentionShape& shape,
                       uint64_t s, const absl::StatusOr<AttentionCheck>& check, bool ok) {
  Emit(absl::StrCat("{\"check\":\"attention\",\"impl\":\"", impl, "\",\"case\":\"", c.name,
                    "\",\"heads_q\":", shape.heads_q, ",\"heads_kv\":", shape.heads_kv,
                    ",\"seed\":", s, ",\"pass\":", ok ? "true" : "false", ",",
                    check.ok() ? CheckJson(*check)
                               : absl::StrCat("\"error\":\"", JsonEscape(check.status().ToString()), "\""),
                    "}"));
  std::cerr << absl::StrFormat("check %-11s %-14s H=%2d/%2d  %s\n", impl, c.name,
                               shape.heads_q, shape.heads_kv,
                               ok ? "PASS" : absl::StrCat("FAIL ", check.ok() ? check->ToString()
                                                                               : check.status().ToString()));
}

// The kernel checks (the cases in `only`, or all): returns the failures.
absl::StatusOr<int> RunKernelChecks(std::mt19937_64& rng, const std::vector<std::string>& only) {
  int failures = 0;
  // Kernels: small head counts keep the fp64 CPU reference fast; one case at
  // H = 16 exercises the benchmark shape.
  const std::vector<AttentionShape> shapes = {{.heads_q = 4, .heads_kv = 4, .head_dim = 128},
                                              {.heads_q = 4, .heads_kv = 2, .head_dim = 128},
                                              {.heads_q = 16, .heads_kv = 16, .head_dim = 128}};
  const std::vector<KernelCase> cases = {{"single_1", {1}, {1}, false},
                                       {"single_777", {777}, {777}, false},
                                       {"single_1024", {1024}, {1024}, false},
                                       {"packed", {5, 300, 1, 64, 129, 1000}, {5, 300, 1, 64, 129, 1000}, false},
                                       {"prefixed", {100, 1, 333, 64}, {100, 200, 1500, 64}, false},
                                       {"prefixed_gaps", {50, 256, 7}, {450, 256, 1200}, true},
                                       // Graphs with s_q = 1 (run 1 left a row of LSE unwritten).
                                       {"q1_kv2", {1}, {2}, false},
                                       {"q1_prefixed", {1, 1}, {2, 5}, false}};
  for (const AttentionShape& shape : shapes) {
    FLASHCP_ASSIGN_OR_RETURN(auto plain, PlainAttention::Create(shape));
    // The plain kernels and every cuDNN configuration kernels mode times.
    FLASHCP_ASSIGN_OR_RETURN(const CudnnConfigs cudnn, MakeCudnnConfigs(shape));
    std::vector<std::pair<const char*, Attention*>> impls = {{"plain", plain.get()}};
    for (const auto& named : cudnn.Named()) impls.push_back(named);
    for (const KernelCase& c : cases) {
      if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
      // Keep the single-threaded fp64 reference cheap at H = 16.
      if (shape.heads_q == 16 && c.kv.size() > 1) continue;
      if (shape.heads_q == 16 && c.kv[0] > 800) continue;
      const uint64_t input_seed = absl::GetFlag(FLAGS_check_input_seed);
      for (const auto& [impl, a] : impls) {
        const uint64_t s = input_seed != 0 ? input_seed : rng();
        auto check = CheckAttention(*a, shape, c.q, c.kv, s, c.gaps);
        const bool ok = check.ok() && check->ok();
        failures += ok ? 0 : 1;
        ReportKernelCheck(impl, c, shape, s, check, ok);
      }
    }
  }
  return failures;
}

// One CP-step check's JSON line and console line.
void ReportCpCheck(const char* bname, core::Strategy strategy, core::CommScheme scheme, int32_t n,
                   uint64_t seed, const absl::StatusOr<CpCheck>& check, bool ok) {
  Emit(absl::StrCat(
      "{\"check\":\"cp_step\",\"impl\":\"", bname, "\",\"strategy\":\"",
      core::StrategyName(strategy), "\",\"scheme\":\"", core::CommSchemeName(scheme),
      "\",\"cp\":", n, ",\"seed\":", seed, ",\"pass\":", ok ? "true" : "false", ",",
      check.ok()
          ? absl::StrCat(CheckJson(check->errors), ",\"bytes_sent\":[",
                         absl::StrJoin(check->bytes_sent, ","), "],\"predicted_bytes_sent\":[",
                         absl::StrJoin(check->predicted_sent, ","), "],\"bytes_received\":[",
                         absl::StrJoin(check->bytes_received, ","),
                         "],\"predicted_bytes_received\":[",
                         absl::StrJoin(check->predicted_received, ","), "],\"fallback\":\"",
                         JsonEscape(check->fallback), "\"")
          : absl::StrCat("\"error\":\"", JsonEscape(check.status().ToString()), "\""),
      "}"));
  std::cerr << absl::StrFormat(
      "check cp %-5s %-8s %-9s N=%d  %s\n", bname, core::StrategyName(strategy),
      core::CommSchemeName(scheme), n,
      ok ? "PASS"
         : absl::StrCat("FAIL ", check.ok() ? absl::StrCat(check->errors.ToString(), " fallback=",
                                                          check->fallback)
                                            : check.status().ToString()));
}

// The whole CP step: every scheme, the strategies of the comparison, N = 2,
// 4, 8; returns the failures.
absl::StatusOr<int> RunCpChecks(uint64_t seed, std::mt19937_64& rng) {
  int failures = 0;
  FLASHCP_ASSIGN_OR_RETURN(std::vector<int64_t> docs,
                           core::SampleBatch(core::Dataset::kWlbLlm, 2048, seed, 0));
  docs.insert(docs.begin(), 1);  // a one-token document too
  // One fresh seed for all CP checks: same inputs, so one reference run.
  CpReferenceCache cache;
  const uint64_t cp_seed = rng();
  for (int32_t n : {2, 4, 8}) {
    for (core::Strategy strategy : {core::Strategy::kFlashCp, core::Strategy::kLlama3,
                                    core::Strategy::kPerDoc, core::Strategy::kZigzag}) {
      FLASHCP_ASSIGN_OR_RETURN(core::Plan plan, core::MakePlan(strategy, core::Batch{docs, n}));
      for (core::CommScheme scheme : core::kKvCommSchemes) {
        for (AttentionBackend backend : {AttentionBackend::kCudnn, AttentionBackend::kPlain}) {
          if (backend == AttentionBackend::kPlain && n != 4) continue;
          CpCheckOptions o;
          o.scheme = scheme;
          o.shape = {.heads_q = 4, .heads_kv = 2, .head_dim = 128};
          o.backend = backend;
          o.seed = cp_seed;
          o.reference_cache = &cache;
          auto check = RunCpCheck(plan, o);
          const bool ok = check.ok() && check->ok() && check->fallback.empty();
          failures += ok ? 0 : 1;
          const char* bname = backend == AttentionBackend::kCudnn ? "cudnn" : "plain";
          ReportCpCheck(bname, strategy, scheme, n, o.seed, check, ok);
        }
      }
    }
  }
  return failures;
}

absl::Status RunCheck(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> only =
      absl::StrSplit(absl::GetFlag(FLAGS_check_cases), ',', absl::SkipEmpty());
  FLASHCP_ASSIGN_OR_RETURN(int failures, RunKernelChecks(rng, only));
  // The CP step not when only some kernel cases were asked for.
  if (only.empty()) {
    FLASHCP_ASSIGN_OR_RETURN(const int cp_failures, RunCpChecks(seed, rng));
    failures += cp_failures;
  }
  if (failures > 0) return absl::InternalError(absl::StrCat(failures, " checks failed"));
  std::cerr << "check: all passed\n";
  return absl::OkStatus();
}

// ---- timing ----------------------------------------------------------------
// Device tensors for one timed batch: random bf16 (never zeros: zeros hide bugs and run
// faster than real data).
struct Tensors {
  DeviceBuffer<bf16> q, k, v, o, dout, dq, dk, dv;
  DeviceBuffer<float> lse;
};

absl::StatusOr<Tensors> MakeTensors(int64_t q_rows, int64_t kv_rows, const AttentionShape& shape,
                                    uint64_t seed, cudaStream_t s) {
  Tensors t;
  const int64_t qe = q_rows * shape.heads_q * shape.head_dim, ke = kv_rows * shape.heads_kv * shape.head_dim;
  uint64_t stream_id = seed * 16;
  auto make = [&](DeviceBuffer<bf16>& b, int64_t n, bool random) -> absl::Status {
    FLASHCP_ASSIGN_OR_RETURN(b, DeviceBuffer<bf16>::Allocate(n));
    // Outputs too get random contents, so nothing reads zeros by accident.
    (void)random;
    return LaunchFillRandomBf16(b.data(), n, ++stream_id, s);
  };
  FLASHCP_RETURN_IF_ERROR(make(t.q, qe, true));
  FLASHCP_RETURN_IF_ERROR(make(t.k, ke, true));
  FLASHCP_RETURN_IF_ERROR(make(t.v, ke, true));
  FLASHCP_RETURN_IF_ERROR(make(t.dout, qe, true));
  FLASHCP_RETURN_IF_ERROR(make(t.o, qe, false));
  FLASHCP_RETURN_IF_ERROR(make(t.dq, qe, false));
  FLASHCP_RETURN_IF_ERROR(make(t.dk, ke, false));
  FLASHCP_RETURN_IF_ERROR(make(t.dv, ke, false));
  FLASHCP_ASSIGN_OR_RETURN(t.lse, DeviceBuffer<float>::Allocate(q_rows * shape.heads_q));
  return t;
}

struct Timing {
  double fwd_ms = 0, bwd_ms = 0;
};

// Median forward and backward times of `a` on `batch` (forward once before
// each backward so O and LSE are real).
absl::StatusOr<Timing> TimeAttention(Attention& a, const VarlenBatch& batch, Tensors& t,
                                     cudaStream_t s) {
  const AttentionForwardArgs fa{t.q.data(), t.k.data(), t.v.data(), t.o.data(), t.lse.data()};
  const AttentionBackwardArgs ba{t.q.data(), t.k.data(), t.v.data(), t.o.data(), t.dout.data(),
                                 t.lse.data(), t.dq.data(), t.dk.data(), t.dv.data()};
  FLASHCP_ASSIGN_OR_RETURN(CudaEvent e0, CudaEvent::Create(true));
  FLASHCP_ASSIGN_OR_RETURN(CudaEvent e1, CudaEvent::Create(true));
  FLASHCP_ASSIGN_OR_RETURN(CudaEvent e2, CudaEvent::Create(true));
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
    FLASHCP_RETURN_IF_ERROR(a.Forward(batch, fa, s));
    FLASHCP_RETURN_IF_ERROR(a.Backward(batch, ba, s));
  }
  std::vector<double> fwd, bwd;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_iters)); ++i) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(e0.get(), s), "event");
    FLASHCP_RETURN_IF_ERROR(a.Forward(batch, fa, s));
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(e1.get(), s), "event");
    FLASHCP_RETURN_IF_ERROR(a.Backward(batch, ba, s));
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaEventRecord(e2.get(), s), "event");
    FLASHCP_ASSIGN_OR_RETURN(float f, ElapsedMs(e0, e1));
    FLASHCP_ASSIGN_OR_RETURN(float b, ElapsedMs(e1, e2));
    fwd.push_back(f);
    bwd.push_back(b);
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd.begin(), bwd.end());
  return Timing{fwd[fwd.size() / 2], bwd[bwd.size() / 2]};
}

AttentionShape BenchShape() {
  const int32_t h = absl::GetFlag(FLAGS_heads);
  const int32_t hkv = absl::GetFlag(FLAGS_kv_heads) > 0 ? absl::GetFlag(FLAGS_kv_heads) : h;
  return {.heads_q = h, .heads_kv = hkv, .head_dim = 128};
}

absl::Status RunKernels(uint64_t seed) {
  const AttentionShape shape = BenchShape();
  FLASHCP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  const cudaStream_t s = stream.get();
  // "cudnn" is what the workers run; cudnn_tuned and cudnn_br show what
  // autotuning and the mask choice are worth (MakeCudnnConfigs).
  FLASHCP_ASSIGN_OR_RETURN(const CudnnConfigs cudnn, MakeCudnnConfigs(shape));
  FLASHCP_ASSIGN_OR_RETURN(auto plain, PlainAttention::Create(shape));
  std::vector<std::pair<const char*, Attention*>> impls = cudnn.Named();
  impls.push_back({"plain", plain.get()});
  struct Shape {
    std::string name;
    std::vector<int32_t> docs;
  };
  std::vector<Shape> list;
  const int64_t tokens = absl::GetFlag(FLAGS_kernel_tokens);
  for (int32_t len : {512, 1024, 2048, 4096, 8192, 16384}) {
    Shape sh{absl::StrCat("single_", len), {}};
    // As many documents of `len` as fill kernel_tokens (at least one).
    for (int64_t i = 0; i < std::max<int64_t>(1, tokens / len); ++i) sh.docs.push_back(len);
    list.push_back(sh);
  }
  FLASHCP_ASSIGN_OR_RETURN(std::vector<core::Dataset> datasets, Datasets());
  for (core::Dataset d : datasets) {
    FLASHCP_ASSIGN_OR_RETURN(std::vector<int64_t> docs,
                             core::SampleBatch(d, absl::GetFlag(FLAGS_packed_context), seed, 0));
    list.push_back({absl::StrCat("packed_", core::DatasetName(d)), {docs.begin(), docs.end()}});
  }
  if (const std::string path = absl::GetFlag(FLAGS_shapes_out); !path.empty()) {
    std::ofstream f(path);
    f << "{\"heads_q\":" << shape.heads_q << ",\"heads_kv\":" << shape.heads_kv
      << ",\"head_dim\":" << shape.head_dim << ",\"shapes\":[";
    for (size_t i = 0; i < list.size(); ++i)
      f << (i ? "," : "") << "{\"name\":\"" << list[i].name << "\",\"docs\":["
        << absl::StrJoin(list[i].docs, ",") << "]}";
    f << "]}\n";
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  std::cerr << absl::StrFormat("%-18s %8s %6s %10s %10s %10s %10s\n", "shape", "tokens", "docs",
                               "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
  for (const Shape& sh : list) {
    FLASHCP_ASSIGN_OR_RETURN(VarlenBatch batch, VarlenBatch::Create(sh.docs, sh.docs, shape, s));
    FLASHCP_ASSIGN_OR_RETURN(Tensors t, MakeTensors(batch.total_q(), batch.total_kv(), shape, seed, s));
    for (const auto& [impl, a] : impls) {
      // The plain kernels are the oracle, not a contender: time them once, at 8K.
      if (a == plain.get() && sh.name != "single_8192") continue;
      auto timed = TimeAttention(*a, batch, t, s);
      if (!timed.ok()) {  // a refused shape is a result; the other shapes still run
        Emit(absl::StrCat("{\"bench\":\"kernel\",\"impl\":\"", impl, "\",\"shape\":\"",
                          sh.name, "\",\"error\":\"", JsonEscape(timed.status().ToString()), "\"}"));
        std::cerr << sh.name << " " << impl << ": " << timed.status() << "\n";
        continue;
      }
      const Timing tm = *timed;
      const double ff = AttentionForwardFlops(batch, shape), bf = AttentionBackwardFlops(batch, shape);
      const double ftf = ff / (tm.fwd_ms * 1e-3) / 1e12, btf = bf / (tm.bwd_ms * 1e-3) / 1e12;
      Emit(absl::StrFormat(
          "{\"bench\":\"kernel\",\"impl\":\"%s\",\"shape\":\"%s\",\"tokens\":%d,\"docs\":%d,"
          "\"heads_q\":%d,\"heads_kv\":%d,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"fwd_tflops\":%.1f,"
          "\"bwd_tflops\":%.1f}",
          impl, sh.name, batch.total_q(), batch.num_seqs(), shape.heads_q, shape.heads_kv,
          tm.fwd_ms, tm.bwd_ms, ftf, btf));
      std::cerr << absl::StrFormat("%-18s %8d %6d %10.3f %10.1f %10.3f %10.1f  %s\n", sh.name,
                                   batch.total_q(), batch.num_seqs(), tm.fwd_ms, ftf, tm.bwd_ms, btf,
                                   impl);
    }
  }
  return absl::OkStatus();
}

// ---- cp ----------------------------------------------------------------------
absl::Status RunCp(uint64_t seed) {
  const AttentionShape shape = BenchShape();
  FLASHCP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  const cudaStream_t s = stream.get();
  FLASHCP_ASSIGN_OR_RETURN(auto cudnn, CudnnAttention::Create(shape));  // as the workers run it
  FLASHCP_ASSIGN_OR_RETURN(std::vector<core::Dataset> datasets, Datasets());
  std::vector<int32_t> sizes;
  for (absl::string_view x : absl::StrSplit(absl::GetFlag(FLAGS_cp_sizes), ',', absl::SkipEmpty())) {
    int32_t n = 0;
    if (!absl::SimpleAtoi(x, &n) || n < 1) return absl::InvalidArgumentError(absl::StrCat("bad cp size ", x));
    sizes.push_back(n);
  }
  const std::vector<core::Strategy> strategies = {core::Strategy::kFlashCp, core::Strategy::kLlama3,
                                                  core::Strategy::kPerDoc, core::Strategy::kZigzag};
  std::cerr << absl::StrFormat("%-9s %5s %2s %-8s %12s %10s %10s %10s\n", "dataset", "batch", "N",
                               "strategy", "critical ms", "mean ms", "imbalance", "predicted");
  for (core::Dataset d : datasets) {
    for (int32_t b = 0; b < absl::GetFlag(FLAGS_cp_batches); ++b) {
      FLASHCP_ASSIGN_OR_RETURN(std::vector<int64_t> docs,
                               core::SampleBatch(d, absl::GetFlag(FLAGS_cp_context), seed, b));
      for (int32_t n : sizes) {
        for (core::Strategy strategy : strategies) {
          FLASHCP_ASSIGN_OR_RETURN(core::Plan plan, core::MakePlan(strategy, core::Batch{docs, n}));
          FLASHCP_ASSIGN_OR_RETURN(core::CommLayout layout, core::BuildCommLayout(plan));
          FLASHCP_ASSIGN_OR_RETURN(core::PlanMetrics metrics,
                                   core::AnalyzePlan(plan, {shape.heads_kv, shape.head_dim, 2}));
          std::vector<double> rank_ms;
          absl::Status strategy_status = [&]() -> absl::Status {
          for (int32_t r = 0; r < n; ++r) {
            // Rank r's attention alone on the GPU: its whole-document batch
            // and its prefixed batch over staged KV, fwd + bwd each.
            FLASHCP_ASSIGN_OR_RETURN(CpRankLayout rp, BuildCpRankLayout(plan, layout, r, core::CommScheme::kAllGather));
            double ms = 0;
            if (!rp.whole_len.empty()) {
              FLASHCP_ASSIGN_OR_RETURN(VarlenBatch wb, VarlenBatch::Create(rp.whole_start, rp.whole_len,
                                                                           rp.whole_start, rp.whole_len, shape, s));
              FLASHCP_ASSIGN_OR_RETURN(Tensors t, MakeTensors(rp.local_rows, rp.local_rows, shape, seed + r, s));
              FLASHCP_ASSIGN_OR_RETURN(Timing tm, TimeAttention(*cudnn, wb, t, s));
              ms += tm.fwd_ms + tm.bwd_ms;
            }
            if (!rp.prefix_q_len.empty()) {
              std::vector<int64_t> kv_start;
              int64_t at = 0;
              for (int32_t len : rp.prefix_kv_len) kv_start.push_back(at), at += len;
              FLASHCP_ASSIGN_OR_RETURN(VarlenBatch pb, VarlenBatch::Create(rp.prefix_q_start, rp.prefix_q_len,
                                                                           kv_start, rp.prefix_kv_len, shape, s));
              FLASHCP_ASSIGN_OR_RETURN(Tensors t, MakeTensors(rp.local_rows, at, shape, seed + 100 + r, s));
              FLASHCP_ASSIGN_OR_RETURN(Timing tm, TimeAttention(*cudnn, pb, t, s));
              ms += tm.fwd_ms + tm.bwd_ms;
            }
            rank_ms.push_back(ms);
          }
          return absl::OkStatus();
          }();
          if (!strategy_status.ok()) {  // report it, go on with the next strategy
            Emit(absl::StrCat("{\"bench\":\"cp\",\"dataset\":\"", core::DatasetName(d),
                              "\",\"batch\":", b, ",\"cp\":", n, ",\"strategy\":\"",
                              core::StrategyName(strategy), "\",\"error\":\"",
                              JsonEscape(strategy_status.ToString()), "\"}"));
            std::cerr << core::StrategyName(strategy) << " N=" << n << ": " << strategy_status << "\n";
            continue;
          }
          const double crit = *std::max_element(rank_ms.begin(), rank_ms.end());
          double mean = 0;
          for (double x : rank_ms) mean += x / n;
          Emit(absl::StrFormat(
              "{\"bench\":\"cp\",\"dataset\":\"%s\",\"batch\":%d,\"cp\":%d,\"strategy\":\"%s\","
              "\"heads\":%d,\"rank_ms\":[%s],\"critical_ms\":%.4f,\"mean_ms\":%.4f,"
              "\"measured_imbalance\":%.4f,\"predicted_imbalance\":%.4f,\"fallback\":\"%s\"}",
              core::DatasetName(d), b, n, core::StrategyName(strategy), shape.heads_q,
              absl::StrJoin(rank_ms, ",", [](std::string* o, double x) { absl::StrAppendFormat(o, "%.4f", x); }),
              crit, mean, crit / mean, metrics.imbalance, JsonEscape(cudnn->fallback_reason())));
          std::cerr << absl::StrFormat("%-9s %5d %2d %-8s %12.3f %10.3f %10.3f %10.3f\n",
                                       core::DatasetName(d), b, n, core::StrategyName(strategy), crit,
                                       mean, crit / mean, metrics.imbalance);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace flashcp::worker::cuda

int main(int argc, char** argv) {
  flashcp::core::CommandLine line;
  if (std::optional<int> rc = flashcp::core::ParseMain(
          argc, argv,
          "Usage: flashcp-gpu-bench [--flag=value ...]\n\nThe CUDA engine's checks and timings "
          "(tests/gpu/device_check.sh).",
          line, std::cout, std::cerr)) {
    return *rc;
  }
  using namespace flashcp::worker::cuda;
  // A bad --mode is a usage error (exit 2), found before the device is probed.
  using RunMode = absl::Status (*)(uint64_t seed);
  constexpr std::pair<absl::string_view, RunMode> kModes[] = {
      {"check", RunCheck}, {"kernels", RunKernels}, {"cp", RunCp}};
  const std::string mode = absl::GetFlag(FLAGS_mode);
  RunMode run = nullptr;
  for (const auto& [name, fn] : kModes) {
    if (name == mode) run = fn;
  }
  if (run == nullptr) {
    return flashcp::core::UsageError(
        "flashcp-gpu-bench",
        absl::InvalidArgumentError(absl::StrCat(
            "--mode: must be one of ",
            absl::StrJoin(kModes, ", ",
                          [](std::string* out, const auto& m) { absl::StrAppend(out, m.first); }),
            "; got \"", mode, "\"")),
        std::cerr);
  }
  std::ofstream file;
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    file.open(path, std::ios::app);
    json_file = &file;
  }
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) {
    std::cerr << "flashcp-gpu-bench: " << s << "\n";
    return 77;  // the conventional "skipped" exit code
  }
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = std::random_device{}() | 1;
  std::cerr << "flashcp-gpu-bench: mode " << mode << ", seed " << seed << ", cuDNN "
            << CudnnRuntimeVersion() << "\n";
  if (const absl::Status status = run(seed); !status.ok()) {
    std::cerr << "flashcp-gpu-bench: " << status << "\n";
    return 1;
  }
  return 0;
}
