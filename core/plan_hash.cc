#include "core/plan_hash.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

#ifndef FLASHCP_VERSION
#error "FLASHCP_VERSION is set by core/CMakeLists.txt (PROJECT_VERSION) for this file"
#endif

namespace flashcp::core {
namespace {

constexpr uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

// The encoding written once, consumed by either a hash or a string, so that
// PlanHash and PlanHashBytes cannot drift apart.
template <typename Sink>
void Encode(const Plan& plan, Sink& sink) {
  sink.Bytes(kPlanHashPrefix);
  const auto int64 = [&sink](int64_t v) {
    const uint64_t u = static_cast<uint64_t>(v);
    char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<char>((u >> (8 * i)) & 0xff);
    sink.Bytes(absl::string_view(le, 8));
  };
  int64(plan.cp_size);
  int64(plan.padding);
  int64(static_cast<int64_t>(plan.doc_lens.size()));
  for (int64_t len : plan.doc_lens) int64(len);
  int64(static_cast<int64_t>(plan.shards.size()));
  for (const Shard& s : plan.shards) {
    int64(s.doc);
    int64(s.start);
    int64(s.len);
    int64(s.rank);
  }
  // The mask section: empty for the causal document mask (plan_hash.h);
  // under another mask its id (MaskKind) and block size.
  if (plan.mask.kind != MaskKind::kCausalDocument) {
    int64(static_cast<int64_t>(plan.mask.kind));
    int64(plan.mask.block_size);
  }
}

struct HashSink {
  uint64_t h = kFnvOffsetBasis;
  void Bytes(absl::string_view b) {
    for (char c : b) {
      h ^= static_cast<uint8_t>(c);
      h *= kFnvPrime;
    }
  }
};

struct StringSink {
  std::string out;
  void Bytes(absl::string_view b) { out.append(b.data(), b.size()); }
};

}  // namespace

uint64_t Fnv1a64(absl::string_view bytes) {
  HashSink sink;
  sink.Bytes(bytes);
  return sink.h;
}

std::string PlanHashBytes(const Plan& plan) {
  StringSink sink;
  sink.out.reserve(kPlanHashPrefix.size() + 8 * (4 + plan.doc_lens.size() + 4 * plan.shards.size()));
  Encode(plan, sink);
  return std::move(sink.out);
}

uint64_t PlanHash(const Plan& plan) {
  HashSink sink;
  Encode(plan, sink);
  return sink.h;
}

std::string PlanHashHex(uint64_t hash) { return absl::StrFormat("%016x", hash); }

absl::string_view PlannerVersion() { return FLASHCP_VERSION; }

}  // namespace flashcp::core
