// flashcp's search stage (docs/planner.md): candidates with the k longest
// documents Per-Doc (zigzagged) and the rest Whole-Doc, each Whole-Doc
// variant steered by rho with whole-document moves, scored on imbalance,
// then communication (the compacted all-gather), then cuts (Better).
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_SEARCH_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_SEARCH_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/internal/flashcp_options.h"
#include "core/internal/flashcp_pieces.h"
#include "core/internal/flashcp_score.h"
#include "core/internal/per_doc.h"
#include "core/internal/whole_doc_place.h"
#include "core/types.h"

namespace flashcp::core::internal {

// One candidate, kept small (O(n)): its pieces besides the Per-Doc ones, the
// documents its placement keeps whole, and how to rebuild its Per-Doc
// pieces (CompactedSearch::Assemble).
struct SearchCandidate {
  std::vector<Shard> pieces;
  WholeDocPlacement placement;  // only `held` is used
  size_t k = 0;                 // the k longest documents are Per-Doc
  // Per-Doc under the minimum-shard rule, else the full 2N-chunk zigzag.
  bool reduced = true;
  PlanScore score;
};

// The search over k for one batch. Not thread-safe; `batch` and `options`
// must outlive it. Every candidate it makes reuses its buffers (no
// per-candidate allocation once grown).
class CompactedSearch {
 public:
  CompactedSearch(const Batch& batch, const FlashCpOptions& options);

  // Fewer Per-Doc documents means less communication; imbalance mostly
  // falls as k grows (the search assumes it does). Walks k to the boundary
  // (k meets R, k - 1 does not) from a first guess, by galloping and
  // bisection, keeping the best candidate (best()). Returns the stop
  // token's status once it says stop.
  absl::Status FindBoundary();

  // The best candidate found so far. TakeBest moves its pieces and
  // placement out (its k, mode and score stay, and later searches still
  // compare against that score).
  const SearchCandidate& best() const { return best_; }
  SearchCandidate TakeBest();

  // The fallback's candidates, where the winner (at k0) keeps a sliver its
  // repair could not remove: the candidates at k0 and at k0 + 1 (one more
  // Per-Doc document: better balanced, so more meet R), with kScales and
  // kMoreScales, and at k = n where the winner already has half the
  // documents or all but 8 Per-Doc (so that this costs at most about what
  // its own k did). Keeps each distinct one that meets R or has no sliver
  // (for the re-cut stage), in the order found.
  absl::StatusOr<std::vector<SearchCandidate>> FallbackCandidates(size_t k0);

  // A candidate's whole raw pieces: its own, the documents its placement
  // kept whole, its Per-Doc pieces (rebuilt).
  std::vector<Shard> Assemble(std::vector<Shard> pieces, const WholeDocPlacement& held,
                              size_t k, bool reduced);

  // Whether the repair of every candidate at k in this Per-Doc mode
  // certainly keeps a sliver (PartKeepsSlivers of its Per-Doc pieces: a
  // full 2N-chunk zigzag of many short documents), so that the fallback
  // skips them without assembling them. Told once per (k, mode).
  bool PerDocKeepsSlivers(size_t k, bool reduced);

 private:
  // What a candidate's score takes from its Per-Doc part, made once per
  // part: the part's workload per rank, its partial score (AddPieces) and
  // its slivers (with min_shard > 1: cut pieces shorter than min_shard).
  struct ZigScore {
    std::vector<double> workload;
    PartialScore part;
    int64_t slivers = 0;
  };
  // Adds `pieces` to `score`, in order: on a list's prefix, then on the
  // rest, it gives exactly the score of the whole list.
  void AddToZigScore(std::span<const Shard> pieces, ZigScore& score);
  ZigScore ScoreOf(std::span<const Shard> pieces);
  // The reduced zigzag of the k longest documents, made once per k: the same
  // for every variant at k, for the winner's build and for the fallback,
  // and fitting it to the ranks' rooms (ShiftPiecesToRoom) is costly
  // (docs/planner.md, "Complexity"). Few k are tried (O(log n) plus the
  // fallback's), so a list searched linearly.
  struct ReducedZig {
    size_t k;
    std::vector<Shard> pieces;
    std::vector<int64_t> need;  // targets less the pieces' tokens per rank
    bool refit = false;         // the pieces were shifted to fit (or could not be)
    ZigScore score;             // of `pieces`
  };
  const ReducedZig& ReducedZigOf(size_t k);
  // The full 2N-chunk zigzags of a growing prefix of the order, as one run
  // (PerDocPieces of the first k documents is the run's first ends[k]
  // pieces), with each prefix's score and rooms: a prefix's score is its
  // pieces' added in order, so a snapshot per document is every k's score,
  // not a sum over its pieces again. TryK needs one where the reduced
  // zigzag was refit, the fallback's TryK again at the same k, Assemble for
  // the winner, the fallback and the re-cut.
  struct FullRun {
    std::vector<Shard> pieces;
    PerDocCursor cursor;
    std::vector<size_t> ends;                 // per k, the first k documents' pieces
    std::vector<ZigScore> scores;             // per k, their score
    std::vector<std::vector<int64_t>> needs;  // per k, targets less their tokens per rank
  };
  // The run extended to at least the first k documents.
  void ExtendFullRun(size_t k);
  FullRun full_;
  // The reduced zigzags of a growing prefix of the order, unfitted: each
  // document's first piece (begins), the rooms left after all of them. The
  // prefixes scored so far (pieces [0, end), by end): a longer one extends
  // the longest of them below it instead of scoring all its pieces.
  struct ZigRun {
    std::vector<Shard> pieces;
    std::vector<size_t> begins;
    std::vector<int64_t> room;
    PerDocCursor cursor;
    std::vector<std::pair<size_t, ZigScore>> scored;
  };
  ZigRun run_;
  std::vector<Shard> zig_buffer_;  // AddToZigScore's copy of its pieces
  // PerDocKeepsSlivers' answers: (k, reduced, keeps slivers).
  std::vector<std::tuple<size_t, bool, bool>> keeps_slivers_;

  // Every Whole-Doc variant with the k longest documents Per-Doc; true if
  // one meets the target (or the stop token said stop).
  bool TryK(size_t k);
  // The fallback's TryK(k) under kScales: where FindBoundary already made
  // those candidates, the ones it kept for the pool (searched_) go to the
  // pool as TryK would put them there (the same stop check first); else
  // TryK(k).
  void TryKAgain(size_t k);
  // The variants on top of one Per-Doc part (scoring `zig`) leaving `need`
  // tokens per rank; sets `feasible` if one meets the target.
  void TryVariants(size_t k, bool reduced, const ZigScore& zig, const std::vector<int64_t>& need,
                   const std::vector<int32_t>& rest, bool& feasible);
  // Scores the current candidate (pieces_, used_, workload_ on top of a
  // Per-Doc part scoring `zig`), keeps it if best (and in pool_); returns
  // whether it had short cut pieces.
  bool Consider(size_t k, bool reduced, const ZigScore& zig, bool& feasible);
  // Appends `c` to pool_ unless an equal candidate is there.
  void AddToPool(SearchCandidate c);

  const Batch& batch_;
  const FlashCpOptions& o_;
  std::span<const double> scales_;
  std::vector<int8_t> tried_;  // per k: -1 not tried, else whether it met R
  std::vector<ReducedZig> reduced_zigs_;
  SearchCandidate best_;
  bool have_ = false;
  // While set (FallbackCandidates), every candidate that meets the target
  // or has no sliver is also kept here.
  std::vector<SearchCandidate>* pool_ = nullptr;
  // Until then (FindBoundary, under kScales), the same candidates per k, in
  // the order made, and per k whether it met the target (-1: not tried):
  // the fallback's first pass is those again, made by the same steps from
  // the same state, so it takes them from here instead of making them anew.
  // A candidate's held documents are kept flat (all ranks' in one list,
  // each rank's end in it), which copies in two allocations, not N.
  struct Searched {
    std::vector<Shard> pieces;
    std::vector<int32_t> held;
    std::vector<uint32_t> held_end;  // per rank, the end of its documents in `held`
    bool reduced = true;
    PlanScore score;
  };
  std::vector<std::vector<Searched>> searched_;
  std::vector<int8_t> searched_met_;
  // The stop token's answer once it says stop: every TryK then returns at
  // once (as feasible, which ends the search).
  absl::Status stopped_;
  // Buffers reused by every candidate: the Whole-Doc steps', one rho's LPT
  // placement, a copy to equalize when a second cap may follow, the one the
  // current candidate consumed, its pieces (swapped with the best's when it
  // wins), per-rank workload after LPT and after equalization, and the
  // partial score.
  WholeDocScratch scratch_;
  WholeDocPlacement placement_, trial_;
  WholeDocPlacement* used_ = nullptr;
  std::vector<double> placed_workload_;
  std::vector<Shard> pieces_;
  std::vector<double> workload_;
  PartialScore part_;
};

}  // namespace flashcp::core::internal

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_SEARCH_H_
