#include "core/internal/flashcp_nodes.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "core/analysis.h"

namespace flashcp::core::internal {
namespace {

// The problem on ranks: symmetric pair weights w[a * n + b] (tokens a and b
// exchange, both ways), each rank's class (its real token count: 0 full, 1
// one padding token) and each node's slots per class.
struct Graph {
  int32_t n = 0;
  int32_t nodes = 0;
  std::vector<int64_t> w;
  std::vector<uint8_t> cls;                    // per rank
  std::vector<std::array<int32_t, 2>> quota;  // per node: slots of class 0 and 1
  int64_t weight(int32_t a, int32_t b) const { return w[static_cast<size_t>(a) * n + b]; }
};

// Tokens exchanged within nodes, summed over pairs, under `node_of`.
int64_t IntraTokens(const Graph& g, const std::vector<int32_t>& node_of) {
  int64_t intra = 0;
  for (int32_t a = 0; a < g.n; ++a) {
    for (int32_t b = a + 1; b < g.n; ++b) {
      if (node_of[a] == node_of[b]) intra += g.weight(a, b);
    }
  }
  return intra;
}

// Nodes filled one after another: a node's first two ranks are the
// heaviest pair of free ranks its slots take, then the free rank exchanging
// most with its ranks so far; ties to the lowest ids. Every node takes
// exactly its slots of each class, so the last one takes what is left.
std::vector<int32_t> GreedyFill(const Graph& g) {
  std::vector<int32_t> node_of(g.n, -1);
  std::vector<int64_t> to_node(g.n);  // weight of each free rank to the node being filled
  for (int32_t k = 0; k < g.nodes; ++k) {
    std::array<int32_t, 2> left = g.quota[k];
    std::fill(to_node.begin(), to_node.end(), 0);
    const auto fits = [&](int32_t r) { return node_of[r] < 0 && left[g.cls[r]] > 0; };
    const auto take = [&](int32_t r) {
      node_of[r] = k;
      --left[g.cls[r]];
      for (int32_t x = 0; x < g.n; ++x) to_node[x] += g.weight(r, x);
    };
    if (left[0] + left[1] >= 2) {
      int32_t best_a = -1, best_b = -1;
      int64_t best = -1;
      for (int32_t a = 0; a < g.n; ++a) {
        if (!fits(a)) continue;
        --left[g.cls[a]];
        for (int32_t b = a + 1; b < g.n; ++b) {
          if (fits(b) && g.weight(a, b) > best) {
            best = g.weight(a, b);
            best_a = a;
            best_b = b;
          }
        }
        ++left[g.cls[a]];
      }
      take(best_a);
      take(best_b);
    }
    while (left[0] + left[1] > 0) {
      int32_t best_r = -1;
      for (int32_t r = 0; r < g.n; ++r) {
        if (fits(r) && (best_r < 0 || to_node[r] > to_node[best_r])) best_r = r;
      }
      take(best_r);
    }
  }
  return node_of;
}

// Kernighan-Lin passes over `node_of`, in place: a pass swaps the two
// unlocked ranks of one class on different nodes whose swap gains most
// intra-node weight (gains may be negative), locking both, until none are
// left or kNodePlacementStall swaps have followed its best prefix (the
// prefix of largest total gain; longer runs seldom recover), then keeps that
// prefix; a pass whose best prefix gains nothing ends the search.
class KernighanLinSearch {
 public:
  KernighanLinSearch(const Graph& g, std::vector<int32_t>& node_of)
      : g_(g),
        n_(g.n),
        node_of_(node_of),
        conn_(static_cast<size_t>(n_) * g.nodes, 0),
        locked_(n_),
        here_(n_),
        lift_(static_cast<size_t>(2) * g.nodes * g.nodes),
        members_(g.nodes) {
    for (int32_t a = 0; a < n_; ++a) {
      for (int32_t b = 0; b < n_; ++b) {
        if (a != b) At(a, node_of_[b]) += g_.weight(a, b);
      }
    }
  }

  // One pass; the gain of the prefix it keeps.
  int64_t Pass() {
    std::fill(locked_.begin(), locked_.end(), 0);
    swaps_.clear();
    int64_t total = 0, best_total = 0;
    size_t best_len = 0;
    while (true) {
      int32_t a = -1, b = -1;
      int64_t gain = 0;
      if (!BestSwap(a, b, gain)) break;
      Swap(a, b);
      locked_[a] = locked_[b] = 1;
      swaps_.emplace_back(a, b);
      total += gain;
      if (total > best_total) {
        best_total = total;
        best_len = swaps_.size();
      }
      if (swaps_.size() >= best_len + kNodePlacementStall) break;
    }
    // Undo the swaps after the best prefix (a swap is its own inverse).
    for (size_t i = swaps_.size(); i > best_len; --i) {
      Swap(swaps_[i - 1].first, swaps_[i - 1].second);
    }
    return best_total;
  }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  struct NodePair {
    int64_t bound;
    int32_t cls, k1, k2;
  };

  // conn(r, k): weight between rank r and the ranks of node k but r.
  int64_t& At(int32_t r, int32_t k) { return conn_[static_cast<size_t>(r) * g_.nodes + k]; }
  int64_t& Lift(int32_t c, int32_t k1, int32_t k2) {
    return lift_[(static_cast<size_t>(c) * g_.nodes + k1) * g_.nodes + k2];
  }

  // Rank a to node kb and rank b to node ka, updating conn.
  void Swap(int32_t a, int32_t b) {
    const int32_t ka = node_of_[a], kb = node_of_[b];
    for (int32_t x = 0; x < n_; ++x) {
      const int64_t d = g_.weight(x, b) - g_.weight(x, a);
      At(x, ka) += d;
      At(x, kb) -= d;
    }
    node_of_[a] = kb;
    node_of_[b] = ka;
  }

  // Per class and node pair, the best lift of a free rank: lift(x, k) =
  // conn(x, k) - conn(x, node of x) is what moving x alone to k gains;
  // the free ranks per node into members_.
  void BuildLifts() {
    for (int32_t x = 0; x < n_; ++x) here_[x] = At(x, node_of_[x]);
    std::fill(lift_.begin(), lift_.end(), kNone);
    for (auto& m : members_) m.clear();
    for (int32_t x = 0; x < n_; ++x) {
      if (locked_[x]) continue;
      members_[node_of_[x]].push_back(x);
      for (int32_t k = 0; k < g_.nodes; ++k) {
        Lift(g_.cls[x], node_of_[x], k) = std::max(Lift(g_.cls[x], node_of_[x], k),
                                                   At(x, k) - here_[x]);
      }
    }
    pairs_.clear();
    for (int32_t c = 0; c < 2; ++c) {
      for (int32_t k1 = 0; k1 < g_.nodes; ++k1) {
        for (int32_t k2 = k1 + 1; k2 < g_.nodes; ++k2) {
          const int64_t u = Lift(c, k1, k2), v = Lift(c, k2, k1);
          if (u != kNone && v != kNone) pairs_.push_back({u + v, c, k1, k2});
        }
      }
    }
    std::sort(pairs_.begin(), pairs_.end(), [](const NodePair& x, const NodePair& y) {
      return std::tie(y.bound, x.cls, x.k1, x.k2) < std::tie(x.bound, y.cls, y.k1, y.k2);
    });
  }

  // The best swap of free ranks a (node ka) and b (node kb) of one class:
  // it gains lift(a, kb) + lift(b, ka) - 2 w(a, b). With w >= 0, the best
  // lifts of a node pair bound its swaps: node pairs are tried by bound,
  // highest first, until one falls below the best gain found (equal ones
  // are still tried, for the lowest ids). False where no two free ranks of
  // a class sit on different nodes.
  bool BestSwap(int32_t& best_a, int32_t& best_b, int64_t& best_gain) {
    BuildLifts();
    for (const NodePair& p : pairs_) {
      if (best_a >= 0 && p.bound < best_gain) break;
      for (int32_t a : members_[p.k1]) {
        if (g_.cls[a] != p.cls) continue;
        for (int32_t b : members_[p.k2]) {
          if (g_.cls[b] != p.cls) continue;
          const int64_t gain =
              At(a, p.k2) - here_[a] + At(b, p.k1) - here_[b] - 2 * g_.weight(a, b);
          const int32_t lo = std::min(a, b), hi = std::max(a, b);
          if (best_a < 0 || gain > best_gain ||
              (gain == best_gain && std::tie(lo, hi) < std::tie(best_a, best_b))) {
            best_gain = gain;
            best_a = lo;
            best_b = hi;
          }
        }
      }
    }
    return best_a >= 0;
  }

  const Graph& g_;
  const int32_t n_;
  std::vector<int32_t>& node_of_;
  std::vector<int64_t> conn_;
  std::vector<uint8_t> locked_;
  std::vector<std::pair<int32_t, int32_t>> swaps_;
  // Scratch of one swap's search.
  std::vector<int64_t> here_;   // conn(x, node of x)
  std::vector<int64_t> lift_;   // [class][k1][k2]
  std::vector<std::vector<int32_t>> members_;  // free ranks per node
  std::vector<NodePair> pairs_;
};

void KernighanLin(const Graph& g, std::vector<int32_t>& node_of) {
  KernighanLinSearch search(g, node_of);
  for (int32_t pass = 0; pass < kNodePlacementPasses; ++pass) {
    if (search.Pass() <= 0) return;
  }
}

int32_t NodesOf(int32_t n, int32_t per_node) { return (n + per_node - 1) / per_node; }

}  // namespace

int64_t InterNodeTokens(absl::Span<const int64_t> pair_tokens, int32_t cp_size,
                        int32_t ranks_per_node) {
  const int32_t per_node = ranks_per_node <= 0 ? cp_size : ranks_per_node;
  int64_t inter = 0;
  for (int32_t a = 0; a < cp_size; ++a) {
    for (int32_t b = 0; b < cp_size; ++b) {
      if (a / per_node != b / per_node) inter += pair_tokens[static_cast<size_t>(a) * cp_size + b];
    }
  }
  return inter;
}

std::vector<int32_t> NodePlacement(const Plan& plan, int32_t ranks_per_node) {
  const int32_t n = plan.cp_size;
  std::vector<int32_t> identity(n);
  for (int32_t r = 0; r < n; ++r) identity[r] = r;
  if (ranks_per_node <= 0 || ranks_per_node >= n) return identity;
  const std::vector<int64_t> tokens = TargetedPairTokens(plan);
  const int32_t per_node = ranks_per_node;
  if (InterNodeTokens(tokens, n, per_node) == 0) return identity;

  Graph g;
  g.n = n;
  g.nodes = NodesOf(n, per_node);
  g.w.resize(tokens.size());
  for (int32_t a = 0; a < n; ++a) {
    for (int32_t b = 0; b < n; ++b) {
      g.w[static_cast<size_t>(a) * n + b] = tokens[static_cast<size_t>(a) * n + b] +
                                            tokens[static_cast<size_t>(b) * n + a];
    }
  }
  // The last `padding` ranks hold one real token less (core/types.h).
  g.cls.resize(n);
  g.quota.assign(g.nodes, {0, 0});
  for (int32_t r = 0; r < n; ++r) {
    g.cls[r] = r >= n - plan.padding ? 1 : 0;
    ++g.quota[r / per_node][g.cls[r]];
  }

  std::vector<int32_t> own(n);
  for (int32_t r = 0; r < n; ++r) own[r] = r / per_node;
  const int64_t own_intra = IntraTokens(g, own);
  std::vector<int32_t> kept = own;
  KernighanLin(g, kept);
  std::vector<int32_t> filled = GreedyFill(g);
  KernighanLin(g, filled);
  int64_t best_intra = IntraTokens(g, kept);
  if (const int64_t f = IntraTokens(g, filled); f > best_intra) {
    best_intra = f;
    kept = std::move(filled);
  }
  if (best_intra <= own_intra) return identity;

  // Within a node, its ranks take its rank ids in their order, each class
  // the ids of its class (the padded ids are the last ones).
  std::vector<int32_t> new_rank(n, -1);
  std::vector<std::array<int32_t, 2>> next(g.nodes);
  for (int32_t k = 0; k < g.nodes; ++k) {
    next[k] = {k * per_node, k * per_node + g.quota[k][0]};
  }
  for (int32_t r = 0; r < n; ++r) new_rank[r] = next[kept[r]][g.cls[r]]++;
  return new_rank;
}

Plan RelabelRanks(const Plan& plan, absl::Span<const int32_t> new_rank) {
  const int32_t n = plan.cp_size;
  // Shards are grouped by rank ascending: rank r's are [begin[r], begin[r + 1]).
  std::vector<size_t> begin(n + 1, 0);
  for (const Shard& s : plan.shards) ++begin[s.rank + 1];
  for (int32_t r = 0; r < n; ++r) begin[r + 1] += begin[r];
  std::vector<int32_t> old_rank(n);
  for (int32_t r = 0; r < n; ++r) old_rank[new_rank[r]] = r;
  Plan out;
  out.cp_size = n;
  out.doc_lens = plan.doc_lens;
  out.padding = plan.padding;
  out.shards.reserve(plan.shards.size());
  for (int32_t q = 0; q < n; ++q) {
    const int32_t r = old_rank[q];
    for (size_t i = begin[r]; i < begin[r + 1]; ++i) {
      out.shards.push_back(plan.shards[i]);
      out.shards.back().rank = q;
    }
  }
  return out;
}

Plan PlaceRanksOnNodes(Plan plan, int32_t ranks_per_node, absl::Span<const double> rank_speed) {
  if (ranks_per_node <= 0 || ranks_per_node >= plan.cp_size) return plan;  // one node
  // Speeds that differ make each rank's budget its own (cost_model.h).
  if (std::adjacent_find(rank_speed.begin(), rank_speed.end(), std::not_equal_to<>()) !=
      rank_speed.end()) {
    return plan;
  }
  const std::vector<int32_t> new_rank = NodePlacement(plan, ranks_per_node);
  for (int32_t r = 0; r < plan.cp_size; ++r) {
    if (new_rank[r] != r) return RelabelRanks(plan, new_rank);
  }
  return plan;
}

}  // namespace flashcp::core::internal
