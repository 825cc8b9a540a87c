// The Per-Doc zigzag (per_doc.h).
#include "core/internal/per_doc.h"

#include <algorithm>
#include <functional>

#include "core/internal/flashcp_slivers.h"

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

}  // namespace flashcp::core::internal
