#include "core/internal/flashcp_util.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/base/attributes.h"
#include "core/internal/flashcp_repair.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

std::vector<Shard> PerDocPieces(const Batch& batch, const std::vector<int32_t>& docs,
                                int64_t min_shard, std::vector<int64_t>* room, bool* refit) {
  if (refit != nullptr) *refit = false;
  std::vector<Shard> pieces;
  pieces.reserve(docs.size() * 2 * static_cast<size_t>(batch.cp_size));
  PerDocCursor cursor;
  AppendPerDocPieces(batch, docs, min_shard, room, cursor, pieces);
  if (room != nullptr && min_shard > 0 && *std::min_element(room->begin(), room->end()) < 0) {
    ShiftPiecesToRoom(batch, min_shard, pieces, *room);
    if (refit != nullptr) *refit = true;
  }
  return pieces;
}

void AppendPerDocPieces(const Batch& batch, std::span<const int32_t> docs, int64_t min_shard,
                        std::vector<int64_t>* room, PerDocCursor& cursor,
                        std::vector<Shard>& pieces, std::vector<size_t>* begins) {
  // PlanPerDoc's zigzag (baselines.cc) on the sub-batch, without its sort:
  // each document in 2N chunks of L / 2N tokens, chunks k and 2N-1-k to rank
  // k, the L % 2N leftovers dealt one at a time round robin across documents
  // (a rank's first leftover of a document to its front chunk, the second to
  // its back chunk). flashcp_test checks it against PlanPerDoc.
  // With min_shard, a document uses c <= N ranks (first, first + 1, ... mod
  // N) in 2c chunks; the leftover dealing is the same over those c.
  const int32_t n = batch.cp_size;
  std::vector<int64_t>& chunk = cursor.chunk;
  chunk.resize(2 * static_cast<size_t>(n));
  int32_t& next = cursor.next;    // leftover round robin (over positions 0..c-1)
  int32_t& first = cursor.first;  // first rank of the next reduced zigzag
  std::vector<int32_t>& chosen = cursor.chosen;
  std::vector<int64_t>& rooms = cursor.rooms;  // the ranks' rooms, for a reduced zigzag's selection
  for (int32_t d : docs) {
    if (begins != nullptr) begins->push_back(pieces.size());
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
      // order, take the 2c chunks as positions 0..c-1. They are every rank
      // with more room than the c-th most, then the lowest-index ones with
      // exactly that much: one selection and two passes in rank order, not a
      // sort by room.
      rooms.assign(room->begin(), room->end());
      std::nth_element(rooms.begin(), rooms.begin() + (c - 1), rooms.end(), std::greater<>());
      const int64_t cth = rooms[c - 1];
      int32_t at_cth = c;  // how many ranks with exactly `cth` room are taken
      for (int32_t q = 0; q < n; ++q) at_cth -= (*room)[q] > cth ? 1 : 0;
      chosen.clear();
      for (int32_t q = 0; q < n; ++q) {
        if ((*room)[q] > cth || ((*room)[q] == cth && at_cth-- > 0)) chosen.push_back(q);
      }
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
  // A fresh buffer starts at twice a rank's share (a capacity hint only):
  // grown from empty one push at a time, it would reallocate about log2 of
  // its documents times, in every new placement a plan makes.
  const size_t fresh = 2 * docs.size() / static_cast<size_t>(n) + 8;
  for (int32_t q = 0; q < n; ++q) {
    held[q].clear();
    if (held[q].capacity() == 0) held[q].reserve(fresh);
  }
  placement.docs = static_cast<int64_t>(docs.size());
  // A tournament tree over the ranks: node i (1 <= i < leaves) holds the
  // rank of least (key, rank) below it; leaf leaves + q is rank q, and the
  // ranks from N up to `leaves` are padding with key +inf, which never wins.
  // The root is the exact lexicographic minimum, the rank a scan or a
  // (key, rank) min-heap would pick; per document only the chosen rank's key
  // changes, so one leaf-to-root walk of log2(N) comparisons updates it
  // (fewer instructions than a heap's pop and push).
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
    const double key = workload[r] - rho * static_cast<double>(tokens[r] - tokens_needed[r]);
    // r won every node above its leaf; with a key no larger (a document
    // shorter than about 2 rho moves the key down) it wins each again, so
    // the walk would change nothing.
    const bool fell = key <= keys[r];
    keys[r] = key;
    if (fell) continue;
    for (size_t i = (leaves + static_cast<size_t>(r)) / 2; i >= 1; i /= 2) {
      tree[i] = winner(tree[2 * i], tree[2 * i + 1]);
    }
  }
}

// Flattened: every call in it inlined. The compiler otherwise keeps
// push_back (a call per handed piece) and the small vector steps out of line.
[[gnu::flatten]] bool EqualizeWholeDocs(const Batch& batch,
                                        const std::vector<int64_t>& tokens_needed,
                                        WholeDocPlacement& placement,
                                        std::vector<double>& workload, std::vector<Shard>& out,
                                        const WholeDocOptions& options,
                                        WholeDocScratch& scratch) {
  const int32_t n = batch.cp_size;
  bool cap_decided = false;  // max_swap_head stopped a swap that would else be made
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
  // costs O(N) (the planner's hot loop at large N). Per handed piece only the donor
  // (never a receiver: its deficit is < 0) and the receiving rank change
  // workload, and only the receiver's deficit changes; `place` moves the
  // receiver back into order, or drops it once its deficit is 0. Deficits
  // never grow, so no rank joins later.
  // Each receiver carries a copy of its rank's workload (refreshed by
  // `place`, the only step after it changes), so that finding a receiver's
  // slot reads one contiguous array.
  using Receiver = WholeDocScratch::Receiver;
  const auto before = [](const Receiver& a, const Receiver& b) {
    return a.workload < b.workload || (a.workload == b.workload && a.rank < b.rank);
  };
  std::vector<Receiver>& receivers = scratch.receivers;
  receivers.clear();
  for (int32_t q = 0; q < n; ++q) {
    if (deficit[q] > 0) receivers.push_back(Receiver{workload[q], q});
  }
  std::sort(receivers.begin(), receivers.end(), before);
  // The other receivers stay in strict (workload, rank) order, so q's new
  // slot is unique. A served receiver (heavier now) finds it by a walk,
  // shifting each receiver it passes: it passes few, where a binary search
  // and a shift cost more; a lighter one by a binary search. `at` is q's index in `receivers`
  // (from least_loaded_receiver: nothing reorders them in between). A
  // receiver's workload never falls in exact arithmetic (every handed piece
  // adds pairs; a swap's head outweighs the document it returns), so q
  // moves back; it can move forward only where a swap's two rounded steps
  // (x - back + moved) round below x, i.e. once workloads pass 2^53 pairs.
  // Whole moves scan from `skip` (below): receivers before it are known to
  // be too full; a receiver moved forward invalidates that.
  size_t skip = 0;
  // Inlined: it runs once per handed piece, and a call would cost as much as
  // the short walk it makes.
  const auto place = [&](size_t at) ABSL_ATTRIBUTE_ALWAYS_INLINE {
    const auto it = receivers.begin() + static_cast<std::ptrdiff_t>(at);
    const int32_t q = it->rank;
    if (deficit[q] <= 0) {
      receivers.erase(it);
      return;
    }
    const Receiver now{workload[q], q};
    const auto next = it + 1;
    if (next != receivers.end() && before(*next, now)) {
      // Heavier now: the receivers before it shift back one slot each:
      // those of less workload, then those of equal workload and lower rank.
      auto slot = it;
      auto after = next;
      do {
        *slot = *after;
        slot = after++;
      } while (after != receivers.end() && after->workload < now.workload);
      while (after != receivers.end() && after->workload == now.workload && after->rank < q) {
        *slot = *after;
        slot = after++;
      }
      *slot = now;
    } else if (it != receivers.begin() && before(now, *(it - 1))) {
      // Lighter now (rounding only): [to, it) come after q and shift up one slot.
      const auto to = std::upper_bound(receivers.begin(), it - 1, now, before);
      std::move_backward(to, it, next);
      *to = now;
      skip = 0;
    } else {
      *it = now;
    }
  };
  // The index in `receivers` of the least-loaded one with a deficit of at
  // least min_deficit, or receivers.size() if none has.
  const auto least_loaded_receiver = [&](int64_t min_deficit) {
    size_t i = 0;
    while (i < receivers.size() && deficit[receivers[i].rank] < min_deficit) ++i;
    return i;
  };
  const int64_t m = options.min_shard;
  for (int32_t r = 0; r < n; ++r) {
    int64_t excess = -deficit[r];
    if (excess <= 0) continue;  // receivers' documents are emitted at the end
    deficit[r] = 0;             // the donor ends holding exactly its need
    std::vector<int32_t>& mine = held[r];
    if (options.whole_moves && excess > 0) {
      // Shortest first; a moved document leaves `mine`. A document longer
      // than the excess or than every deficit cannot move, nor can any
      // longer one after it.
      // `mine` is longest first, so lengths only grow here while deficits
      // only fall: a receiver passed over for one document (deficit below
      // its length) is passed over for every later one, and serving a
      // receiver moves it back, behind those. So the scan goes on from
      // where the last one stopped (from the front again should a length
      // ever fall). Every rank with a deficit is in `receivers`, so a scan
      // that finds none means no deficit is as large: the moves end.
      int64_t skip_len = 0;  // receivers [0, skip) have deficits below skip_len
      skip = 0;
      // A moved document is marked -1, and the tail holding every moved
      // one, [low, end), compacted once after the loop (erasing each would
      // shift the tail).
      size_t low = mine.size();
      for (size_t i = mine.size(); i-- > 0 && excess > 0;) {
        const int64_t len = batch.doc_lens[mine[i]];
        if (len > excess) break;
        if (len < skip_len) skip = 0;
        size_t at = skip;
        while (at < receivers.size() && deficit[receivers[at].rank] < len) ++at;
        if (at == receivers.size()) break;
        skip = at;
        skip_len = len;
        low = i;
        const int32_t to = receivers[at].rank;
        const double moved = RangeWorkload(0, len);
        out.push_back(Shard{mine[i], 0, len, to});
        workload[to] += moved;
        workload[r] -= moved;
        deficit[to] -= len;
        place(at);
        excess -= len;
        mine[i] = -1;
      }
      mine.erase(std::remove(mine.begin() + static_cast<std::ptrdiff_t>(low), mine.end(), -1),
                 mine.end());
    }
    // `mine` is longest first, so with the minimum-shard rule the documents
    // that can be cut (>= 2m tokens) come first and shorter ones are cut only
    // when nothing else is left (RepairSlivers then tries to undo it).
    // Documents the donor keeps whole stay in `mine` (compacted to the first
    // `kept` entries, still longest first); once the excess is given, the
    // rest stay as they are.
    if (excess <= 0) continue;
    int64_t later = 0;  // tokens of the documents after the current one in `mine`
    for (int32_t d : mine) later += batch.doc_lens[d];
    size_t kept = 0, j = 0;
    for (; j < mine.size() && excess > 0; ++j) {
      const int32_t d = mine[j];
      const int64_t len = batch.doc_lens[d];
      later -= len;
      int64_t head = 0;  // tokens [0, head) of d already handed out
      while (excess > 0 && head < len) {
        // Total need equals total tokens, so an excess implies some deficit.
        size_t at = m > 0 ? least_loaded_receiver(std::min(m, excess)) : receivers.size();
        if (at == receivers.size()) at = least_loaded_receiver(1);
        const int32_t to = receivers[at].rank;
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
            // The donor must still hold enough to give the rest of its
            // excess (the document it takes back is not given on).
            if (h > len - head || (h < len - head && len - head - h < m) ||
                len - head - h + later < excess - take) {
              break;
            }
            // The head is communicated: capped by max_swap_head. Only here
            // does the cap decide anything.
            if (options.max_swap_head > 0 && h > options.max_swap_head) {
              cap_decided = true;
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
          place(at);
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
        place(at);
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
    mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(kept),
               mine.begin() + static_cast<std::ptrdiff_t>(j));
  }
  return cap_decided;
}

void AppendHeldWhole(const Batch& batch, const WholeDocPlacement& placement,
                     std::vector<Shard>& out) {
  // Sized once, then written in place: a push per shard costs a call (the
  // compiler keeps push_back out of line) for each of many shards.
  size_t at = out.size(), total = at;
  for (const std::vector<int32_t>& docs : placement.held) total += docs.size();
  out.resize(total);
  for (size_t r = 0; r < placement.held.size(); ++r) {
    for (int32_t d : placement.held[r]) {
      out[at++] = Shard{d, 0, batch.doc_lens[d], static_cast<int32_t>(r)};
    }
  }
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
  AddPieceWorkloads(pieces, w);
  return w;
}

void AddPieceWorkloads(std::span<const Shard> pieces, std::vector<double>& workload) {
  for (const Shard& s : pieces) workload[s.rank] += RangeWorkload(s.start, s.len);
}

}  // namespace flashcp::core::internal
