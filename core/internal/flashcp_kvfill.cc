// flashcp's density-fill candidates (flashcp_kvfill.h).
#include "core/internal/flashcp_kvfill.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/internal/strategies_internal.h"
#include "core/status_macros.h"

namespace flashcp::core::internal {
namespace {

// The tokens of one document not yet dealt, [lo, hi), and how they are
// peeled: mirrored (a head and a tail of equal length, or the head alone
// where too short for two pieces of the minimum) or heads alone.
struct Shell {
  int32_t doc = -1;  // -1: none
  int64_t lo = 0;
  int64_t hi = 0;
  bool mirrored = true;
};

// Where the deal stands between ranks.
struct FillState {
  size_t dense_next = 0;    // next dense document to start peeling
  Shell shell;              // the dense document being peeled
  int64_t dense_left = 0;   // dense tokens not yet dealt
  Shell part;               // the sparse document being cut
  int64_t sparse_left = 0;  // sparse tokens not yet dealt
};

// Takes x of the shell's tokens for `rank` (all that is left where x
// covers it), every piece and what is left >= m: the tokens taken, 0 where
// x cannot be taken so.
int64_t Peel(Shell& shell, int64_t x, int64_t m, int32_t rank, std::vector<Shard>* out,
             double& work) {
  const auto emit = [&](int64_t start, int64_t len) {
    work += ShardWorkload(start, len);
    if (out != nullptr) out->push_back(Shard{shell.doc, start, len, rank});
  };
  const int64_t rest = shell.hi - shell.lo;
  if (x >= rest) {
    emit(shell.lo, rest);
    shell.doc = -1;
    return rest;
  }
  if (rest - x < m || x < m) return 0;
  if (shell.mirrored && x >= 2 * m) {
    const int64_t head = (x + 1) / 2;
    const int64_t tail = x - head;
    emit(shell.lo, head);
    emit(shell.hi - tail, tail);
    shell.lo += head;
    shell.hi -= tail;
  } else {
    emit(shell.lo, x);
    shell.lo += x;
  }
  return x;
}

// Sums of tokens and pairs over a prefix of positions, with point updates
// (a Fenwick tree): whole documents a rank takes are a run of positions.
class PrefixSums {
 public:
  explicit PrefixSums(const std::vector<int64_t>& tokens)
      : tokens_(tokens.size() + 1, 0), work_(tokens.size() + 1, 0.0) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      Add(i, tokens[i], ShardWorkload(0, tokens[i]));
    }
    while (top_ * 2 < tokens_.size()) top_ *= 2;
  }
  void Add(size_t pos, int64_t tokens, double work) {
    for (size_t i = pos + 1; i < tokens_.size(); i += i & (~i + 1)) {
      tokens_[i] += tokens;
      work_[i] += work;
    }
  }
  // Over positions [0, end).
  int64_t Tokens(size_t end) const {
    int64_t sum = 0;
    for (size_t i = end; i > 0; i -= i & (~i + 1)) sum += tokens_[i];
    return sum;
  }
  double Work(size_t end) const {
    double sum = 0;
    for (size_t i = end; i > 0; i -= i & (~i + 1)) sum += work_[i];
    return sum;
  }
  // The largest end with Tokens(end) <= v (v >= 0; values are >= 0), and
  // into `below` that Tokens(end).
  size_t Search(int64_t v, int64_t& below) const {
    size_t pos = 0;
    int64_t left = v;
    for (size_t step = top_; step > 0; step /= 2) {
      if (pos + step < tokens_.size() && tokens_[pos + step] <= left) {
        pos += step;
        left -= tokens_[pos];
      }
    }
    below = v - left;
    return pos;
  }

 private:
  std::vector<int64_t> tokens_;
  std::vector<double> work_;
  size_t top_ = 1;  // Search's first step: the largest power of 2 below tokens_.size(), or 1
};

class Filler {
 public:
  Filler(const Batch& batch, SparseOrder order, int64_t max_tokens, std::vector<int32_t> dense,
         std::vector<int32_t> sparse)
      : lens_(batch.doc_lens),
        max_tokens_(max_tokens),
        order_(order),
        dense_(std::move(dense)),
        asc_(std::move(sparse)),
        asc_lens_(SparseLens(lens_, asc_)),
        taken_(asc_.size(), 0),
        hi_(asc_.size()),
        tree_(asc_lens_) {
    for (int32_t d : dense_) state_.dense_left += lens_[d];
    for (int32_t d : asc_) state_.sparse_left += lens_[d];
  }

  const FillState& state() const { return state_; }

  // Rank `rank`'s deal of `tokens` tokens with y of them sparse (fewer where
  // a cut would leave a piece under `m`): its pairs, or -1 where the dense
  // side cannot give the rest exactly. With `out`, the deal is made (y
  // must be one that gave pairs >= 0 from the same state).
  double Deal(int64_t tokens, int64_t y, int64_t m, int32_t rank, std::vector<Shard>* out) {
    FillState s = state_;
    double work = 0;
    const int64_t sy = TakeSparse(s, y, m, rank, out, work);
    const int64_t dx = TakeDense(s, tokens - sy, m, rank, out, work);
    if (sy + dx != tokens) return -1;
    if (out != nullptr) state_ = s;
    return work;
  }

  // The rest, to the last rank.
  void DealRest(int32_t rank, std::vector<Shard>& out) {
    double work = 0;
    TakeDense(state_, state_.dense_left, 1, rank, &out, work);
    TakeSparse(state_, state_.sparse_left, 1, rank, &out, work);
  }

 private:
  int64_t Len(size_t pos) const { return asc_lens_[pos]; }

  static std::vector<int64_t> SparseLens(const std::vector<int64_t>& lens,
                                         const std::vector<int32_t>& docs) {
    std::vector<int64_t> out;
    out.reserve(docs.size());
    for (int32_t d : docs) out.push_back(lens[d]);
    return out;
  }

  // The untaken whole documents of asc_[first, last) that y sparse tokens
  // take from the walk's end, found on the Fenwick sums (taken ones count
  // 0), and their tokens and pairs.
  struct WholeRun {
    size_t first = 0;
    size_t last = 0;
    int64_t tokens = 0;
    double work = 0;
  };
  WholeRun FindWholeRun(int64_t y) {
    const bool up = order_ == SparseOrder::kShortestFirst;
    if (!end_known_) {  // the walk's fixed end, lo_ or hi_, on the sums
      end_tokens_ = tree_.Tokens(up ? lo_ : hi_);
      end_work_ = tree_.Work(up ? lo_ : hi_);
      end_known_ = true;
    }
    size_t first = 0;
    size_t last = 0;
    int64_t first_tokens = 0;  // tree_.Tokens(first)
    int64_t last_tokens = 0;   // tree_.Tokens(last)
    if (up) {
      first = lo_;
      first_tokens = end_tokens_;
      last = tree_.Search(first_tokens + y, last_tokens);
    } else {
      last = hi_;
      last_tokens = end_tokens_;
      const int64_t x = last_tokens - y;
      if (x > 0) {
        // Search's end is below hi_ (Tokens(hi_) > x - 1, as y >= 0: the
        // callers ask for y >= 0 tokens, and Peel takes at most y): a position,
        // whose own tokens (0 once taken) end the range before `first`.
        const size_t p = tree_.Search(x - 1, first_tokens);
        if (!taken_[p]) first_tokens += Len(p);
        first = p + 1;
      }
    }
    return WholeRun{first, last, last_tokens - first_tokens,
                    up ? tree_.Work(last) - end_work_ : end_work_ - tree_.Work(first)};
  }

  // For the y > 0 tokens left after `run`, the sparse document whose head
  // is cut (asc_.size(): none) and the head's tokens: the shortest one that
  // keeps both pieces >= m; shortest first, failing that, the run's last
  // whole document given back (`dropped`) and a longer head.
  size_t FindHead(int64_t y, int64_t m, const WholeRun& run, size_t& dropped,
                  int64_t& head) const {
    const bool up = order_ == SparseOrder::kShortestFirst;
    size_t cut = asc_.size();
    if (y <= 0) return cut;
    const size_t from = up ? run.last : 0;
    const size_t to = up ? asc_.size() : run.first;
    if (y >= m) cut = FindCut(y + m, from, to);
    if (cut == asc_.size() && up && y < m) {
      size_t p = run.last;
      while (p > run.first && taken_[p - 1]) --p;
      if (p > run.first && y + Len(p - 1) >= m) {
        cut = FindCut(y + Len(p - 1) + m, from, to);
        if (cut != asc_.size()) dropped = p - 1;
      }
    }
    if (cut != asc_.size()) head = dropped == asc_.size() ? y : y + Len(dropped);
    return cut;
  }

  // y sparse tokens into `s`: the cut document's rest first, then whole
  // documents from the order's end while they fit, then the head of the
  // shortest document left that keeps both pieces >= m (shortest first:
  // or one whole document fewer and a longer head). The tokens taken.
  int64_t TakeSparse(FillState& s, int64_t y, int64_t m, int32_t rank, std::vector<Shard>* out,
                     double& work) {
    int64_t taken = 0;
    if (s.part.doc >= 0) {
      const int64_t rest = s.part.hi - s.part.lo;
      const int64_t got = Peel(s.part, std::min(y, rest), m, rank, out, work);
      if (got < rest) {  // the part not finished: nothing else fits
        s.sparse_left -= got;
        return got;
      }
      taken += got;
      y -= got;
    }
    WholeRun run = FindWholeRun(y);
    // dropped: the last whole one in the walk's order, given back
    // (shortest first only; asc_.size(): none).
    size_t dropped = asc_.size();
    int64_t head = 0;
    const size_t cut = FindHead(y - run.tokens, m, run, dropped, head);
    if (dropped != asc_.size()) {
      run.tokens -= Len(dropped);
      run.work -= ShardWorkload(0, Len(dropped));
    }
    taken += run.tokens;
    work += run.work;
    if (out != nullptr) {
      for (size_t p = run.first; p < run.last; ++p) {
        if (taken_[p] || p == dropped) continue;
        out->push_back(Shard{asc_[p], 0, Len(p), rank});
        Take(p);
      }
    }
    if (head > 0) {
      // A document longer than any rank's tokens is peeled mirrored, so
      // that the ranks taking its rest get the same pairs per token.
      s.part = Shell{asc_[cut], 0, Len(cut), Len(cut) > max_tokens_};
      taken += Peel(s.part, head, m, rank, out, work);
      if (out != nullptr) Take(cut);
    }
    if (out != nullptr) {
      while (lo_ < asc_.size() && taken_[lo_]) ++lo_;
      while (hi_ > 0 && taken_[hi_ - 1]) --hi_;
      end_known_ = false;
    }
    s.sparse_left -= taken;
    return taken;
  }

  void Take(size_t p) {
    taken_[p] = 1;
    tree_.Add(p, -Len(p), -ShardWorkload(0, Len(p)));
  }

  // The shortest untaken sparse document in asc_[from, to) of at least
  // `len` tokens; asc_.size() if none.
  size_t FindCut(int64_t len, size_t from, size_t to) const {
    size_t p = static_cast<size_t>(std::lower_bound(asc_lens_.begin(), asc_lens_.end(), len) -
                                   asc_lens_.begin());
    for (p = std::max(p, from); p < to; ++p) {
      if (!taken_[p]) return p;
    }
    return asc_.size();
  }

  // x dense tokens into `s`: the shell's outermost tokens, a head of
  // ceil(x / 2) and a tail of floor(x / 2) (a head alone where x < 2m),
  // whole shells where x covers them, every piece and the shell left
  // >= m. The tokens taken.
  int64_t TakeDense(FillState& s, int64_t x, int64_t m, int32_t rank, std::vector<Shard>* out,
                    double& work) {
    int64_t taken = 0;
    while (x > 0) {
      if (s.shell.doc < 0) {
        if (s.dense_next >= dense_.size()) break;
        const int32_t d = dense_[s.dense_next++];
        s.shell = Shell{d, 0, lens_[d], true};
      }
      const int64_t got = Peel(s.shell, x, m, rank, out, work);
      if (got == 0) break;
      x -= got;
      taken += got;
    }
    s.dense_left -= taken;
    return taken;
  }

  const std::vector<int64_t>& lens_;
  const int64_t max_tokens_;  // the most tokens a rank holds
  const SparseOrder order_;
  const std::vector<int32_t> dense_;  // longest first
  const std::vector<int32_t> asc_;    // sparse, shortest first
  const std::vector<int64_t> asc_lens_;  // per position of asc_: its tokens
  std::vector<char> taken_;           // per position of asc_: dealt
  size_t lo_ = 0;                     // asc_[0, lo_) all dealt
  size_t hi_;                         // asc_[hi_, end) all dealt
  // tree_'s Tokens and Work at the walk's fixed end (lo_ shortest first,
  // else hi_), while end_known_: until the next deal is made.
  bool end_known_ = false;
  int64_t end_tokens_ = 0;
  double end_work_ = 0;
  PrefixSums tree_;                   // over asc_, dealt ones 0
  FillState state_;
};

}  // namespace

bool KvFillPieces(const Batch& batch, const FlashCpOptions& options, SparseOrder order,
                  std::vector<Shard>& out) {
  const int32_t n = batch.cp_size;
  if (n < 2) return false;
  const int64_t m = std::max<int64_t>(options.min_shard, 1);
  const std::vector<int64_t>& targets = options.targets;
  int64_t total = 0;
  for (int64_t t : targets) total += t;
  // The mean rank's pairs per token: documents denser than that are dealt
  // from the dense end.
  const double density = options.total_work / static_cast<double>(total);
  std::vector<int32_t> dense;
  std::vector<int32_t> sparse;
  for (int32_t d : options.order) {
    const double own = static_cast<double>(batch.doc_lens[d] + 1) / 2;
    (own > density ? dense : sparse).push_back(d);
  }
  if (dense.empty()) return false;
  std::reverse(sparse.begin(), sparse.end());  // shortest first
  const int64_t max_tokens = *std::max_element(targets.begin(), targets.end());
  Filler filler(batch, order, max_tokens, std::move(dense), std::move(sparse));
  const size_t out_size = out.size();
  double left = options.total_work;
  for (int32_t r = 0; r + 1 < n; ++r) {
    const int64_t tokens = targets[r];
    const double aim = left / (n - r);
    const FillState& s = filler.state();
    // y sparse tokens: at least what the dense side cannot give.
    int64_t lo = std::max<int64_t>(0, tokens - s.dense_left);
    int64_t hi = std::min(tokens, s.sparse_left);
    if (lo > hi) {
      out.resize(out_size);
      return false;
    }
    // Without the minimum shard the pairs fall as y grows (by about the
    // dense and sparse densities' difference per token, nearly linearly):
    // the least y at or under the aim, by interpolation inside a bracket
    // [lo, hi] (f(lo) above the aim, f(hi) not), every third step halving.
    const auto f = [&](int64_t y) { return filler.Deal(tokens, y, 1, r, nullptr); };
    double f_lo = f(lo);
    if (f_lo > aim) {
      double f_hi = f(hi);
      if (f_hi > aim) {
        lo = hi;
      } else {
        for (int step = 1; hi - lo > 1; ++step) {
          int64_t mid = lo + (hi - lo) / 2;
          if (step % 3 != 0 && f_lo > f_hi) {
            const double t = (f_lo - aim) / (f_lo - f_hi);
            mid = std::clamp<int64_t>(lo + static_cast<int64_t>(t * static_cast<double>(hi - lo)),
                                      lo + 1, hi - 1);
          }
          const double f_mid = f(mid);
          if (f_mid > aim) {
            lo = mid;
            f_lo = f_mid;
          } else {
            hi = mid;
            f_hi = f_mid;
          }
        }
        lo = hi;
      }
    }
    int64_t best_y = -1;
    double best_error = 0;
    const double tolerance = kFillTolerance * options.mean_work;
    for (int64_t step = 0; step < kFillScan && !(best_y >= 0 && best_error <= tolerance); ++step) {
      for (const int64_t y : {lo + step, lo - 1 - step}) {
        if (y < 0 || y > tokens) continue;
        const double w = filler.Deal(tokens, y, m, r, nullptr);
        if (w < 0) continue;
        const double error = std::abs(w - aim);
        if (best_y < 0 || error < best_error) {
          best_y = y;
          best_error = error;
        }
      }
    }
    if (best_y < 0) {
      out.resize(out_size);
      return false;
    }
    left -= filler.Deal(tokens, best_y, m, r, &out);
  }
  filler.DealRest(n - 1, out);
  return true;
}

absl::Status FillCandidates(const Batch& batch, const FlashCpOptions& options,
                            const RankBand& /*band*/, const StageAtN& at,
                            CandidateJudge& judge) {
  constexpr SparseOrder kOrders[] = {SparseOrder::kShortestFirst, SparseOrder::kLongestFirst};
  for (size_t v = 0; v < std::min(at.variants, std::size(kOrders)); ++v) {
    FLASHCP_RETURN_IF_ERROR(options.CheckStop());
    std::vector<Shard> pieces;
    if (KvFillPieces(batch, options, kOrders[v], pieces)) judge.Offer(pieces);
  }
  return absl::OkStatus();
}

}  // namespace flashcp::core::internal
