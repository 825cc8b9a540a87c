// CPU attention kernel throughput (worker/attention_cpu.h) against the plain
// reference (worker/attention_reference.h), one causal document of `len`
// tokens, H = 4, D = 128. FLOPs per SPEC: 4 * H * D * W forward (W the
// (query, key) pairs, Eq. 3) and 2.5x that backward; counters report GFLOP/s
// of wall time. Figures and the peak estimate: docs/benchmarks.md,
// "Execution engine (CPU)".
#include <cmath>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "worker/attention_cpu.h"
#include "worker/attention_reference.h"
#include "worker/cpstep.h"

namespace flashcp::worker {
namespace {

constexpr int32_t kHeads = 4;
constexpr int32_t kHeadDim = 128;

struct Fixture {
  explicit Fixture(int64_t len)
      : shape{kHeads, kHeadDim, 1.0f / std::sqrt(static_cast<float>(kHeadDim))},
        in(MakeInputs(len, shape, 1)),
        o(in.q.size()),
        lse(len * kHeads),
        dq(in.q.size()),
        dk(in.q.size()),
        dv(in.q.size()) {
    doc.k = in.k.data();
    doc.v = in.v.data();
    doc.kv_len = len;
    doc.queries = {QueryRange{0, 0, len}};
    doc.dk = dk.data();
    doc.dv = dv.data();
  }
  AttentionShape shape;
  StepInputs in;
  std::vector<float> o, lse, dq, dk, dv;
  DocAttention doc;
};

int Threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

void SetFlops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iter * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}

void BM_KernelForward(benchmark::State& state) {
  Fixture f(state.range(0));
  ThreadPool pool(static_cast<int>(state.range(1)));
  for (auto _ : state) {
    (void)AttentionForwardCpu(f.shape, {f.doc}, state.range(0), f.in.q.data(), f.o.data(),
                              f.lse.data(), pool);
  }
  SetFlops(state, 4.0 * kHeads * kHeadDim * AttentionPairs({f.doc}));
}

void BM_KernelBackward(benchmark::State& state) {
  Fixture f(state.range(0));
  ThreadPool pool(static_cast<int>(state.range(1)));
  (void)AttentionForwardCpu(f.shape, {f.doc}, state.range(0), f.in.q.data(), f.o.data(),
                            f.lse.data(), pool);
  for (auto _ : state) {
    (void)AttentionBackwardCpu(f.shape, {f.doc}, state.range(0), f.in.q.data(), f.o.data(),
                               f.lse.data(), f.in.dout.data(), f.dq.data(), pool);
  }
  SetFlops(state, 2.5 * 4.0 * kHeads * kHeadDim * AttentionPairs({f.doc}));
}

void BM_ReferenceForward(benchmark::State& state) {
  Fixture f(state.range(0));
  const std::vector<int64_t> lens = {state.range(0)};
  for (auto _ : state) {
    (void)ReferenceForward(f.shape, lens, f.in.q, f.in.k, f.in.v, absl::MakeSpan(f.o),
                           absl::MakeSpan(f.lse));
  }
  SetFlops(state, 4.0 * kHeads * kHeadDim * AttentionPairs({f.doc}));
}

void BM_ReferenceBackward(benchmark::State& state) {
  Fixture f(state.range(0));
  const std::vector<int64_t> lens = {state.range(0)};
  for (auto _ : state) {
    (void)ReferenceBackward(f.shape, lens, f.in.q, f.in.k, f.in.v, f.in.dout, absl::MakeSpan(f.dq),
                            absl::MakeSpan(f.dk), absl::MakeSpan(f.dv));
  }
  SetFlops(state, 2.5 * 4.0 * kHeads * kHeadDim * AttentionPairs({f.doc}));
}

// Args: {document length, kernel threads}.
BENCHMARK(BM_KernelForward)->Args({1024, 1})->Args({4096, 1})->Args({4096, Threads()})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_KernelBackward)->Args({1024, 1})->Args({4096, 1})->Args({4096, Threads()})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReferenceForward)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReferenceBackward)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace flashcp::worker

BENCHMARK_MAIN();
