#include "core/internal/flashcp_util.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>

#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

std::vector<Shard> PerDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                                int64_t min_shard, std::vector<int64_t>* room, bool* refit) {
  if (refit != nullptr) *refit = false;
  // PlanPerDoc's zigzag (baselines.cc) on the sub-batch, without its sort:
  // each document in 2N chunks of L / 2N tokens, chunks k and 2N-1-k to rank
  // k, the L % 2N leftovers dealt one at a time round robin across documents
  // (a rank's first leftover of a document to its front chunk, the second to
  // its back chunk). flashcp_test checks it against PlanPerDoc.
  // With min_shard, a document uses c <= N ranks (first, first + 1, ... mod
  // N) in 2c chunks; the leftover dealing is the same over those c.
  const int32_t n = batch.cp_size;
  std::vector<Shard> pieces;
  pieces.reserve(docs.size() * 2 * static_cast<size_t>(n));
  std::vector<int64_t> chunk(2 * static_cast<size_t>(n));
  int32_t next = 0;   // leftover round robin (over positions 0..c-1)
  int32_t first = 0;  // first rank of the next reduced zigzag
  std::vector<int32_t> chosen;
  std::vector<int32_t> ids(n);  // reused: ranks by room, for a reduced zigzag
  for (int32_t d : docs) {
    const int64_t len = batch.doc_lens[d];
    int32_t c = n;
    if (min_shard > 0) c = static_cast<int32_t>(std::clamp<int64_t>(len / (2 * min_shard), 1, n));
    if (c == 1) {
      int32_t to = first;
      if (room != nullptr) to = static_cast<int32_t>(std::max_element(room->begin(), room->end()) - room->begin());
      pieces.push_back(Shard{d, 0, len, to});
      if (room != nullptr) (*room)[to] -= len;
      first = (first + 1) % n;
      continue;
    }
    const int32_t base_rank = c == n ? 0 : first;
    if (c < n) first = (first + c) % n;
    if (room != nullptr && c < n) {
      // The c ranks with the most room left (ties: lowest index), in rank
      // order, take the 2c chunks as positions 0..c-1.
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + c, ids.end(), [&](int32_t a, int32_t b) {
        return (*room)[a] != (*room)[b] ? (*room)[a] > (*room)[b] : a < b;
      });
      chosen.assign(ids.begin(), ids.begin() + c);
      std::sort(chosen.begin(), chosen.end());
    } else {
      chosen.resize(c);
      for (int32_t i = 0; i < c; ++i) chosen[i] = (base_rank + i) % n;
    }
    const int64_t base = len / (2 * c);
    std::fill(chunk.begin(), chunk.begin() + 2 * c, base);
    for (int64_t left = len % (2 * c); left > 0; --left) {
      if (next >= c) next = 0;
      const int32_t r = next;
      next = (next + 1) % c;
      if (chunk[r] == base) {
        ++chunk[r];
      } else {
        ++chunk[2 * c - 1 - r];
      }
    }
    int64_t start = 0;
    for (int32_t k = 0; k < 2 * c; ++k) {
      const int32_t pos = k < c ? k : 2 * c - 1 - k;
      if (chunk[k] > 0) {
        pieces.push_back(Shard{d, start, chunk[k], chosen[pos]});
        if (room != nullptr) (*room)[chosen[pos]] -= chunk[k];
      }
      start += chunk[k];
    }
  }
  if (room != nullptr && min_shard > 0 && *std::min_element(room->begin(), room->end()) < 0) {
    ShiftPiecesToRoom(batch, min_shard, pieces, *room);
    if (refit != nullptr) *refit = true;
  }
  return pieces;
}

void WholeDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                    const std::vector<int64_t>& tokens_needed, std::vector<double>& workload,
                    std::vector<Shard>& out, const WholeDocOptions& options) {
  WholeDocScratch scratch;
  WholeDocPieces(batch, docs, tokens_needed, workload, out, options, scratch);
}

void WholeDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                    const std::vector<int64_t>& tokens_needed, std::vector<double>& workload,
                    std::vector<Shard>& out, const WholeDocOptions& options,
                    WholeDocScratch& scratch) {
  PlaceWholeDocs(batch, docs, tokens_needed, options.rho, workload, scratch.placement, scratch);
  EqualizeWholeDocs(batch, tokens_needed, scratch.placement, workload, out, options, scratch);
  AppendHeldWhole(batch, scratch.placement, out);
}

void PlaceWholeDocs(const Batch& batch, const std::vector<int32_t>& docs,
                    const std::vector<int64_t>& tokens_needed, double rho,
                    std::vector<double>& workload, WholeDocPlacement& placement,
                    WholeDocScratch& scratch) {
  const int32_t n = batch.cp_size;
  // LPT: longest first, each whole to the rank of least key (lowest index on ties).
  std::vector<int64_t>& tokens = placement.tokens;
  tokens.assign(n, 0);
  // Per rank, its documents longest first (inner buffers keep their capacity).
  std::vector<std::vector<int32_t>>& held = placement.held;
  held.resize(n);  // exactly N: AppendHeldWhole walks them all
  for (int32_t q = 0; q < n; ++q) held[q].clear();
  placement.docs = static_cast<int64_t>(docs.size());
  // A tournament tree over the ranks: node i (1 <= i < leaves) holds the
  // rank of least (key, rank) below it; leaf leaves + q is rank q, and the
  // ranks from N up to `leaves` are padding with key +inf, which never wins.
  // The root is the exact lexicographic minimum, the rank a scan or a
  // (key, rank) min-heap would pick; per document only the chosen rank's key
  // changes, so one leaf-to-root walk of log2(N) comparisons updates it (a
  // heap's pop and push cost about four times the instructions at N = 8).
  size_t leaves = 1;
  while (leaves < static_cast<size_t>(n)) leaves *= 2;
  std::vector<double>& keys = scratch.keys;
  keys.assign(leaves, std::numeric_limits<double>::infinity());
  for (int32_t q = 0; q < n; ++q) {
    keys[q] = workload[q] - rho * static_cast<double>(tokens[q] - tokens_needed[q]);
  }
  std::vector<int32_t>& tree = scratch.tree;
  tree.resize(2 * leaves);
  for (size_t q = 0; q < leaves; ++q) tree[leaves + q] = static_cast<int32_t>(q);
  // Every rank in a left subtree is below every rank in its right sibling:
  // on equal keys the left one wins.
  const auto winner = [&](int32_t a, int32_t b) { return keys[b] < keys[a] ? b : a; };
  for (size_t i = leaves - 1; i >= 1; --i) tree[i] = winner(tree[2 * i], tree[2 * i + 1]);
  for (int32_t d : docs) {
    const int32_t r = tree[1];
    const int64_t len = batch.doc_lens[d];
    workload[r] += RangeWorkload(0, len);
    tokens[r] += len;
    held[r].push_back(d);
    keys[r] = workload[r] - rho * static_cast<double>(tokens[r] - tokens_needed[r]);
    for (size_t i = (leaves + static_cast<size_t>(r)) / 2; i >= 1; i /= 2) {
      tree[i] = winner(tree[2 * i], tree[2 * i + 1]);
    }
  }
}

void EqualizeWholeDocs(const Batch& batch, const std::vector<int64_t>& tokens_needed,
                       WholeDocPlacement& placement, std::vector<double>& workload,
                       std::vector<Shard>& out, const WholeDocOptions& options,
                       WholeDocScratch& scratch) {
  const int32_t n = batch.cp_size;
  // About one piece per document plus the cut heads: reserving for that
  // avoids most regrowth of `out` (a capacity hint only).
  out.reserve(out.size() + static_cast<size_t>(placement.docs) + 2 * static_cast<size_t>(n));
  const std::vector<int64_t>& tokens = placement.tokens;
  std::vector<std::vector<int32_t>>& held = placement.held;
  // 2. Equalize tokens: donors (over their need) give to receivers (under
  // their need), least-loaded receiver first.
  std::vector<int64_t>& deficit = scratch.deficit;
  deficit.resize(n);
  for (int32_t r = 0; r < n; ++r) deficit[r] = tokens_needed[r] - tokens[r];
  // The receivers (deficit > 0) ordered by (workload, rank): the least-loaded
  // one with a deficit of at least d is the first such in this order (the
  // lowest rank among equal workloads, as a scan over the ranks would pick),
  // usually the very first, where a scan over all N ranks per handed piece
  // was most of flashcp's time at N = 64. Per handed piece only the donor
  // (never a receiver: its deficit is < 0) and the receiving rank change
  // workload, and only the receiver's deficit changes; `place` moves the
  // receiver back into order, or drops it once its deficit is 0. Deficits
  // never grow, so no rank joins later.
  const auto before = [&](int32_t a, int32_t b) {
    return workload[a] < workload[b] || (workload[a] == workload[b] && a < b);
  };
  std::vector<int32_t>& receivers = scratch.receivers;
  receivers.clear();
  for (int32_t q = 0; q < n; ++q) {
    if (deficit[q] > 0) receivers.push_back(q);
  }
  std::sort(receivers.begin(), receivers.end(), before);
  const auto place = [&](int32_t q) {
    size_t i = static_cast<size_t>(std::find(receivers.begin(), receivers.end(), q) -
                                   receivers.begin());
    if (deficit[q] <= 0) {
      receivers.erase(receivers.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
    for (; i + 1 < receivers.size() && before(receivers[i + 1], q); ++i) {
      receivers[i] = receivers[i + 1];
    }
    for (; i > 0 && before(q, receivers[i - 1]); --i) receivers[i] = receivers[i - 1];
    receivers[i] = q;
  };
  const auto least_loaded_receiver = [&](int64_t min_deficit) {
    for (int32_t q : receivers) {
      if (deficit[q] >= min_deficit) return q;
    }
    return int32_t{-1};
  };
  const int64_t m = options.min_shard;
  for (int32_t r = 0; r < n; ++r) {
    int64_t excess = -deficit[r];
    if (excess <= 0) continue;  // receivers' documents are emitted at the end
    std::vector<int32_t>& mine = held[r];
    if (options.whole_moves && excess > 0) {
      // Shortest first; a moved document leaves `mine`. A document longer
      // than both the excess and the largest deficit cannot move, nor can any
      // longer one after it.
      int64_t max_deficit = *std::max_element(deficit.begin(), deficit.end());
      for (size_t i = mine.size(); i-- > 0 && excess > 0;) {
        const int64_t len = batch.doc_lens[mine[i]];
        if (len > excess || len > max_deficit) break;
        const int32_t to = least_loaded_receiver(len);
        if (to < 0) continue;
        const double moved = RangeWorkload(0, len);
        out.push_back(Shard{mine[i], 0, len, to});
        workload[to] += moved;
        workload[r] -= moved;
        deficit[to] -= len;
        place(to);
        excess -= len;
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
        // Only deficit[to] fell: the maximum changes only if it was there.
        if (deficit[to] + len == max_deficit) {
          max_deficit = *std::max_element(deficit.begin(), deficit.end());
        }
      }
    }
    // `mine` is longest first, so with the minimum-shard rule the documents
    // that can be cut (>= 2m tokens) come first and shorter ones are cut only
    // when nothing else is left (RepairShortShards then tries to undo it).
    // Documents the donor keeps whole stay in `mine` (compacted to the first
    // `kept` entries, still longest first).
    int64_t later = 0;  // tokens of the documents after the current one in `mine`
    for (int32_t d : mine) later += batch.doc_lens[d];
    size_t kept = 0;
    for (size_t j = 0; j < mine.size(); ++j) {
      const int32_t d = mine[j];
      const int64_t len = batch.doc_lens[d];
      later -= len;
      int64_t head = 0;  // tokens [0, head) of d already handed out
      while (excess > 0 && head < len) {
        // Total need equals total tokens, so an excess implies some deficit.
        int32_t to = m > 0 ? least_loaded_receiver(std::min(m, excess)) : -1;
        if (to < 0) to = least_loaded_receiver(1);
        int64_t take = std::min({excess, deficit[to], len - head});
        bool last_cut = false;
        int32_t swap = -1;  // a whole document of `to` that comes back to r
        if (m > 0 && take < m) {
          // A sliver head: send a longer head instead and take back the
          // shortest whole document of the receiver that makes up the
          // difference (the receiver still gains exactly `take`).
          std::vector<int32_t>& theirs = held[to];
          for (size_t i = theirs.size(); i-- > 0;) {
            const int64_t l = batch.doc_lens[theirs[i]];
            if (l < m - take) continue;
            const int64_t h = take + l;
            // The head is communicated: capped by max_swap_head. The donor
            // must still hold enough to give the rest of its excess (the
            // document it takes back is not given on).
            if ((options.max_swap_head > 0 && h > options.max_swap_head) || h > len - head ||
                (h < len - head && len - head - h < m) ||
                len - head - h + later < excess - take) {
              break;
            }
            swap = theirs[i];
            theirs.erase(theirs.begin() + static_cast<std::ptrdiff_t>(i));
            break;
          }
        }
        if (swap >= 0) {
          const int64_t l = batch.doc_lens[swap];
          const double back = RangeWorkload(0, l);
          out.push_back(Shard{swap, 0, l, r});
          workload[r] += back;
          workload[to] -= back;
          const double moved = RangeWorkload(head, take + l);
          out.push_back(Shard{d, head, take + l, to});
          workload[to] += moved;
          workload[r] -= moved;
          deficit[to] -= take;
          place(to);
          excess -= take;
          head += take + l;
          continue;
        }
        if (m > 0) {
          const int64_t rest = len - head - take;
          if (rest > 0 && rest < m) {
            if (deficit[to] >= len - head && excess >= len - head) {
              take = len - head;  // the whole remainder moves: no short tail
            } else if (len - head - m >= m && later >= excess - (len - head - m)) {
              take = len - head - m;  // keep an m-token tail; the next document goes on
              last_cut = true;
            }
          }
        }
        const double moved = RangeWorkload(head, take);
        out.push_back(Shard{d, head, take, to});
        workload[to] += moved;
        workload[r] -= moved;
        deficit[to] -= take;
        place(to);
        excess -= take;
        head += take;
        if (last_cut) break;
      }
      if (head == 0) {
        mine[kept++] = d;
      } else if (head < len) {
        out.push_back(Shard{d, head, len - head, r});
      }
    }
    mine.resize(kept);
    if (deficit[r] < 0) deficit[r] = 0;  // the donor now holds exactly its need
  }
}

void AppendHeldWhole(const Batch& batch, const WholeDocPlacement& placement,
                     std::vector<Shard>& out) {
  for (size_t r = 0; r < placement.held.size(); ++r) {
    for (int32_t d : placement.held[r]) {
      out.push_back(Shard{d, 0, batch.doc_lens[d], static_cast<int32_t>(r)});
    }
  }
}

namespace {

// One piece of a cut document, for RepairShortShards.
struct Piece {
  int64_t start = 0;
  int64_t len = 0;
  int32_t rank = 0;
};

// A cut-point shift: the boundary between pieces b and b + 1 of cut document
// `doc` moves so that `giver` hands tokens to the other side's rank.
struct Shift {
  int32_t doc = 0;
  int32_t boundary = 0;
  bool left_gives = false;  // piece b shrinks at its end (else b + 1 at its start)
};

class ShortShardRepair {
 public:
  ShortShardRepair(int32_t n, int64_t m, double max_work, int64_t max_nonlast_growth)
      : n_(n), m_(m), max_work_(max_work), max_nonlast_growth_(max_nonlast_growth) {
    whole.resize(n);
  }

  std::vector<std::vector<Piece>> docs;  // cut documents only, pieces by start
  std::vector<int32_t> doc_index;        // document id per entry of `docs`
  // Per rank, its whole documents as (length, document id), in the order
  // Load met them (RepairShortShards sorts them ascending).
  std::vector<std::vector<std::pair<int64_t, int32_t>>> whole;

  // Takes a finished plan's shards: whole documents per rank, cut ones as
  // pieces sorted by start.
  void Load(const Batch& batch, const std::vector<Shard>& shards) {
    std::vector<int32_t> slot(batch.doc_lens.size(), -1);
    for (const Shard& s : shards) {
      if (s.len == batch.doc_lens[s.doc]) {
        whole[s.rank].push_back({s.len, s.doc});
        continue;
      }
      if (slot[s.doc] < 0) {
        slot[s.doc] = static_cast<int32_t>(docs.size());
        docs.emplace_back();
        doc_index.push_back(s.doc);
      }
      docs[slot[s.doc]].push_back(Piece{s.start, s.len, s.rank});
    }
    for (std::vector<Piece>& p : docs) {
      std::sort(p.begin(), p.end(),
                [](const Piece& a, const Piece& b) { return a.start < b.start; });
    }
  }

  // Per-rank attention workload (SPEC Eq. 3) of the current pieces: cut
  // documents' pieces first, then whole documents (the summation order the
  // workload bounds were measured with).
  std::vector<double> RankWorkloads() const {
    std::vector<double> work(n_, 0.0);
    for (const std::vector<Piece>& d : docs) {
      for (const Piece& x : d) work[x.rank] += RangeWorkload(x.start, x.len);
    }
    for (int32_t r = 0; r < n_; ++r) {
      for (const auto& [len, doc] : whole[r]) work[r] += RangeWorkload(0, len);
    }
    return work;
  }

  // Per-rank non-last tokens (SPEC Eq. 5) of the cut documents' pieces
  // (whole documents have none).
  std::vector<int64_t> RankNonlast() const {
    std::vector<int64_t> nonlast(n_, 0);
    for (const std::vector<Piece>& d : docs) {
      for (size_t k = 0; k + 1 < d.size(); ++k) nonlast[d[k].rank] += d[k].len;
    }
    return nonlast;
  }

  // Appends the current pieces to `out`: the cut documents' pieces, then
  // each rank's whole documents.
  void Emit(std::vector<Shard>& out) const {
    for (size_t c = 0; c < docs.size(); ++c) {
      for (const Piece& p : docs[c]) out.push_back(Shard{doc_index[c], p.start, p.len, p.rank});
    }
    for (int32_t r = 0; r < n_; ++r) {
      for (const auto& [len, doc] : whole[r]) out.push_back(Shard{doc, 0, len, r});
    }
  }

  // Moves `delta` tokens from rank `from` to rank `to` along a shortest
  // chain of cut-point shifts (every shrinking piece keeps >= m), without a
  // workload check; true on success.
  bool MoveTokens(int32_t from, int32_t to, int64_t delta) {
    std::vector<Shift> path;
    banned_.clear();
    if (!FindChain(from, to, delta, -1, path)) return false;
    Apply(path, delta);
    return true;
  }

  // Removes the sliver at docs[c][i] if a chain allows; true on success.
  bool Fix(size_t c, size_t i) {
    std::vector<Piece>& p = docs[c];
    const int64_t s = p[i].len;
    const int32_t a = p[i].rank;
    // Absorb into a neighbour (the sliver's tokens go to its rank B, and B
    // returns s tokens to A along a chain), preferring the one that merges.
    for (int side : {-1, +1}) {
      const int64_t j = static_cast<int64_t>(i) + side;
      if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
      const int32_t b = p[j].rank;
      std::vector<Shift> path;
      if (!BalancedChain(b, a, s, static_cast<int32_t>(c), a, b, -RangeWorkload(p[i].start, s),
                         path)) {
        continue;
      }
      Apply(path, s);  // marks the graph dirty
      if (side < 0) {
        p[j].len += s;
      } else {
        p[j].start -= s;
        p[j].len += s;
      }
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(i));
      // The pieces on either side of the removed sliver may now touch on B.
      for (size_t k = 1; k < p.size(); ++k) {
        if (p[k - 1].rank == p[k].rank) {
          p[k - 1].len += p[k].len;
          p.erase(p.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
      }
      return true;
    }
    // Grow the sliver to m out of a neighbour that keeps >= m; A returns the
    // g tokens to B along a chain.
    const int64_t g = m_ - s;
    for (int side : {-1, +1}) {
      const int64_t j = static_cast<int64_t>(i) + side;
      if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
      if (p[j].len - g < m_) continue;
      const int32_t b = p[j].rank;
      std::vector<Shift> path;
      const double grown = side < 0 ? RangeWorkload(p[i].start - g, g)
                                    : RangeWorkload(p[i].start + s, g);
      if (!BalancedChain(a, b, g, static_cast<int32_t>(c), a, b, grown, path)) continue;
      Apply(path, g);
      if (side < 0) {
        p[j].len -= g;
        p[i].start -= g;
        p[i].len += g;
      } else {
        p[i].len += g;
        p[j].start += g;
        p[j].len -= g;
      }
      return true;
    }
    return FixByWhole(c, i) || FixByNewCut(c, i);
  }

  // Removes the sliver at docs[c][i] by whole-document moves between its
  // rank A and the rank B of a neighbouring piece (b tokens), where no chain
  // of cut-point shifts exists (Fix). Either
  //  - grow: the sliver grows by g, m - s <= g <= b - m, out of B's piece,
  //    and A hands B whole documents worth exactly g tokens more than B
  //    hands back (one document of A, or one each way), or
  //  - absorb: B's piece takes the sliver's s tokens, and B hands A whole
  //    documents worth exactly s more than A hands back (one document of B,
  //    or one each way).
  // Every rank keeps its tokens, no piece falls below m. Among the moves
  // that leave both A's and B's workload at most max(max_work, the plan's
  // current maximum) and raise the plan's maximum non-last tokens by at most
  // max_nonlast_growth, the one with the least resulting maximum over ranks
  // of non-last tokens (the allgather bottleneck), then the fewest tokens
  // added to cut pieces (g, or s), then the fewest whole tokens moved, wins.
  // True on success.
  bool FixByWhole(size_t c, size_t i) {
    std::vector<Piece>& p = docs[c];
    const int64_t s = p[i].len;
    const int32_t a = p[i].rank;
    std::vector<double> work = RankWorkloads();
    const double limit = std::max(max_work_, *std::max_element(work.begin(), work.end()));
    const std::vector<int64_t> nonlast = RankNonlast();
    // The plan's maximum non-last tokens once this document's pieces are
    // `after` instead of p (only ranks A and B change).
    const auto max_nonlast_after = [&](const std::vector<Piece>& after, int32_t b) {
      int64_t na = nonlast[a], nb = nonlast[b];
      for (size_t k = 0; k + 1 < p.size(); ++k) {
        if (p[k].rank == a) na -= p[k].len;
        if (p[k].rank == b) nb -= p[k].len;
      }
      for (size_t k = 0; k + 1 < after.size(); ++k) {
        if (after[k].rank == a) na += after[k].len;
        if (after[k].rank == b) nb += after[k].len;
      }
      int64_t mx = std::max(na, nb);
      for (int32_t r = 0; r < n_; ++r) {
        if (r != a && r != b) mx = std::max(mx, nonlast[r]);
      }
      return mx;
    };
    const int64_t max_nonlast_now = *std::max_element(nonlast.begin(), nonlast.end());
    std::vector<Piece> after;
    struct Move {
      int side = 0;        // -1: B's piece precedes the sliver, +1: follows
      bool grow = false;   // else absorb
      int64_t g = 0;       // tokens the sliver grows by (grow)
      size_t from_a = 0;   // index in whole[A] + 1 of the document A hands B (0: none)
      size_t from_b = 0;   // index in whole[B] + 1 of the document B hands A (0: none)
      int64_t max_nonlast = 0;  // the plan's, after the move
      int64_t cost = 0;    // tokens added to cut pieces
      int64_t moved = 0;   // whole tokens moved
    };
    Move best;
    bool found = false;
    // At most this many of each rank's shortest documents are tried (pairs:
    // its square), which bounds a fix's work at large N.
    constexpr size_t kMaxTried = 16;
    for (int side : {-1, +1}) {
      const int64_t j = static_cast<int64_t>(i) + side;
      if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
      const int32_t b = p[j].rank;
      const int64_t bl = p[j].len;
      const std::vector<std::pair<int64_t, int32_t>>& wa = whole[a];
      const std::vector<std::pair<int64_t, int32_t>>& wb = whole[b];
      const size_t na = std::min(wa.size(), kMaxTried), nb = std::min(wb.size(), kMaxTried);
      // This document's pieces after absorbing the sliver, and after
      // growing it by g (same pieces, other lengths).
      after = p;
      if (side < 0) {
        after[j].len += s;
      } else {
        after[j].start -= s;
        after[j].len += s;
      }
      after.erase(after.begin() + static_cast<std::ptrdiff_t>(i));
      MergeTouching(after);
      const int64_t absorb_nonlast = max_nonlast_after(after, b);
      // Growing moves g tokens from piece j to piece i: non-last tokens
      // change only where those pieces are not their document's last.
      int64_t rest_max = 0;  // max non-last tokens over the ranks but A and B
      for (int32_t r = 0; r < n_; ++r) {
        if (r != a && r != b) rest_max = std::max(rest_max, nonlast[r]);
      }
      const bool i_nonlast = i + 1 < p.size();
      const bool j_nonlast = static_cast<size_t>(j) + 1 < p.size();
      const auto grow_nonlast = [&](int64_t g) {
        return std::max({rest_max, nonlast[a] + (i_nonlast ? g : 0),
                         nonlast[b] - (j_nonlast ? g : 0)});
      };
      const auto consider = [&](bool grow, int64_t g, size_t ia, size_t ib) {
        const int64_t la = ia > 0 ? wa[ia - 1].first : 0;
        const int64_t lb = ib > 0 ? wb[ib - 1].first : 0;
        Move mv{side, grow, g, ia, ib, grow ? grow_nonlast(g) : absorb_nonlast, grow ? g : s,
                la + lb};
        if (found && std::tie(mv.max_nonlast, mv.cost, mv.moved) >=
                         std::tie(best.max_nonlast, best.cost, best.moved)) {
          return;
        }
        // Workload A gains: the tokens its cut piece gains (or loses), plus
        // the whole documents it receives, minus those it hands over.
        double gain = RangeWorkload(0, lb) - RangeWorkload(0, la);
        if (grow) {
          gain += side < 0 ? RangeWorkload(p[i].start - g, g) : RangeWorkload(p[i].start + s, g);
        } else {
          gain -= RangeWorkload(p[i].start, s);
        }
        if (work[a] + gain > limit || work[b] - gain > limit) return;
        if (mv.max_nonlast > max_nonlast_now + max_nonlast_growth_) return;
        best = mv;
        found = true;
      };
      const int64_t lo = m_ - s, hi = bl - m_;  // grow range for g
      for (size_t x = 0; x <= na; ++x) {
        const int64_t la = x > 0 ? wa[x - 1].first : 0;
        for (size_t y = 0; y <= nb; ++y) {
          const int64_t lb = y > 0 ? wb[y - 1].first : 0;
          if (x == 0 && y == 0) continue;
          const int64_t g = la - lb;
          if (g >= lo && g <= hi) consider(true, g, x, y);
          if (g == -s) consider(false, 0, x, y);
        }
      }
    }
    if (!found) return false;
    const int64_t j = static_cast<int64_t>(i) + best.side;
    const int32_t b = p[j].rank;
    // The whole documents change ranks (kept ascending).
    const auto take = [&](int32_t from, size_t index) {
      const std::pair<int64_t, int32_t> d = whole[from][index];
      whole[from].erase(whole[from].begin() + static_cast<std::ptrdiff_t>(index));
      return d;
    };
    const auto put = [&](int32_t to, std::pair<int64_t, int32_t> d) {
      auto& w = whole[to];
      w.insert(std::lower_bound(w.begin(), w.end(), d), d);
    };
    std::pair<int64_t, int32_t> da{0, -1}, db{0, -1};
    if (best.from_a > 0) da = take(a, best.from_a - 1);
    if (best.from_b > 0) db = take(b, best.from_b - 1);
    if (da.second >= 0) put(b, da);
    if (db.second >= 0) put(a, db);
    if (best.grow) {
      if (best.side < 0) {
        p[j].len -= best.g;
        p[i].start -= best.g;
      } else {
        p[j].start += best.g;
        p[j].len -= best.g;
      }
      p[i].len += best.g;
      dirty_ = true;
      return true;
    }
    if (best.side < 0) {
      p[j].len += s;
    } else {
      p[j].start -= s;
      p[j].len += s;
    }
    p.erase(p.begin() + static_cast<std::ptrdiff_t>(i));
    MergeTouching(p);
    if (p.size() == 1) {  // the document is whole again
      put(p[0].rank, {p[0].len, doc_index[c]});
      p.clear();
    }
    dirty_ = true;
    return true;
  }

  // Removes the sliver at docs[c][i] (s tokens on rank A) by cutting a new
  // document, where neither a chain nor whole-document moves can (Fix,
  // FixByWhole): the sliver grows by m tokens out of its neighbour's piece
  // on rank B (which keeps >= m), and A hands B the m-token head of one of
  // its whole documents of >= 2m tokens (the shortest such, whose tail of
  // >= m stays on A as the document's last shard). Every rank keeps its
  // tokens and no piece is shorter than m. The head moves only W(0, m)
  // workload; the sliver's growth moves m tokens at its prefix p, about m p.
  // The same bounds as FixByWhole: A and B at most max(max_work, the current
  // maximum), the maximum non-last tokens up by at most max_nonlast_growth
  // (the head is non-last on B). Of the two neighbours, the one with the
  // least resulting maximum non-last tokens. True on success.
  bool FixByNewCut(size_t c, size_t i) {
    std::vector<Piece>& p = docs[c];
    const int32_t a = p[i].rank;
    // A's shortest whole document that can lose an m-token head.
    const std::vector<std::pair<int64_t, int32_t>>& wa = whole[a];
    const auto cut =
        std::lower_bound(wa.begin(), wa.end(), std::pair<int64_t, int32_t>{2 * m_, -1});
    if (cut == wa.end()) return false;
    const std::vector<double> work = RankWorkloads();
    const std::vector<int64_t> nonlast = RankNonlast();
    const double limit = std::max(max_work_, *std::max_element(work.begin(), work.end()));
    const int64_t max_nonlast_now = *std::max_element(nonlast.begin(), nonlast.end());
    const int64_t g = m_;
    const double head_work = RangeWorkload(0, g);
    int best_side = 0;
    int64_t best_nonlast = 0;
    for (int side : {-1, +1}) {
      const int64_t j = static_cast<int64_t>(i) + side;
      if (j < 0 || j >= static_cast<int64_t>(p.size())) continue;
      if (p[j].len - g < m_) continue;
      const int32_t b = p[j].rank;
      // Workload A gains: the sliver's g new tokens (just before it, or
      // just after), less the head it hands over.
      const double grown = side < 0 ? RangeWorkload(p[i].start - g, g)
                                    : RangeWorkload(p[i].start + p[i].len, g);
      const double gain = grown - head_work;
      if (work[a] + gain > limit || work[b] - gain > limit) continue;
      int64_t mx = std::max(nonlast[a] + (i + 1 < p.size() ? g : 0),
                            nonlast[b] - (static_cast<size_t>(j) + 1 < p.size() ? g : 0) + g);
      for (int32_t r = 0; r < n_; ++r) {
        if (r != a && r != b) mx = std::max(mx, nonlast[r]);
      }
      if (mx > max_nonlast_now + max_nonlast_growth_) continue;
      if (best_side == 0 || mx < best_nonlast) {
        best_side = side;
        best_nonlast = mx;
      }
    }
    if (best_side == 0) return false;
    const int64_t j = static_cast<int64_t>(i) + best_side;
    const int32_t b = p[j].rank;
    if (best_side < 0) {
      p[j].len -= g;
      p[i].start -= g;
    } else {
      p[j].start += g;
      p[j].len -= g;
    }
    p[i].len += g;
    const auto [len, doc] = *cut;
    whole[a].erase(cut);
    // `p` is not used after this: docs may reallocate.
    docs.push_back({Piece{0, g, b}, Piece{g, len - g, a}});
    doc_index.push_back(doc);
    dirty_ = true;
    return true;
  }

 private:
  // A chain for a fix that moves `delta` tokens from `from` to `to` and
  // keeps the workload bound (KeepsBalance): the shortest chain first; if it
  // takes relay ranks over the bound, those are avoided and a chain is
  // sought again, at most four times (each O(N + cut pieces)).
  bool BalancedChain(int32_t from, int32_t to, int64_t delta, int32_t skip, int32_t a, int32_t b,
                     double gain_a, std::vector<Shift>& path) {
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

  // Whether a chain fix keeps every rank it touches at most max(max_work,
  // the plan's current maximum workload), as the whole-document fixes must:
  // rank A gains `gain_a` workload from B (the sliver's own move), and each
  // shift of `path` moves `delta` tokens' workload across its boundary. So
  // that the repair never takes a plan that meets the target over it. Marks
  // the ranks over the bound in over_.
  bool KeepsBalance(const std::vector<Shift>& path, int64_t delta, int32_t a, int32_t b,
                    double gain_a) {
    std::vector<double> work = RankWorkloads();
    const double limit = std::max(max_work_, *std::max_element(work.begin(), work.end()));
    work[a] += gain_a;
    work[b] -= gain_a;
    for (const Shift& sh : path) {
      const Piece& l = docs[sh.doc][sh.boundary];
      const Piece& r = docs[sh.doc][sh.boundary + 1];
      const double moved = sh.left_gives ? RangeWorkload(l.start + l.len - delta, delta)
                                         : RangeWorkload(r.start, delta);
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

  // A shortest chain of cut-point shifts (not in document `skip`, not
  // through ranks marked in banned_) that moves `delta` tokens from rank
  // `from` to rank `to`, every shrinking piece keeping >= m tokens. A simple
  // path leaves each rank once, so no piece shrinks twice.
  bool FindChain(int32_t from, int32_t to, int64_t delta, int32_t skip,
                 std::vector<Shift>& path) {
    // The boundary graph is rebuilt only after a successful fix (pieces
    // moved); each edge keeps how many tokens its shrinking piece can spare.
    if (dirty_) {
      adj_.assign(n_, {});
      for (size_t c = 0; c < docs.size(); ++c) {
        const std::vector<Piece>& p = docs[c];
        for (size_t b = 0; b + 1 < p.size(); ++b) {
          const Shift base{static_cast<int32_t>(c), static_cast<int32_t>(b), false};
          if (p[b].len > m_) {
            Shift sh = base;
            sh.left_gives = true;
            adj_[p[b].rank].push_back({p[b + 1].rank, p[b].len - m_, sh});
          }
          if (p[b + 1].len > m_) adj_[p[b + 1].rank].push_back({p[b].rank, p[b + 1].len - m_, base});
        }
      }
      dirty_ = false;
    }
    const auto& adj = adj_;
    std::vector<int32_t> parent(n_, -2);
    std::vector<Shift> via(n_);
    std::vector<int32_t> queue = {from};
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
    for (int32_t x = to; parent[x] >= 0; x = parent[x]) path.push_back(via[x]);
    return true;
  }

  void Apply(const std::vector<Shift>& path, int64_t delta) {
    dirty_ = true;
    for (const Shift& sh : path) {
      std::vector<Piece>& p = docs[sh.doc];
      Piece& l = p[sh.boundary];
      Piece& r = p[sh.boundary + 1];
      if (sh.left_gives) {
        l.len -= delta;
        r.start -= delta;
        r.len += delta;
      } else {
        l.len += delta;
        r.start += delta;
        r.len -= delta;
      }
    }
  }

  struct Edge {
    int32_t dest;
    int64_t spare;  // tokens the shrinking piece can give and keep >= m
    Shift shift;
  };
  // Merges the first two touching pieces on one rank (one fix makes at
  // most one such pair: the pieces either side of a removed sliver).
  static void MergeTouching(std::vector<Piece>& p) {
    for (size_t k = 1; k < p.size(); ++k) {
      if (p[k - 1].rank == p[k].rank) {
        p[k - 1].len += p[k].len;
        p.erase(p.begin() + static_cast<std::ptrdiff_t>(k));
        return;
      }
    }
  }

  int32_t n_;
  int64_t m_;
  double max_work_;  // no whole-document fix leaves a rank above this (or the current max)
  int64_t max_nonlast_growth_;  // nor raises the plan's max non-last tokens by more
  bool dirty_ = true;
  std::vector<std::vector<Edge>> adj_;
  std::vector<char> banned_;  // per rank: FindChain avoids it (empty: none)
  std::vector<char> over_;    // per rank: over the bound in the last KeepsBalance
};

}  // namespace

bool ShiftPiecesToRoom(const Batch& batch, int64_t min_shard, std::vector<Shard>& pieces,
                       std::vector<int64_t>& room) {
  const int32_t n = batch.cp_size;
  ShortShardRepair fit(n, min_shard, std::numeric_limits<double>::infinity(), int64_t{1} << 62);
  fit.Load(batch, FinishPlan(batch, pieces).shards);
  std::vector<int64_t> left = room;
  for (int64_t tries = 4 * static_cast<int64_t>(n) + 16; tries > 0; --tries) {
    const auto over = std::min_element(left.begin(), left.end());
    if (*over >= 0) break;
    const auto under = std::max_element(left.begin(), left.end());
    const int32_t x = static_cast<int32_t>(over - left.begin());
    const int32_t y = static_cast<int32_t>(under - left.begin());
    // The whole difference if one chain can carry it, else less.
    bool moved = false;
    for (int64_t delta = std::min(-*over, *under); delta > 0 && !moved; delta /= 2) {
      if (fit.MoveTokens(x, y, delta)) {
        left[x] += delta;
        left[y] -= delta;
        moved = true;
      }
    }
    if (!moved) return false;
  }
  if (*std::min_element(left.begin(), left.end()) < 0) return false;
  room = left;
  pieces.clear();
  fit.Emit(pieces);
  return true;
}


std::vector<Shard> RepairShortShards(const Batch& batch, std::vector<Shard> pieces,
                                     int64_t min_shard, double max_workload,
                                     int64_t max_nonlast_growth) {
  std::vector<Shard> shards = FinishPlan(batch, std::move(pieces)).shards;
  if (min_shard <= 1) return shards;
  // Cut documents: those with a shard shorter than the document.
  ShortShardRepair repair(batch.cp_size, min_shard, max_workload, max_nonlast_growth);
  repair.Load(batch, shards);
  for (auto& w : repair.whole) std::sort(w.begin(), w.end());
  // Passes until nothing changes: a fix can open a chain for a sliver that
  // had none. Each fix removes one sliver and creates none. Bounded work:
  // each attempt is O(cut pieces + documents) (up to four chain searches and
  // workload sums, plus at most 17^2 whole-document pairs per side). N + 16
  // attempts always; then up to four more per sliver at the start, so that a
  // plan of many slivers (a full 2N-chunk zigzag of short documents) gets the
  // passes it needs (on the property test's batches, 1,000 tries per sliver
  // left exactly as many plans with one), but only while those extra
  // attempts stay within 2^20 piece and document visits in all (a few
  // milliseconds): a zigzag of 8,000 slivers would otherwise take a second.
  // What stays, the caller's score charges.
  int64_t slivers = 0, pieces_now = 0;
  for (const std::vector<Piece>& p : repair.docs) {
    pieces_now += static_cast<int64_t>(p.size());
    for (const Piece& x : p) slivers += x.len < min_shard ? 1 : 0;
  }
  const int64_t visits = pieces_now + static_cast<int64_t>(batch.doc_lens.size()) + 1;
  int64_t attempts = static_cast<int64_t>(batch.cp_size) + 16 +
                     std::min(4 * slivers, (int64_t{1} << 20) / visits);
  for (bool progress = true; progress && attempts > 0;) {
    progress = false;
    for (size_t c = 0; c < repair.docs.size() && attempts > 0; ++c) {
      for (size_t i = 0; i < repair.docs[c].size() && attempts > 0;) {
        const std::vector<Piece>& p = repair.docs[c];
        if (p.size() > 1 && p[i].len < min_shard) {
          --attempts;
          if (repair.Fix(c, i)) {
            progress = true;
            continue;  // position i now holds the next piece (or a grown one)
          }
        }
        ++i;
      }
    }
  }
  std::vector<Shard> out;
  out.reserve(shards.size());
  repair.Emit(out);
  return out;
}

double SliverFreeWorkloadBound(const Batch& batch, int64_t min_shard) {
  int64_t total = 0;
  for (int64_t len : batch.doc_lens) total += len;
  const int64_t floor_tokens = total / batch.cp_size;
  double bound = 0;
  for (int64_t len : batch.doc_lens) {
    const int64_t s = std::min(len, min_shard);
    bound = std::max(bound, RangeWorkload(len - s, s) +
                                static_cast<double>(std::max<int64_t>(0, floor_tokens - s)));
  }
  return bound;
}

std::vector<int32_t> DocsLongestFirst(const Batch& batch) {
  std::vector<int32_t> order(batch.doc_lens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return batch.doc_lens[a] > batch.doc_lens[b];
  });
  return order;
}

std::vector<double> PieceWorkloads(int32_t cp_size, const std::vector<Shard>& pieces) {
  std::vector<double> w(cp_size, 0.0);
  for (const Shard& s : pieces) w[s.rank] += RangeWorkload(s.start, s.len);
  return w;
}

PlanScore ScorePieces(const Batch& batch, const std::vector<Shard>& pieces) {
  const int32_t n = batch.cp_size;
  std::vector<double> w(n, 0.0);
  std::vector<int64_t> nonlast(n, 0);
  PlanScore score;
  for (const Shard& s : pieces) {
    if (s.len == 0) continue;
    const int64_t len = batch.doc_lens[s.doc];
    w[s.rank] += RangeWorkload(s.start, s.len);
    if (s.start + s.len < len) nonlast[s.rank] += s.len;
    if (s.len < len) {
      if (s.start == 0) ++score.cut_docs;
      if (score.min_cut_len == 0 || s.len < score.min_cut_len) score.min_cut_len = s.len;
    }
  }
  double total = 0, max_w = 0;
  for (double x : w) {
    total += x;
    max_w = std::max(max_w, x);
  }
  score.imbalance = total > 0 ? max_w / (total / n) : 1.0;
  score.max_nonlast = *std::max_element(nonlast.begin(), nonlast.end());
  return score;
}

PlanScore ScorePlan(const Plan& plan) {
  return ScorePieces(Batch{plan.doc_lens, plan.cp_size}, plan.shards);
}

}  // namespace flashcp::core::internal
