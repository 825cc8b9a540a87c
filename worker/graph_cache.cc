#include "worker/graph_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flashcp::worker {

int64_t GraphLen(int64_t x) {
  int64_t p = 64;
  while (p < x) p <<= 1;
  return p;
}

GraphKey MakeGraphKey(bool backward, bool always_bottom_right, absl::Span<const int32_t> q_len,
                      absl::Span<const int32_t> kv_len) {
  GraphKey key;
  key.backward = backward;
  key.top_left = !always_bottom_right;
  key.sequences = static_cast<int64_t>(q_len.size());
  int64_t max_q = 0, max_kv = 0;
  for (size_t i = 0; i < q_len.size(); ++i) {
    const int32_t kv = i < kv_len.size() ? kv_len[i] : 0;
    if (q_len[i] != kv) key.top_left = false;
    max_q = std::max<int64_t>(max_q, q_len[i]);
    max_kv = std::max<int64_t>(max_kv, kv);
  }
  key.max_q = GraphLen(max_q);
  key.max_kv = GraphLen(max_kv);
  return key;
}

std::string GraphKeyString(const GraphKey& key) {
  return absl::StrCat(key.backward ? "bwd" : "fwd", key.top_left ? " top_left" : " bottom_right",
                      " b=", key.sequences, " s_q=", key.max_q, " s_kv=", key.max_kv);
}

}  // namespace flashcp::worker
