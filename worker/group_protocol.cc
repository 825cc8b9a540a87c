#include "worker/group_protocol.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flashcp::worker {
namespace {

// The wire forms: fixed size, native layout, no padding left undefined.
struct WireHeader {
  uint32_t kind = 0;
  uint32_t strategy = 0;  // core::Strategy's value
  uint32_t scheme = 0;    // core::CommScheme's value
  uint32_t reserved = 0;
  int64_t batch = 0;
  int64_t steps_total = 0;
  int64_t payload_bytes = 0;
};
static_assert(sizeof(WireHeader) == kStepHeaderBytes &&
              std::is_trivially_copyable_v<WireHeader>);

struct WireReport {
  double attention_seconds = 0;
  double attention_cpu_seconds = 0;
  uint8_t stop = 0;
  uint8_t pad[7] = {};
};
static_assert(sizeof(WireReport) == 24 && std::is_trivially_copyable_v<WireReport>);

}  // namespace

std::array<std::byte, kStepHeaderBytes> EncodeStepHeader(const StepHeader& h) {
  WireHeader w;
  w.kind = static_cast<uint32_t>(h.kind);
  if (h.kind == RoundKind::kStep) {
    w.strategy = static_cast<uint32_t>(h.strategy);
    w.scheme = static_cast<uint32_t>(h.scheme);
    w.batch = h.batch;
    w.steps_total = h.steps_total;
    w.payload_bytes = h.payload_bytes;
  }
  std::array<std::byte, kStepHeaderBytes> out;
  std::memcpy(out.data(), &w, sizeof(w));
  return out;
}

absl::StatusOr<StepHeader> DecodeStepHeader(absl::Span<const std::byte> bytes) {
  if (static_cast<int64_t>(bytes.size()) != kStepHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("step header: ", bytes.size(),
                                                   " bytes, want ", kStepHeaderBytes));
  }
  WireHeader w;
  std::memcpy(&w, bytes.data(), sizeof(w));
  StepHeader h;
  switch (static_cast<RoundKind>(w.kind)) {
    case RoundKind::kStep:
    case RoundKind::kIdle:
    case RoundKind::kWaiting:
    case RoundKind::kExit:
      h.kind = static_cast<RoundKind>(w.kind);
      break;
    default:
      return absl::DataLossError(absl::StrCat("step header: unknown kind ", w.kind));
  }
  if (h.kind != RoundKind::kStep) {
    if (w.strategy != 0 || w.scheme != 0 || w.reserved != 0 || w.batch != 0 ||
        w.steps_total != 0 || w.payload_bytes != 0) {
      return absl::DataLossError(absl::StrCat("step header: kind ", w.kind,
                                              " carries step fields"));
    }
    return h;
  }
  const absl::Span<const core::Strategy> strategies = core::AllStrategies();
  if (std::find(strategies.begin(), strategies.end(), static_cast<core::Strategy>(w.strategy)) ==
      strategies.end()) {
    return absl::DataLossError(absl::StrCat("step header: unknown strategy ", w.strategy));
  }
  if (w.scheme >= static_cast<uint32_t>(core::kNumCommSchemes)) {
    return absl::DataLossError(absl::StrCat("step header: unknown scheme ", w.scheme));
  }
  if (w.payload_bytes < 0 || w.payload_bytes > kMaxPlanPayloadBytes) {
    return absl::DataLossError(absl::StrCat("step header: payload of ", w.payload_bytes,
                                            " bytes, want [0, ", kMaxPlanPayloadBytes, "]"));
  }
  if (w.reserved != 0 || w.batch < 0 || w.steps_total < 1) {
    return absl::DataLossError(absl::StrCat("step header: batch ", w.batch, ", steps ",
                                            w.steps_total, ", reserved ", w.reserved));
  }
  h.strategy = static_cast<core::Strategy>(w.strategy);
  h.scheme = static_cast<core::CommScheme>(w.scheme);
  h.batch = w.batch;
  h.steps_total = w.steps_total;
  h.payload_bytes = w.payload_bytes;
  return h;
}

absl::Status Broadcast(Communicator& comm, absl::Span<std::byte> data) {
  const int64_t bytes = static_cast<int64_t>(data.size());
  std::vector<int64_t> counts(comm.size(), 0);
  counts[0] = bytes;
  const std::vector<std::byte> in(data.begin(), comm.rank() == 0 ? data.end() : data.begin());
  return comm.AllGatherV(in, data, counts);
}

absl::Status BroadcastRound(Communicator& comm, StepHeader& header, std::string& payload) {
  if (comm.rank() == 0 && header.kind == RoundKind::kStep) {
    if (static_cast<int64_t>(payload.size()) > kMaxPlanPayloadBytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the plan's ", payload.size(),
                                                       " bytes exceed the step limit of ",
                                                       kMaxPlanPayloadBytes));
    }
    header.payload_bytes = static_cast<int64_t>(payload.size());
  }
  std::array<std::byte, kStepHeaderBytes> wire = EncodeStepHeader(header);
  FLASHCP_RETURN_IF_ERROR(Broadcast(comm, absl::MakeSpan(wire)));
  absl::StatusOr<StepHeader> decoded = DecodeStepHeader(wire);
  if (!decoded.ok()) {
    return absl::Status(decoded.status().code(),
                        absl::StrCat("from the driver: ", decoded.status().message()));
  }
  header = *decoded;
  if (header.kind != RoundKind::kStep) return absl::OkStatus();
  payload.resize(static_cast<size_t>(header.payload_bytes));
  return Broadcast(comm, absl::MakeSpan(reinterpret_cast<std::byte*>(payload.data()),
                                        payload.size()));
}

absl::StatusOr<std::vector<RankReport>> GatherReports(Communicator& comm,
                                                      const RankReport& mine) {
  WireReport w;
  w.attention_seconds = mine.attention_seconds;
  w.attention_cpu_seconds = mine.attention_cpu_seconds;
  w.stop = mine.stop ? 1 : 0;
  std::vector<WireReport> all(comm.size());
  const std::vector<int64_t> counts(comm.size(), sizeof(WireReport));
  FLASHCP_RETURN_IF_ERROR(comm.AllGatherV(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(&w), sizeof(w)),
      absl::MakeSpan(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(WireReport)),
      counts));
  std::vector<RankReport> out;
  out.reserve(all.size());
  for (const WireReport& x : all) {
    out.push_back({x.attention_seconds, x.attention_cpu_seconds, x.stop != 0});
  }
  return out;
}

absl::Status AgreeOnShape(Communicator& comm, const GroupShape& mine) {
  const std::array<int64_t, 4> w = {mine.context, mine.heads, mine.head_dim, mine.dtype_bytes};
  std::vector<std::array<int64_t, 4>> all(comm.size());
  const std::vector<int64_t> counts(comm.size(), sizeof(w));
  FLASHCP_RETURN_IF_ERROR(comm.AllGatherV(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(w.data()), sizeof(w)),
      absl::MakeSpan(reinterpret_cast<std::byte*>(all.data()), all.size() * sizeof(w)),
      counts));
  static constexpr std::array<const char*, 4> kNames = {"--context", "--heads", "--head_dim",
                                                        "dtype bytes (--device)"};
  for (size_t r = 1; r < all.size(); ++r) {
    for (size_t f = 0; f < kNames.size(); ++f) {
      if (all[r][f] != all[0][f]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "group shape: rank ", r, " has ", kNames[f], " ", all[r][f], ", rank 0 has ",
            all[0][f], "; every rank of a group must run the same context and model shape"));
      }
    }
  }
  return absl::OkStatus();
}

GroupTimes SummarizeReports(absl::Span<const RankReport> reports) {
  GroupTimes t;
  if (reports.empty()) return t;
  double sum = 0, max = 0, cpu_sum = 0, cpu_max = 0;
  t.use_cpu_seconds = true;
  for (const RankReport& r : reports) {
    sum += r.attention_seconds;
    max = std::max(max, r.attention_seconds);
    cpu_sum += r.attention_cpu_seconds;
    cpu_max = std::max(cpu_max, r.attention_cpu_seconds);
    t.use_cpu_seconds &= r.attention_cpu_seconds > 0;
    t.stop |= r.stop;
  }
  const double n = static_cast<double>(reports.size());
  t.mean_attention_seconds = sum / n;
  t.measured_imbalance = t.mean_attention_seconds > 0 ? max / t.mean_attention_seconds : 1.0;
  t.cpu_imbalance = t.use_cpu_seconds ? cpu_max / (cpu_sum / n) : 0.0;
  t.min_fit_seconds = std::numeric_limits<double>::infinity();
  for (const RankReport& r : reports) {
    t.min_fit_seconds = std::min(
        t.min_fit_seconds, t.use_cpu_seconds ? r.attention_cpu_seconds : r.attention_seconds);
  }
  return t;
}

}  // namespace flashcp::worker
