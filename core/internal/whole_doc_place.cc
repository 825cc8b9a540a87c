// Whole-Doc placement and equalization (whole_doc_place.h).
#include "core/internal/whole_doc_place.h"

#include <algorithm>
#include <limits>

#include "absl/base/attributes.h"
#include "core/internal/flashcp_pieces.h"

namespace flashcp::core::internal {

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

namespace {

// Step 2 of WholeDocPieces on one placement (EqualizeWholeDocs): donors
// (over their need) give to receivers (under their need), least-loaded
// receiver first; its state and its named steps, all inlined into the one
// caller (flattened).
//
// The receivers (deficit > 0) are kept ordered by (workload, rank): the
// least-loaded one with a deficit of at least d is the first such in this
// order (the lowest rank among equal workloads, as a scan over the ranks
// would pick), usually the very first, where a scan over all N ranks per
// handed piece costs O(N) (the planner's hot loop at large N). Per handed
// piece only the donor (never a receiver: its deficit is < 0) and the
// receiving rank change workload, and only the receiver's deficit changes;
// Place moves the receiver back into order, or drops it once its deficit is
// 0. Deficits never grow, so no rank joins later. Each receiver carries a
// copy of its rank's workload (refreshed by Place, the only step after it
// changes), so that finding a receiver's slot reads one contiguous array.
class Equalizer {
 public:
  using Receiver = WholeDocScratch::Receiver;

  Equalizer(const Batch& batch, const std::vector<int64_t>& tokens_needed,
            WholeDocPlacement& placement, std::vector<double>& workload, std::vector<Shard>& out,
            const WholeDocOptions& options, WholeDocScratch& scratch)
      : lens_(batch.doc_lens),
        n_(batch.cp_size),
        m_(options.min_shard),
        options_(options),
        held_(placement.held),
        workload_(workload),
        out_(out),
        deficit_(scratch.deficit),
        receivers_(scratch.receivers) {
    const std::vector<int64_t>& tokens = placement.tokens;
    deficit_.resize(n_);
    for (int32_t r = 0; r < n_; ++r) deficit_[r] = tokens_needed[r] - tokens[r];
    receivers_.clear();
    for (int32_t q = 0; q < n_; ++q) {
      if (deficit_[q] > 0) receivers_.push_back(Receiver{workload_[q], q});
    }
    std::sort(receivers_.begin(), receivers_.end(), Before);
  }

  // Every donor's excess given; whether options.max_swap_head decided
  // anything.
  bool Run() {
    for (int32_t r = 0; r < n_; ++r) {
      int64_t excess = -deficit_[r];
      if (excess <= 0) continue;  // receivers' documents are emitted at the end
      deficit_[r] = 0;            // the donor ends holding exactly its need
      if (options_.whole_moves) excess = MoveWholeDocs(r, excess);
      if (excess > 0) CutHeads(r, excess);
    }
    return cap_decided_;
  }

 private:
  static bool Before(const Receiver& a, const Receiver& b) {
    return a.workload < b.workload || (a.workload == b.workload && a.rank < b.rank);
  }

  // Moves `len` tokens of document d from `start` on from rank `from` to
  // `to` (a shard of `to`), their pairs with them.
  void Hand(int32_t d, int64_t start, int64_t len, int32_t from, int32_t to) {
    const double moved = RangeWorkload(start, len);
    out_.push_back(Shard{d, start, len, to});
    workload_[to] += moved;
    workload_[from] -= moved;
  }

  // Receiver `at` (its index in receivers_) served: back into order, or out
  // once its deficit is 0. The other receivers stay in strict (workload,
  // rank) order, so its new slot is unique. A served receiver (heavier now)
  // finds it by a walk, shifting each receiver it passes: it passes few,
  // where a binary search and a shift cost more; a lighter one by a binary
  // search. A receiver's workload never falls in exact arithmetic (every
  // handed piece adds pairs; a swap's head outweighs the document it
  // returns), so it moves back; it can move forward only where a swap's two
  // rounded steps (x - back + moved) round below x, i.e. once workloads pass
  // 2^53 pairs. Inlined: it runs once per handed piece, and a call would
  // cost as much as the short walk it makes.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Place(size_t at) {
    const auto it = receivers_.begin() + static_cast<std::ptrdiff_t>(at);
    const int32_t q = it->rank;
    if (deficit_[q] <= 0) {
      receivers_.erase(it);
      return;
    }
    const Receiver now{workload_[q], q};
    const auto next = it + 1;
    if (next != receivers_.end() && Before(*next, now)) {
      // Heavier now: the receivers before it shift back one slot each:
      // those of less workload, then those of equal workload and lower rank.
      auto slot = it;
      auto after = next;
      do {
        *slot = *after;
        slot = after++;
      } while (after != receivers_.end() && after->workload < now.workload);
      while (after != receivers_.end() && after->workload == now.workload && after->rank < q) {
        *slot = *after;
        slot = after++;
      }
      *slot = now;
    } else if (it != receivers_.begin() && Before(now, *(it - 1))) {
      // Lighter now (rounding only): [to, it) come after q and shift up one slot.
      const auto to = std::upper_bound(receivers_.begin(), it - 1, now, Before);
      std::move_backward(to, it, next);
      *to = now;
      skip_ = 0;
    } else {
      *it = now;
    }
  }

  // The index in receivers_ of the least-loaded one with a deficit of at
  // least min_deficit, or receivers_.size() if none has.
  size_t LeastLoadedReceiver(int64_t min_deficit) const {
    size_t i = 0;
    while (i < receivers_.size() && deficit_[receivers_[i].rank] < min_deficit) ++i;
    return i;
  }

  // Donor r hands whole documents, shortest first, while one fits both its
  // excess and some deficit; a moved document leaves held_[r]. Returns the
  // excess left. A document longer than the excess or than every deficit
  // cannot move, nor can any longer one after it. held_[r] is longest
  // first, so lengths only grow here while deficits only fall: a receiver
  // passed over for one document (deficit below its length) is passed over
  // for every later one, and serving a receiver moves it back, behind those.
  // So the scan goes on from where the last one stopped (from the front
  // again should a length ever fall). Every rank with a deficit is in
  // receivers_, so a scan that finds none means no deficit is as large: the
  // moves end.
  int64_t MoveWholeDocs(int32_t r, int64_t excess) {
    std::vector<int32_t>& mine = held_[r];
    int64_t skip_len = 0;  // receivers [0, skip_) have deficits below skip_len
    skip_ = 0;
    // A moved document is marked -1, and the tail holding every moved one,
    // [low, end), compacted once after the loop (erasing each would shift
    // the tail).
    size_t low = mine.size();
    for (size_t i = mine.size(); i-- > 0 && excess > 0;) {
      const int64_t len = lens_[mine[i]];
      if (len > excess) break;
      if (len < skip_len) skip_ = 0;
      size_t at = skip_;
      while (at < receivers_.size() && deficit_[receivers_[at].rank] < len) ++at;
      if (at == receivers_.size()) break;
      skip_ = at;
      skip_len = len;
      low = i;
      const int32_t to = receivers_[at].rank;
      Hand(mine[i], 0, len, r, to);
      deficit_[to] -= len;
      Place(at);
      excess -= len;
      mine[i] = -1;
    }
    mine.erase(std::remove(mine.begin() + static_cast<std::ptrdiff_t>(low), mine.end(), -1),
               mine.end());
    return excess;
  }

  // Donor r gives the rest of its excess as heads of its documents. They
  // are longest first, so with the minimum-shard rule the documents that
  // can be cut (>= 2m tokens) come first and shorter ones are cut only when
  // nothing else is left (RepairSlivers then tries to undo it). Documents
  // the donor keeps whole stay in held_[r] (compacted to the first `kept`
  // entries, still longest first); once the excess is given, the rest stay
  // as they are.
  void CutHeads(int32_t r, int64_t excess) {
    std::vector<int32_t>& mine = held_[r];
    int64_t later = 0;  // tokens of the documents after the current one in `mine`
    for (int32_t d : mine) later += lens_[d];
    size_t kept = 0, j = 0;
    for (; j < mine.size() && excess > 0; ++j) {
      const int32_t d = mine[j];
      const int64_t len = lens_[d];
      later -= len;
      const int64_t head = CutDocument(r, d, later, excess);
      if (head == 0) {
        mine[kept++] = d;
      } else if (head < len) {
        out_.push_back(Shard{d, head, len - head, r});
      }
    }
    mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(kept),
               mine.begin() + static_cast<std::ptrdiff_t>(j));
  }

  // Heads of document d (of donor r; `later` tokens of its documents after
  // d) to the least-loaded receivers while `excess` lasts; returns the
  // tokens [0, head) handed out.
  int64_t CutDocument(int32_t r, int32_t d, int64_t later, int64_t& excess) {
    const int64_t len = lens_[d];
    int64_t head = 0;
    while (excess > 0 && head < len) {
      // Total need equals total tokens, so an excess implies some deficit.
      size_t at = m_ > 0 ? LeastLoadedReceiver(std::min(m_, excess)) : receivers_.size();
      if (at == receivers_.size()) at = LeastLoadedReceiver(1);
      const int32_t to = receivers_[at].rank;
      int64_t take = std::min({excess, deficit_[to], len - head});
      if (m_ > 0 && take < m_) {
        const int32_t swap = TakeBackFor(to, take, len - head, later, excess);
        if (swap >= 0) {
          const int64_t l = lens_[swap];
          Hand(swap, 0, l, to, r);
          Hand(d, head, take + l, r, to);
          deficit_[to] -= take;
          Place(at);
          excess -= take;
          head += take + l;
          continue;
        }
      }
      bool last_cut = false;
      if (m_ > 0) take = KeepTail(take, len - head, later, excess, last_cut);
      Hand(d, head, take, r, to);
      deficit_[to] -= take;
      Place(at);
      excess -= take;
      head += take;
      if (last_cut) break;
    }
    return head;
  }

  // A sliver head (take < m of the `rest` tokens left of a document): the
  // shortest whole document of receiver `to` that makes a longer head of
  // at least m, which the donor takes back (the receiver still gains
  // exactly `take`); -1 where none fits. The donor must still hold enough
  // to give the rest of its excess (the document it takes back is not
  // given on).
  int32_t TakeBackFor(int32_t to, int64_t take, int64_t rest, int64_t later, int64_t excess) {
    std::vector<int32_t>& theirs = held_[to];
    for (size_t i = theirs.size(); i-- > 0;) {
      const int64_t l = lens_[theirs[i]];
      if (l < m_ - take) continue;
      const int64_t h = take + l;
      if (h > rest || (h < rest && rest - h < m_) || rest - h + later < excess - take) return -1;
      // The head is communicated: capped by max_swap_head. Only here does
      // the cap decide anything.
      if (options_.max_swap_head > 0 && h > options_.max_swap_head) {
        cap_decided_ = true;
        return -1;
      }
      const int32_t swap = theirs[i];
      theirs.erase(theirs.begin() + static_cast<std::ptrdiff_t>(i));
      return swap;
    }
    return -1;
  }

  // `take` of the `rest` tokens left of a document, adjusted so that no
  // tail under m stays: an m-token tail kept (last_cut: the next document
  // goes on). take = min(rest, excess, receiver's deficit), so a receiver
  // and excess that could take the whole rest already did (tail 0).
  int64_t KeepTail(int64_t take, int64_t rest, int64_t later, int64_t excess,
                   bool& last_cut) const {
    const int64_t tail = rest - take;
    if (tail <= 0 || tail >= m_) return take;
    if (rest - m_ >= m_ && later >= excess - (rest - m_)) {
      last_cut = true;
      return rest - m_;
    }
    return take;
  }

  const std::vector<int64_t>& lens_;
  const int32_t n_;
  const int64_t m_;
  const WholeDocOptions& options_;
  std::vector<std::vector<int32_t>>& held_;
  std::vector<double>& workload_;
  std::vector<Shard>& out_;
  std::vector<int64_t>& deficit_;
  std::vector<Receiver>& receivers_;
  // Whole moves scan from skip_: receivers before it are known to be too
  // full; a receiver moved forward (Place) invalidates that.
  size_t skip_ = 0;
  bool cap_decided_ = false;  // max_swap_head stopped a swap that would else be made
};

}  // namespace

// Flattened: every call in it inlined. The compiler otherwise keeps
// push_back (a call per handed piece) and the small vector steps out of line.
[[gnu::flatten]] bool EqualizeWholeDocs(const Batch& batch,
                                        const std::vector<int64_t>& tokens_needed,
                                        WholeDocPlacement& placement,
                                        std::vector<double>& workload, std::vector<Shard>& out,
                                        const WholeDocOptions& options,
                                        WholeDocScratch& scratch) {
  // About one piece per document plus the cut heads: reserving for that
  // avoids most regrowth of `out` (a capacity hint only).
  out.reserve(out.size() + static_cast<size_t>(placement.docs) +
              2 * static_cast<size_t>(batch.cp_size));
  Equalizer equalizer(batch, tokens_needed, placement, workload, out, options, scratch);
  return equalizer.Run();
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

}  // namespace flashcp::core::internal
