#include "core/internal/targeted_phase.h"

#include <algorithm>
#include <numeric>

namespace flashcp::core::internal {
namespace {

// Per-document buffers of TargetedPhase, allocated once per call: at most n
// distinct owners per document, and usually at most two pieces per owner (a
// zigzag's), so they are not regrown document after document.
struct Scratch {
  Scratch(int32_t n, size_t nodes, bool rank_inter) : last_pos(n, -1), own_before(n, 0) {
    const size_t pieces_hint = 2 * static_cast<size_t>(n) + 1;
    touched.reserve(n);
    prefix_tokens.reserve(pieces_hint);
    distinct_after.reserve(pieces_hint);
    node_distinct.assign(nodes, 0);
    if (rank_inter) node_tokens.assign(nodes, 0);
  }
  std::vector<int32_t> last_pos;        // per rank: its last piece of the document, or -1
  std::vector<int64_t> own_before;      // per rank: its tokens among the pieces seen so far
  std::vector<int32_t> touched;         // the document's distinct owners
  std::vector<int64_t> prefix_tokens;   // tokens of pieces [0, k)
  std::vector<int32_t> distinct_after;  // [k]: distinct owners of pieces k+1..count-1
  std::vector<int32_t> later;           // distinct owners of the pieces after the current one
  std::vector<int32_t> node_distinct;   // per node: distinct owners of later pieces
  std::vector<int64_t> node_tokens;     // per node: tokens of the pieces before the current one
};

// One document's pieces [b, b + count) of index.shards, in order.
struct DocPieces {
  const Plan& plan;
  const DocIndex& index;
  int32_t b, count;
  const Shard& operator[](int32_t k) const { return plan.shards[index.shards[b + k]]; }
};

// Fills touched, last_pos, distinct_after and prefix_tokens for one document.
void IndexDoc(const DocPieces& doc, Scratch& s) {
  s.touched.clear();
  for (int32_t k = 0; k < doc.count; ++k) {
    const int32_t r = doc[k].rank;
    if (s.last_pos[r] < 0) s.touched.push_back(r);
    s.last_pos[r] = k;
  }
  s.distinct_after.assign(doc.count, 0);
  int32_t distinct = 0;
  for (int32_t k = doc.count - 1; k >= 0; --k) {
    s.distinct_after[k] = distinct;
    if (s.last_pos[doc[k].rank] == k) ++distinct;
  }
  s.prefix_tokens.assign(doc.count + 1, 0);
  for (int32_t k = 0; k < doc.count; ++k) s.prefix_tokens[k + 1] = s.prefix_tokens[k] + doc[k].len;
}

// Adds one document's inter-node tokens to *inter and, if set, rank_inter.
void AddInterDoc(const DocPieces& doc, int32_t per_node, Scratch& s, int64_t* inter,
                 std::array<std::vector<int64_t>, 2>* rank_inter) {
  // Piece k goes to the distinct owners of later pieces but itself; of
  // those, the ones outside its node: walk back, counting owners per node.
  for (int32_t k = doc.count - 1; k >= 0; --k) {
    const Shard& p = doc[k];
    const int32_t node = p.rank / per_node;
    const int32_t later_total = s.distinct_after[k];
    const int32_t later_here = s.node_distinct[node];
    const bool owner_later = s.last_pos[p.rank] > k;
    // The owner's own later piece counts in both; the rest of its node's are intra.
    const int64_t piece_inter = p.len * ((later_total - (owner_later ? 1 : 0)) -
                                         (later_here - (owner_later ? 1 : 0)));
    *inter += piece_inter;
    if (rank_inter != nullptr) (*rank_inter)[0][p.rank] += piece_inter;
    if (s.last_pos[p.rank] == k) ++s.node_distinct[node];
  }
  for (int32_t r : s.touched) s.node_distinct[r / per_node] = 0;
  if (rank_inter == nullptr) return;
  // Rank r receives the pieces before its last one held off its node.
  for (int32_t k = 0; k < doc.count; ++k) {
    const Shard& p = doc[k];
    const int32_t node = p.rank / per_node;
    if (s.last_pos[p.rank] == k) {
      (*rank_inter)[1][p.rank] += s.prefix_tokens[k] - s.node_tokens[node];
    }
    s.node_tokens[node] += p.len;
  }
  for (int32_t r : s.touched) s.node_tokens[r / per_node] = 0;
}

// Adds one document's tokens per (sender, receiver) pair to pairs (N x N).
void AddPairsDoc(const DocPieces& doc, int32_t n, Scratch& s, std::vector<int64_t>& pairs) {
  // Piece k goes to each distinct owner of a later piece but its own.
  s.later.clear();
  for (int32_t k = doc.count - 1; k >= 0; --k) {
    const Shard& p = doc[k];
    for (int32_t dest : s.later) {
      if (dest != p.rank) pairs[static_cast<size_t>(p.rank) * n + dest] += p.len;
    }
    if (s.last_pos[p.rank] == k) s.later.push_back(p.rank);
  }
}

}  // namespace

DocIndex IndexByDoc(const Plan& plan) {
  const size_t n_docs = plan.doc_lens.size();
  DocIndex index;
  index.begin.assign(n_docs + 1, 0);
  for (const Shard& s : plan.shards) ++index.begin[s.doc + 1];
  std::partial_sum(index.begin.begin(), index.begin.end(), index.begin.begin());
  index.shards.resize(plan.shards.size());
  std::vector<int32_t> fill(index.begin.begin(), index.begin.end() - 1);
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    index.shards[fill[plan.shards[i].doc]++] = static_cast<int32_t>(i);
  }
  // Most documents are whole (one shard) and many cut ones come in order:
  // those need no sort.
  const auto by_start = [&](int32_t a, int32_t b) {
    return plan.shards[a].start < plan.shards[b].start;
  };
  for (size_t d = 0; d < n_docs; ++d) {
    const auto first = index.shards.begin() + index.begin[d];
    const auto last = index.shards.begin() + index.begin[d + 1];
    if (last - first > 1 && !std::is_sorted(first, last, by_start)) {
      std::sort(first, last, by_start);
    }
  }
  return index;
}

void TargetedPhase(const Plan& plan, const DocIndex& index, std::vector<int64_t>& fwd_sent,
                   std::vector<int64_t>& fwd_recv, int32_t ranks_per_node, int64_t* inter,
                   std::vector<int64_t>* pairs, std::array<std::vector<int64_t>, 2>* rank_inter) {
  const int32_t n = plan.cp_size;
  const int32_t per_node = ranks_per_node <= 0 ? n : ranks_per_node;
  const size_t nodes = static_cast<size_t>((n + per_node - 1) / per_node);
  if (inter != nullptr) *inter = 0;
  if (rank_inter != nullptr) {
    (*rank_inter)[0].assign(n, 0);
    (*rank_inter)[1].assign(n, 0);
  }
  // Forward KV tokens each rank sends and receives under kTargeted, counted
  // in O(pieces) per document: rank d receives every piece before its own last
  // piece of the document that it does not own itself.
  fwd_sent.assign(n, 0);
  fwd_recv.assign(n, 0);
  Scratch s(n, nodes, rank_inter != nullptr);
  for (size_t d = 0; d < plan.doc_lens.size(); ++d) {
    const DocPieces doc{plan, index, index.begin[d], index.begin[d + 1] - index.begin[d]};
    if (doc.count <= 1 || n == 1) continue;
    IndexDoc(doc, s);
    // Received by r: tokens of pieces before last_pos[r], minus r's own among them.
    for (int32_t k = 0; k < doc.count; ++k) {
      const Shard& p = doc[k];
      const bool owner_later = s.last_pos[p.rank] > k;
      fwd_sent[p.rank] += p.len * (s.distinct_after[k] - (owner_later ? 1 : 0));
      if (k < s.last_pos[p.rank]) s.own_before[p.rank] += p.len;
    }
    if (inter != nullptr) AddInterDoc(doc, per_node, s, inter, rank_inter);
    if (pairs != nullptr) AddPairsDoc(doc, n, s, *pairs);
    for (int32_t r : s.touched) {
      fwd_recv[r] += s.prefix_tokens[s.last_pos[r]] - s.own_before[r];
      s.own_before[r] = 0;
      s.last_pos[r] = -1;
    }
  }
}

}  // namespace flashcp::core::internal
