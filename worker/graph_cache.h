// The shape class of a cuDNN SDPA graph and the bounded cache of graphs keyed
// by it (worker/cuda/cudnn_attention.h builds the graphs). Built without CUDA:
// the key is a pure function of a varlen batch's lengths, and the cache is a
// plain LRU over whatever the caller caches (a frontend graph on the GPU, a
// fake in graph_cache_test), so both are tested on any machine.
//
// Why shape classes: a training run's batches differ in document lengths at
// every step; a graph is built for (direction, mask, sequences, max lengths
// rounded up to a power of two), the true lengths come per call, so batches
// of one class reuse one graph (no rebuild, which costs up to seconds).
#ifndef FLASHCP_WORKER_GRAPH_CACHE_H_
#define FLASHCP_WORKER_GRAPH_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace flashcp::worker {

struct GraphKey {
  bool backward = false;
  // Every sequence has q_len == kv_len: the top-left causal mask is the same
  // mask as the bottom-right one (cuDNN runs it faster, docs/gpu.md).
  bool top_left = false;
  int64_t sequences = 0;
  int64_t max_q = 0;   // GraphLen of the longest query side
  int64_t max_kv = 0;  // GraphLen of the longest key side

  friend bool operator==(const GraphKey& x, const GraphKey& y) {
    return std::tie(x.backward, x.top_left, x.sequences, x.max_q, x.max_kv) ==
           std::tie(y.backward, y.top_left, y.sequences, y.max_q, y.max_kv);
  }
  friend bool operator<(const GraphKey& x, const GraphKey& y) {
    return std::tie(x.backward, x.top_left, x.sequences, x.max_q, x.max_kv) <
           std::tie(y.backward, y.top_left, y.sequences, y.max_q, y.max_kv);
  }
};

// A graph's max sequence length: the next power of two, at least 64 (x <= 64
// gives 64). The floor keeps cuDNN off degenerate dims: the frontend's
// validate refuses s_q = s_kv = 1 (GRAPH_NOT_SUPPORTED), and a graph with
// s_q = 1 (a rank whose prefixed pieces were all one token) left a row of
// statistics unwritten (device check, 2026-11-29). The true lengths come in
// seq_len; a larger dim costs empty tiles and backward workspace, which the
// frontend sizes from the dims (fp32 dQ and softmax sums, about
// b * s_q * heads_q * (D + 1) * 4 bytes).
int64_t GraphLen(int64_t x);

// The class of a varlen batch of q_len.size() sequences (q_len[i] queries
// over kv_len[i] keys; sizes equal, checked by the batch that holds them).
// top_left unless `always_bottom_right` or some q_len[i] != kv_len[i].
GraphKey MakeGraphKey(bool backward, bool always_bottom_right, absl::Span<const int32_t> q_len,
                      absl::Span<const int32_t> kv_len);

// e.g. "bwd top_left b=3 s_q=128 s_kv=128", for messages and tests.
std::string GraphKeyString(const GraphKey& key);

// Counters since the cache was made. Every lookup is a hit or a miss; every
// miss calls the builder once, which either builds (builds) or is rejected
// (rejected: cached too, so a shape cuDNN refuses is not retried each call).
struct GraphCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t builds = 0;
  int64_t rejected = 0;
  int64_t evictions = 0;  // entries dropped, least recently used first
  int64_t size = 0;       // entries held now (<= capacity)
  int64_t capacity = 0;
};

// At most `capacity` entries (at least 1), least recently used evicted first.
// Not thread-safe (its owner serializes calls). An entry is an
// absl::StatusOr<V>: the built value or why the builder failed.
template <typename V>
class GraphCache {
 public:
  using Entry = absl::StatusOr<V>;

  explicit GraphCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The entry of `key`, moved to most recently used: cached (a hit) or made
  // by `build()` (a miss; build returns absl::StatusOr<V>). Where the insert
  // goes beyond capacity the least recently used entry is moved into
  // `*evicted` (the caller decides when it may be destroyed: a graph may
  // still be running on a stream). The reference is valid until the next
  // Get.
  template <typename Build>
  Entry& Get(const GraphKey& key, Build&& build, std::vector<Entry>* evicted) {
    auto found = index_.find(key);
    if (found != index_.end()) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, found->second);
      return found->second->second;
    }
    ++stats_.misses;
    Entry made = build();
    if (made.ok()) ++stats_.builds;
    else ++stats_.rejected;
    lru_.emplace_front(key, std::move(made));
    index_[key] = lru_.begin();
    while (lru_.size() > capacity_) {
      auto last = std::prev(lru_.end());
      index_.erase(last->first);
      if (evicted != nullptr) evicted->push_back(std::move(last->second));
      lru_.erase(last);
      ++stats_.evictions;
    }
    return lru_.front().second;
  }

  GraphCacheStats stats() const {
    GraphCacheStats s = stats_;
    s.size = static_cast<int64_t>(lru_.size());
    s.capacity = static_cast<int64_t>(capacity_);
    return s;
  }

  // The keys held, most recently used first.
  std::vector<GraphKey> Keys() const {
    std::vector<GraphKey> keys;
    for (const auto& [key, entry] : lru_) keys.push_back(key);
    return keys;
  }

  // Drops every entry (the counters stay).
  void Clear() {
    index_.clear();
    lru_.clear();
  }

 private:
  size_t capacity_;
  std::list<std::pair<GraphKey, Entry>> lru_;  // most recently used first
  std::map<GraphKey, typename std::list<std::pair<GraphKey, Entry>>::iterator> index_;
  GraphCacheStats stats_;
};

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_GRAPH_CACHE_H_
