// flashcp's sliver repair primitives (flashcp_slivers.h).
#include "core/internal/flashcp_slivers.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "core/internal/flashcp_pieces.h"
#include "core/internal/sliver_repair.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::internal {

struct RepairScratch::Buffers {
  SliverRepair repair;
};
RepairScratch::RepairScratch() : buffers(std::make_unique<Buffers>()) {}
RepairScratch::~RepairScratch() = default;

bool ShiftPiecesToRoom(const Batch& batch, int64_t min_shard, std::vector<Shard>& pieces,
                       std::vector<int64_t>& room) {
  const int32_t n = batch.cp_size;
  SliverRepair fit(n, min_shard, std::numeric_limits<double>::infinity(), kAnyNonlastGrowth);
  // Finished first although Load takes raw pieces: Emit lists the whole
  // documents in the order they were loaded, and the callers' later sums
  // and searches follow that order.
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


std::vector<Shard> RepairSlivers(const Batch& batch, std::vector<Shard> pieces,
                                 int64_t min_shard, double max_workload,
                                 int64_t max_nonlast_growth) {
  RepairScratch scratch;
  return RepairSlivers(batch, std::move(pieces), min_shard, max_workload, max_nonlast_growth,
                       scratch);
}

namespace {

// What RepairSlivers' loop is given once the pieces are loaded: the
// slivers, and the attempts it may make (the bound on its time).
struct RepairBudget {
  int64_t slivers = 0;
  int64_t attempts = 0;
};

RepairBudget BudgetOf(const Batch& batch, const SliverRepair& repair, int64_t min_shard) {
  // Passes until nothing changes: a fix can open a chain for a sliver that
  // had none. Each fix removes one sliver and creates none. Bounded work:
  // each attempt is O(cut pieces + documents) (up to four chain searches and
  // balance checks, plus at most 17^2 whole-document pairs per side). N + 16
  // attempts always; then up to four more per sliver at the start, so that a
  // plan of many slivers (a full 2N-chunk zigzag of short documents) gets the
  // passes it needs, but only while those extra attempts stay within 2^20
  // piece and document visits in all: the bound on a repair's time, which
  // would otherwise grow with the square of the slivers. What stays, the
  // caller's score charges.
  int64_t slivers = 0, pieces_now = 0;
  for (const std::vector<Piece>& p : repair.docs) {
    pieces_now += static_cast<int64_t>(p.size());
    for (const Piece& x : p) slivers += x.len < min_shard ? 1 : 0;
  }
  const int64_t visits = pieces_now + static_cast<int64_t>(batch.doc_lens.size()) + 1;
  return RepairBudget{slivers, static_cast<int64_t>(batch.cp_size) + 16 +
                                   std::min(4 * slivers, (int64_t{1} << 20) / visits)};
}

// A lower bound on the attempts after which cut document c has no sliver:
// a document of L tokens ends whole or in at most floor(L / m) pieces of
// >= m tokens each, and its pieces become fewer only by a fix of one of its
// own slivers, by at most two (the sliver absorbed, and the pieces either
// side merged where they then touch on one rank); chain shifts, growths and
// new cuts change no document's piece count, and a new cut's pieces are
// >= m.
int64_t DocAttemptsToClear(const Batch& batch, const SliverRepair& repair, size_t c,
                           int64_t min_shard) {
  const auto pieces = static_cast<int64_t>(repair.docs[c].size());
  const int64_t most = std::max<int64_t>(1, batch.doc_lens[repair.doc_index[c]] / min_shard);
  return pieces > most ? (pieces - most + 1) / 2 : 0;
}

// Their sum over the cut documents: no sliver is left before as many
// attempts.
int64_t AttemptsToClear(const Batch& batch, const SliverRepair& repair, int64_t min_shard) {
  int64_t need = 0;
  for (size_t c = 0; c < repair.docs.size(); ++c) {
    need += DocAttemptsToClear(batch, repair, c, min_shard);
  }
  return need;
}

// RepairSlivers' passes over the loaded slivers, at most `attempts` fixes
// tried. With `need` >= 0 (AttemptsToClear of the loaded pieces), kept up
// to date after each attempt: it falls by at most one per attempt (only
// the fixed document's term changes), so once it exceeds the attempts left
// some sliver certainly stays, and the passes stop there, returning false.
bool FixSlivers(const Batch& batch, SliverRepair& repair, int64_t min_shard, int64_t attempts,
                int64_t need) {
  if (need > attempts) return false;
  for (auto& w : repair.whole) std::sort(w.begin(), w.end());
  for (bool progress = true; progress && attempts > 0;) {
    progress = false;
    for (size_t c = 0; c < repair.docs.size() && attempts > 0; ++c) {
      for (size_t i = 0; i < repair.docs[c].size() && attempts > 0;) {
        const std::vector<Piece>& p = repair.docs[c];
        if (p.size() > 1 && p[i].len < min_shard) {
          --attempts;
          const int64_t before = need >= 0 ? DocAttemptsToClear(batch, repair, c, min_shard) : 0;
          const bool fixed = repair.Fix(c, i);
          if (need >= 0) {
            need += DocAttemptsToClear(batch, repair, c, min_shard) - before;
            if (need > attempts) return false;
          }
          if (fixed) {
            progress = true;
            continue;  // position i now holds the next piece (or a grown one)
          }
        }
        ++i;
      }
    }
  }
  return true;
}

// RepairSlivers, or where `only_clear` and its attempts certainly leave a
// sliver (AttemptsToClear, before or during them), nullopt.
std::optional<std::vector<Shard>> Repair(const Batch& batch, std::vector<Shard> pieces,
                                         int64_t min_shard, double max_workload,
                                         int64_t max_nonlast_growth, RepairScratch& scratch,
                                         bool only_clear) {
  if (min_shard <= 1) return FinishPlan(batch, std::move(pieces)).shards;
  // Cut documents: those with a shard shorter than the document (merged).
  SliverRepair& repair = scratch.buffers->repair;
  repair.Reset(batch.cp_size, min_shard, max_workload, max_nonlast_growth);
  repair.Load(batch, pieces);
  const RepairBudget budget = BudgetOf(batch, repair, min_shard);
  // With no sliver, the merged shards as they are.
  if (budget.slivers > 0 &&
      !FixSlivers(batch, repair, min_shard, budget.attempts,
                  only_clear ? AttemptsToClear(batch, repair, min_shard) : -1)) {
    return std::nullopt;
  }
  // `repair` holds the pieces now: its output reuses their buffer.
  std::vector<Shard>& out = pieces;
  out.clear();
  repair.Emit(out);
  return std::move(out);
}

}  // namespace

bool PartKeepsSlivers(const Batch& batch, std::span<const Shard> part, int64_t min_shard,
                      RepairScratch& scratch) {
  if (min_shard <= 1) return false;
  SliverRepair& repair = scratch.buffers->repair;
  repair.Reset(batch.cp_size, min_shard, std::numeric_limits<double>::infinity(),
               kAnyNonlastGrowth);
  repair.Load(batch, part);
  // The pieces merge within a document only, so the whole repair holds at
  // least these cut pieces, and its documents need at least these attempts
  // (AttemptsToClear sums over documents); its budget is at most BudgetOf's
  // with no more pieces than these.
  int64_t pieces = 0;
  for (const std::vector<Piece>& p : repair.docs) pieces += static_cast<int64_t>(p.size());
  const int64_t visits = pieces + static_cast<int64_t>(batch.doc_lens.size()) + 1;
  const int64_t most_attempts =
      static_cast<int64_t>(batch.cp_size) + 16 + (int64_t{1} << 20) / visits;
  return AttemptsToClear(batch, repair, min_shard) > most_attempts;
}

std::vector<Shard> RepairSlivers(const Batch& batch, std::vector<Shard> pieces,
                                 int64_t min_shard, double max_workload,
                                 int64_t max_nonlast_growth, RepairScratch& scratch) {
  return *Repair(batch, std::move(pieces), min_shard, max_workload, max_nonlast_growth, scratch,
                 false);
}

std::optional<std::vector<Shard>> RepairAllSlivers(const Batch& batch, std::vector<Shard> pieces,
                                                   int64_t min_shard, double max_workload,
                                                   int64_t max_nonlast_growth,
                                                   RepairScratch& scratch) {
  return Repair(batch, std::move(pieces), min_shard, max_workload, max_nonlast_growth, scratch,
                true);
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

}  // namespace flashcp::core::internal
