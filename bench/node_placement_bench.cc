// The cost of flashcp's last stage, node placement
// (core/internal/flashcp_nodes.h), beside the whole plan's, in one run: per
// data set, 1M tokens at N = 64 and 128K at N = 16, 8 ranks a node. A pool of
// 64 batches (seed 1) is planned once by flashcp with ranks_per_node 8; each
// iteration then places every plan of the pool again, its ranks first
// shuffled (a fixed permutation per batch within each token count, so the
// plan's own nodes are no better a start than any other). The counters are
// the calling thread's CPU time per call, nearest-rank percentiles over the
// final run's calls: place_p50_cpu_us, place_p99_cpu_us, and plan_p99_cpu_us
// for MakePlan itself (timed once per batch while the pool is built).
//
//   build/bin/node_placement_bench [--benchmark_filter=pile/C:1048576]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/thread_cpu.h"
#include "benchmark/benchmark.h"
#include "core/cli.h"
#include "core/datasets.h"
#include "core/internal/flashcp_nodes.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/types.h"

namespace flashcp::core {
namespace {

constexpr int kPoolSize = 64;
constexpr uint64_t kSeed = 1;
constexpr int32_t kRanksPerNode = 8;

struct Config {
  int64_t context;
  int32_t cp_size;
};
constexpr Config kConfigs[] = {{131072, 16}, {int64_t{1} << 20, 64}};

struct Pool {
  std::vector<Plan> shuffled;       // flashcp's plans, ranks shuffled
  std::vector<double> plan_cpu_us;  // MakePlan's CPU time per batch
};

Pool MakePool(Dataset dataset, const Config& config) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> docs =
      SampleBatches(dataset, config.context, kPoolSize, kSeed);
  if (!docs.ok()) {
    std::fprintf(stderr, "node_placement_bench: %s\n", std::string(docs.status().message()).c_str());
    std::exit(1);
  }
  PlanOptions options;
  options.ranks_per_node = kRanksPerNode;
  SplitMix64Rng rng(kSeed);
  Pool pool;
  for (std::vector<int64_t>& d : *docs) {
    const double c0 = bench::ThreadCpuSeconds();
    absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{std::move(d), config.cp_size},
                                         options);
    pool.plan_cpu_us.push_back((bench::ThreadCpuSeconds() - c0) * 1e6);
    if (!plan.ok()) {
      std::fprintf(stderr, "node_placement_bench: %s\n",
                   std::string(plan.status().message()).c_str());
      std::exit(1);
    }
    // Shuffled within each token count (the padded ranks are the last ones).
    const int32_t n = plan->cp_size;
    const int32_t full = n - static_cast<int32_t>(plan->padding);
    std::vector<int32_t> perm(n);
    for (int32_t r = 0; r < n; ++r) perm[r] = r;
    for (int32_t i = full - 1; i > 0; --i) std::swap(perm[i], perm[rng.Next() % (i + 1)]);
    for (int32_t i = n - 1; i > full; --i) {
      std::swap(perm[i], perm[full + rng.Next() % (i - full + 1)]);
    }
    pool.shuffled.push_back(internal::RelabelRanks(*plan, perm));
  }
  return pool;
}

void BM_Place(benchmark::State& state, const Pool* pool) {
  std::vector<double> cpu_us;
  for (auto _ : state) {
    for (const Plan& plan : pool->shuffled) {
      const double c0 = bench::ThreadCpuSeconds();
      const Plan placed = internal::PlaceRanksOnNodes(plan, kRanksPerNode, {});
      cpu_us.push_back((bench::ThreadCpuSeconds() - c0) * 1e6);
      benchmark::DoNotOptimize(placed.shards.data());
    }
  }
  state.counters["place_p50_cpu_us"] = Percentile(cpu_us, 0.50);
  state.counters["place_p99_cpu_us"] = Percentile(cpu_us, 0.99);
  state.counters["plan_p99_cpu_us"] = Percentile(pool->plan_cpu_us, 0.99);
}

void RegisterAll() {
  static auto* pools = new std::vector<Pool>();  // lives for the run
  pools->reserve(std::size(kAllDatasets) * std::size(kConfigs));
  for (Dataset dataset : kAllDatasets) {
    for (const Config& config : kConfigs) {
      pools->push_back(MakePool(dataset, config));
      const std::string name = absl::StrCat(DatasetName(dataset), "/C:", config.context,
                                            "/N:", config.cp_size);
      benchmark::RegisterBenchmark(name.c_str(), BM_Place, &pools->back())
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.5);
    }
  }
}

}  // namespace
}  // namespace flashcp::core

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  flashcp::core::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
