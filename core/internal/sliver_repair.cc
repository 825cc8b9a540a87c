// SliverRepair's state, edits and chain search (sliver_repair.h).
#include "core/internal/sliver_repair.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

namespace flashcp::core::internal {

void SliverRepair::Reset(int32_t n, int64_t m, double max_work, int64_t max_nonlast_growth) {
  n_ = n;
  m_ = m;
  max_work_ = max_work;
  max_nonlast_growth_ = max_nonlast_growth;
  for (std::vector<Piece>& p : docs) {
    p.clear();
    spare_docs_.push_back(std::move(p));
  }
  docs.clear();
  doc_index.clear();
  whole.resize(n);
  for (auto& w : whole) w.clear();
  dirty_ = true;
  exact_ = false;
  work_valid_ = nonlast_valid_ = false;
  banned_.clear();
}

void SliverRepair::Load(const Batch& batch, std::span<const Shard> pieces) {
  // Counted first, so that each list is allocated once: per document its
  // cut pieces, per rank its whole documents.
  std::vector<int32_t>& count = count_;
  count.assign(batch.doc_lens.size(), 0);
  std::vector<int32_t>& whole_count = parent_;  // its buffer (FindChain assigns it)
  whole_count.assign(n_, 0);
  int64_t total = 0;
  size_t cut_docs = 0;
  for (const Shard& s : pieces) {
    total += s.len;
    if (s.len == 0) continue;
    if (s.len == batch.doc_lens[s.doc]) {
      ++whole_count[s.rank];
    } else if (count[s.doc]++ == 0) {
      ++cut_docs;
    }
  }
  for (int32_t r = 0; r < n_; ++r) whole[r].reserve(whole_count[r]);
  docs.reserve(cut_docs);
  doc_index.reserve(cut_docs);
  std::vector<int32_t>& slot = slot_;  // per document, its entry in `docs`
  slot.assign(batch.doc_lens.size(), -1);
  for (const Shard& s : pieces) {
    if (s.len == 0) continue;
    if (s.len == batch.doc_lens[s.doc]) {
      whole[s.rank].push_back({s.len, s.doc});
      continue;
    }
    if (slot[s.doc] < 0) {
      slot[s.doc] = static_cast<int32_t>(docs.size());
      if (spare_docs_.empty()) {
        docs.emplace_back();
      } else {
        docs.push_back(std::move(spare_docs_.back()));
        spare_docs_.pop_back();
      }
      docs.back().reserve(count[s.doc]);
      doc_index.push_back(s.doc);
    }
    docs[slot[s.doc]].push_back(Piece{s.start, s.len, s.rank});
  }
  exact_ = WorkloadsExact(total);
  // Sorted and merged; documents left whole move to `whole`.
  size_t kept = 0;
  for (size_t c = 0; c < docs.size(); ++c) {
    std::vector<Piece>& p = docs[c];
    std::sort(p.begin(), p.end(),
              [](const Piece& x, const Piece& y) { return x.start < y.start; });
    size_t k = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (k > 0 && p[k - 1].rank == p[i].rank && p[k - 1].start + p[k - 1].len == p[i].start) {
        p[k - 1].len += p[i].len;
      } else {
        p[k++] = p[i];
      }
    }
    p.resize(k);
    if (k == 1) {
      whole[p[0].rank].push_back({p[0].len, doc_index[c]});
      continue;
    }
    if (kept != c) {
      docs[kept] = std::move(p);
      doc_index[kept] = doc_index[c];
    }
    ++kept;
  }
  for (size_t c = kept; c < docs.size(); ++c) {
    docs[c].clear();
    spare_docs_.push_back(std::move(docs[c]));
  }
  docs.resize(kept);
  doc_index.resize(kept);
  // The plan's order of cut documents (a plan's shards already have it).
  std::vector<std::pair<int32_t, int32_t>> keys(kept);  // (lowest rank, document)
  for (size_t c = 0; c < kept; ++c) {
    int32_t low = docs[c][0].rank;
    for (const Piece& x : docs[c]) low = std::min(low, x.rank);
    keys[c] = {low, doc_index[c]};
  }
  if (!std::is_sorted(keys.begin(), keys.end())) {
    std::vector<size_t> perm(kept);
    std::iota(perm.begin(), perm.end(), size_t{0});
    std::sort(perm.begin(), perm.end(), [&](size_t x, size_t y) { return keys[x] < keys[y]; });
    std::vector<std::vector<Piece>> sorted(kept);
    for (size_t c = 0; c < kept; ++c) {
      sorted[c] = std::move(docs[perm[c]]);
      doc_index[c] = keys[perm[c]].second;
    }
    docs = std::move(sorted);
  }
}

const std::vector<double>& SliverRepair::RankWorkloads() {
  if (!work_valid_) {
    work_.assign(n_, 0.0);
    for (const std::vector<Piece>& d : docs) {
      for (const Piece& x : d) work_[x.rank] += RangeWorkload(x.start, x.len);
    }
    for (int32_t r = 0; r < n_; ++r) {
      for (const auto& [len, doc] : whole[r]) work_[r] += RangeWorkload(0, len);
    }
    work_valid_ = true;
  }
  return work_;
}

const std::vector<int64_t>& SliverRepair::RankNonlast() {
  if (!nonlast_valid_) {
    nonlast_.assign(n_, 0);
    for (const std::vector<Piece>& d : docs) {
      for (size_t k = 0; k + 1 < d.size(); ++k) nonlast_[d[k].rank] += d[k].len;
    }
    nonlast_valid_ = true;
  }
  return nonlast_;
}

void SliverRepair::BeginEdit(size_t c) {
  const std::vector<Piece>& p = docs[c];
  if (work_valid_) {
    if (exact_) {
      for (const Piece& x : p) work_[x.rank] -= RangeWorkload(x.start, x.len);
    } else {
      work_valid_ = false;
    }
  }
  if (nonlast_valid_) {
    for (size_t k = 0; k + 1 < p.size(); ++k) nonlast_[p[k].rank] -= p[k].len;
  }
  if (!dirty_) {
    const auto doc = static_cast<int32_t>(c);
    for (const Piece& x : p) {
      std::vector<Edge>& edges = adj_[x.rank];
      const auto lo = std::lower_bound(edges.begin(), edges.end(), doc,
                                       [](const Edge& e, int32_t d) { return e.shift.doc < d; });
      const auto hi =
          std::find_if(lo, edges.end(), [&](const Edge& e) { return e.shift.doc != doc; });
      edges.erase(lo, hi);
    }
  }
}

void SliverRepair::EndEdit(size_t c) {
  const std::vector<Piece>& p = docs[c];
  if (work_valid_) {  // exact_ (else BeginEdit made them stale)
    for (const Piece& x : p) work_[x.rank] += RangeWorkload(x.start, x.len);
  }
  if (nonlast_valid_) {
    for (size_t k = 0; k + 1 < p.size(); ++k) nonlast_[p[k].rank] += p[k].len;
  }
  if (!dirty_) {
    // Each rank's edges stay in the order a rebuild makes them.
    DocEdges(c, [&](int32_t rank, const Edge& e) {
      std::vector<Edge>& edges = adj_[rank];
      edges.insert(std::upper_bound(edges.begin(), edges.end(), e,
                                    [](const Edge& x, const Edge& y) {
                                      return EdgeKey(x) < EdgeKey(y);
                                    }),
                   e);
    });
  }
}

void SliverRepair::ShiftTracked(size_t c, size_t i, int side, int64_t delta) {
  std::vector<Piece>& p = docs[c];
  const size_t j = static_cast<size_t>(static_cast<int64_t>(i) + side);
  const auto terms = [&](double sign) {
    for (const size_t k : {i, j}) {
      const Piece& x = p[k];
      if (work_valid_) work_[x.rank] += sign * RangeWorkload(x.start, x.len);
      if (nonlast_valid_ && k + 1 < p.size()) {
        nonlast_[x.rank] += sign > 0 ? x.len : -x.len;
      }
    }
  };
  if (work_valid_ && !exact_) work_valid_ = false;
  terms(-1.0);
  ShiftCut(p, i, side, delta);
  terms(+1.0);
  if (dirty_) return;
  // Piece k gives along boundary k - 1 (as the right piece) and k (as the
  // left one), sparing len - m tokens; an edge exists while len > m.
  for (const size_t k : {i, j}) {
    const Piece& x = p[k];
    std::vector<Edge>& edges = adj_[x.rank];
    for (const bool left : {false, true}) {
      if (left ? k + 1 >= p.size() : k == 0) continue;
      const size_t other = left ? k + 1 : k - 1;
      const Edge e{p[other].rank, x.len - m_,
                   {static_cast<int32_t>(c), static_cast<int32_t>(left ? k : k - 1), left}};
      const auto at = std::lower_bound(
          edges.begin(), edges.end(), e,
          [](const Edge& a, const Edge& b) { return EdgeKey(a) < EdgeKey(b); });
      const bool found = at != edges.end() && EdgeKey(*at) == EdgeKey(e);
      if (x.len > m_) {
        if (found) {
          at->spare = e.spare;
        } else {
          edges.insert(at, e);
        }
      } else if (found) {
        edges.erase(at);
      }
    }
  }
}

void SliverRepair::MoveWholeWork(int32_t from, int32_t to, int64_t len) {
  if (!work_valid_) return;
  if (!exact_) {
    work_valid_ = false;
    return;
  }
  if (from >= 0) work_[from] -= RangeWorkload(0, len);
  if (to >= 0) work_[to] += RangeWorkload(0, len);
}

void SliverRepair::Emit(std::vector<Shard>& out) const {
  for (size_t c = 0; c < docs.size(); ++c) {
    for (const Piece& p : docs[c]) out.push_back(Shard{doc_index[c], p.start, p.len, p.rank});
  }
  for (int32_t r = 0; r < n_; ++r) {
    for (const auto& [len, doc] : whole[r]) out.push_back(Shard{doc, 0, len, r});
  }
}

bool SliverRepair::MoveTokens(int32_t from, int32_t to, int64_t delta) {
  std::vector<Shift> path;
  banned_.clear();
  if (!FindChain(from, to, delta, -1, path)) return false;
  Apply(path, delta);
  return true;
}

bool SliverRepair::BalancedChain(int32_t from, int32_t to, int64_t delta, int32_t skip,
                                 int32_t a, int32_t b, double gain_a,
                                 std::vector<Shift>& path) {
  banned_.assign(n_, 0);
  for (int tries = 0; tries < 4; ++tries) {
    if (!FindChain(from, to, delta, skip, path)) return false;
    if (KeepsBalance(path, delta, a, b, gain_a)) return true;
    bool more = false;
    for (int32_t r = 0; r < n_; ++r) {
      if (over_[r] && r != a && r != b) {
        banned_[r] = 1;
        more = true;
      }
    }
    if (!more) return false;
  }
  return false;
}

bool SliverRepair::KeepsBalance(const std::vector<Shift>& path, int64_t delta, int32_t a, int32_t b,
                                double gain_a) {
  std::vector<double>& work = balance_work_;
  work = RankWorkloads();
  const double limit = std::max(max_work_, *std::max_element(work.begin(), work.end()));
  work[a] += gain_a;
  work[b] -= gain_a;
  for (const Shift& sh : path) {
    const Piece& l = docs[sh.doc][sh.boundary];
    const Piece& r = docs[sh.doc][sh.boundary + 1];
    const double moved =
        sh.left_gives ? GrowthWorkload(r, -1, delta) : GrowthWorkload(l, +1, delta);
    work[sh.left_gives ? l.rank : r.rank] -= moved;
    work[sh.left_gives ? r.rank : l.rank] += moved;
  }
  over_.assign(n_, 0);
  bool ok = true;
  for (int32_t r = 0; r < n_; ++r) {
    if (work[r] > limit) {
      over_[r] = 1;
      ok = false;
    }
  }
  return ok;
}

bool SliverRepair::FindChain(int32_t from, int32_t to, int64_t delta, int32_t skip,
                             std::vector<Shift>& path) {
  // The boundary graph is built on first use, then kept up to date by
  // every edit (BeginEdit, EndEdit); each edge keeps how many tokens its
  // shrinking piece can spare.
  if (dirty_) {
    // Counted first, so that each rank's list is allocated once.
    std::vector<int32_t>& degree = parent_;  // its buffer: the search assigns it below
    degree.assign(n_, 0);
    for (size_t c = 0; c < docs.size(); ++c) {
      DocEdges(c, [&](int32_t rank, const Edge&) { ++degree[rank]; });
    }
    adj_.resize(n_);
    for (int32_t r = 0; r < n_; ++r) {
      adj_[r].clear();
      adj_[r].reserve(degree[r]);
    }
    for (size_t c = 0; c < docs.size(); ++c) {
      DocEdges(c, [&](int32_t rank, const Edge& e) { adj_[rank].push_back(e); });
    }
    dirty_ = false;
  }
  const auto& adj = adj_;
  std::vector<int32_t>& parent = parent_;
  std::vector<Shift>& via = via_;
  std::vector<int32_t>& queue = queue_;
  parent.assign(n_, -2);
  via.resize(n_);
  queue.assign(1, from);
  parent[from] = -1;
  for (size_t q = 0; q < queue.size() && parent[to] == -2; ++q) {
    const int32_t x = queue[q];
    for (const Edge& e : adj[x]) {
      if (parent[e.dest] != -2 || e.spare < delta || e.shift.doc == skip) continue;
      if (!banned_.empty() && banned_[e.dest]) continue;
      parent[e.dest] = x;
      via[e.dest] = e.shift;
      queue.push_back(e.dest);
    }
  }
  if (parent[to] == -2) return false;
  path.clear();
  path.reserve(n_);  // a simple path: fewer than n_ shifts, allocated once
  for (int32_t x = to; parent[x] >= 0; x = parent[x]) path.push_back(via[x]);
  return true;
}

void SliverRepair::Apply(const std::vector<Shift>& path, int64_t delta) {
  for (const Shift& sh : path) {
    const size_t b = static_cast<size_t>(sh.boundary);
    if (sh.left_gives) {
      ShiftTracked(static_cast<size_t>(sh.doc), b + 1, -1, delta);
    } else {
      ShiftTracked(static_cast<size_t>(sh.doc), b, +1, delta);
    }
  }
}

std::tuple<int32_t, int32_t, bool> SliverRepair::EdgeKey(const Edge& e) {
  return {e.shift.doc, e.shift.boundary, !e.shift.left_gives};
}

}  // namespace flashcp::core::internal
