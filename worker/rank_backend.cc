#include "worker/rank_backend.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "worker/engine.h"
#include "worker/thread_pool.h"

namespace flashcp::worker {
namespace {

void Fill(std::vector<float>& v, uint64_t seed) {
  core::SplitMix64Rng rng(seed);
  for (float& x : v) x = static_cast<float>(rng.Uniform() * 2.0 - 1.0);
}

class CpuRankBackend final : public RankBackend {
 public:
  explicit CpuRankBackend(const BackendConfig& config)
      : rank_(config.rank),
        clock_(*config.clock),
        threads_(config.threads),
        thread_cpu_seconds_(config.thread_cpu_seconds ? config.thread_cpu_seconds
                                                      : ThreadCpuSeconds),
        pool_(config.threads) {
    shape_.heads = config.heads;
    shape_.head_dim = config.head_dim;
    shape_.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  }

  int32_t dtype_bytes() const override { return 4; }
  absl::Status Connect(gloo::rendezvous::Store&, int32_t, int32_t, absl::Duration) override {
    return absl::OkStatus();  // the group's Gloo communicator is the transport
  }

  absl::StatusOr<StepMeasurement> Run(const core::Plan& plan, core::CommScheme scheme,
                                      uint64_t seed, Communicator& group) override {
    FLASHCP_ASSIGN_OR_RETURN(CpAttentionStep step,
                             CpAttentionStep::Create(plan, rank_, shape_, scheme));
    const size_t rows = static_cast<size_t>(step.local_rows());
    const size_t n = rows * shape_.heads * shape_.head_dim;
    for (std::vector<float>* v : {&q_, &k_, &v_, &o_, &dout_, &dq_, &dk_, &dv_}) v->resize(n);
    lse_.resize(rows * shape_.heads);
    uint64_t s = seed * 0x100000001B3ull + static_cast<uint64_t>(rank_) * 4;
    Fill(q_, s);
    Fill(k_, s + 1);
    Fill(v_, s + 2);
    Fill(dout_, s + 3);
    TimedCommunicator<> comm(group, clock_);
    const CommStats before = group.stats();
    const double cpu0 = thread_cpu_seconds_();
    const absl::Time t0 = clock_.Now();
    FLASHCP_RETURN_IF_ERROR(step.Forward(comm, pool_, q_, k_, v_, absl::MakeSpan(o_),
                                         absl::MakeSpan(lse_)));
    const absl::Time t1 = clock_.Now();
    FLASHCP_RETURN_IF_ERROR(step.Backward(comm, pool_, dout_, absl::MakeSpan(dq_),
                                          absl::MakeSpan(dk_), absl::MakeSpan(dv_)));
    const absl::Time t2 = clock_.Now();
    const double cpu2 = thread_cpu_seconds_();
    const CommStats after = group.stats();
    StepMeasurement m;
    m.forward_seconds = absl::ToDoubleSeconds(t1 - t0);
    m.backward_seconds = absl::ToDoubleSeconds(t2 - t1);
    m.comm_seconds = absl::ToDoubleSeconds(comm.time());
    m.attention_seconds = std::max(0.0, m.forward_seconds + m.backward_seconds - m.comm_seconds);
    if (threads_ == 1) m.attention_cpu_seconds = std::max(0.0, cpu2 - cpu0);
    m.bytes_sent = after.bytes_sent - before.bytes_sent;
    m.bytes_received = after.bytes_received - before.bytes_received;
    return m;
  }

 private:
  static double ThreadCpuSeconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

  const int32_t rank_;
  const core::WaitClock& clock_;
  const int32_t threads_;
  const std::function<double()> thread_cpu_seconds_;
  AttentionShape shape_;
  ThreadPool pool_;
  std::vector<float> q_, k_, v_, o_, lse_, dout_, dq_, dk_, dv_;
};

}  // namespace

std::unique_ptr<RankBackend> MakeCpuRankBackend(const BackendConfig& config) {
  return std::make_unique<CpuRankBackend>(config);
}

absl::StatusOr<int32_t> ParseDevice(absl::string_view device) {
  if (device == "cpu") return -1;
  if (absl::StartsWith(device, "cuda:")) {
    const absl::string_view k = device.substr(5);
    int32_t index = -1;
    // Digits only: SimpleAtoi alone would take "+1" and " 1".
    const bool digits = !k.empty() && k.size() <= 4 &&
                        std::all_of(k.begin(), k.end(), [](char c) { return absl::ascii_isdigit(c); });
    if (digits && absl::SimpleAtoi(k, &index) && index <= 4095) return index;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device: want cpu or cuda:K (K a device index, 0..4095), got \"", device,
                   "\""));
}

absl::StatusOr<std::unique_ptr<RankBackend>> MakeRankBackend(absl::string_view device,
                                                             const BackendConfig& config,
                                                             const CudaBackendFactory& cuda) {
  FLASHCP_ASSIGN_OR_RETURN(const int32_t index, ParseDevice(device));
  if (config.clock == nullptr) return absl::InvalidArgumentError("rank backend: no clock");
  if (index < 0) return MakeCpuRankBackend(config);
  if (!cuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", device, ": this flashcp-worker was built without CUDA; use --device cpu"));
  }
  return cuda(index, config);
}

}  // namespace flashcp::worker
