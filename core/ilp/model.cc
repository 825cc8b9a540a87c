// The ILP strategy's model (model.h).
#include "core/ilp/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "core/analysis.h"
#include "core/internal/strategies_internal.h"

namespace flashcp::core::ilp {

using internal::FinishPlan;

// Largest value an integer column may take (see BuildModel).
constexpr double kMaxIntegralColumn = 1 << 24;

// Blocks of at most `g` tokens, also cut at every shard boundary of `plans`.
std::vector<Block> MakeBlocks(const Batch& batch, int64_t g, const std::vector<Plan>& plans) {
  std::vector<std::vector<int64_t>> cuts(batch.doc_lens.size());
  for (const Plan& p : plans) {
    for (const Shard& s : p.shards) {
      cuts[s.doc].push_back(s.start);
      cuts[s.doc].push_back(s.start + s.len);
    }
  }
  std::vector<Block> blocks;
  for (size_t d = 0; d < batch.doc_lens.size(); ++d) {
    const int64_t len = batch.doc_lens[d];
    std::vector<int64_t>& c = cuts[d];
    for (int64_t a = 0; a < len; a += g) c.push_back(a);
    c.push_back(len);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    for (size_t i = 0; i + 1 < c.size(); ++i) {
      blocks.push_back(Block{static_cast<int32_t>(d), c[i], c[i + 1] - c[i], i + 2 == c.size()});
    }
  }
  return blocks;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The x (and z) columns: x[b][r] for every block and rank, z[b][r] for
// every non-final block; the next free column.
int AddBlockColumns(Model& m) {
  const size_t nb = m.blocks.size();
  int next = static_cast<int>(nb) * m.ranks;
  m.z_base.assign(nb, -1);
  for (size_t b = 0; b < nb; ++b) {
    if (!m.blocks[b].final) {
      m.z_base[b] = next;
      next += m.ranks;
    }
  }
  return next;
}

// Symmetry: ranks with equal token targets are interchangeable (the groups
// [0, N - pad) and [N - pad, N), pad = padding tokens), so the model keeps
// only plans whose ranks within a group are ordered by their first block:
// rank r above its group's start may hold block b only if rank r - 1 holds
// a block before b. With c[b][r-1] = sum_{b' <= b} x[b'][r-1] (continuous):
//   x[b][r] <= c[b-1][r-1]   and   x[b][r] = 0 for b < r - group start.
// Every rank holds >= 1 token (N <= total), so any plan has such a
// relabeling. The c columns from `next`; the next free column.
int AddSymmetryColumns(Model& m, int64_t total, int next) {
  const int32_t n = m.ranks;
  const size_t nb = m.blocks.size();
  const int64_t pad = PaddingTokens(total, n);
  m.group_start.resize(n);
  m.c_base.assign(n, -1);
  for (int32_t r = 0; r < n; ++r) m.group_start[r] = r < n - pad ? 0 : static_cast<int32_t>(n - pad);
  for (int32_t r = 0; r + 1 < n; ++r) {
    if (m.group_start[r + 1] == m.group_start[r] && nb > 1) {
      m.c_base[r] = next;
      next += static_cast<int>(nb) - 1;  // c[b][r] for b < nb - 1
    }
  }
  return next;
}

// The symmetry rows (AddSymmetryColumns).
void AddSymmetryRows(Model& m) {
  const size_t nb = m.blocks.size();
  for (int32_t r = 0; r < m.ranks; ++r) {
    for (size_t b = 0; b < nb && static_cast<int64_t>(b) < r - m.group_start[r]; ++b) {
      m.col_ub[m.X(b, r)] = 0.0;
    }
    if (m.c_base[r] < 0) continue;
    for (size_t b = 0; b + 1 < nb; ++b) {  // c[b][r] = c[b-1][r] + x[b][r]
      const int row = m.AddRow(0.0, 0.0);
      m.Add(row, m.C(b, r), 1.0);
      m.Add(row, m.X(b, r), -1.0);
      if (b > 0) m.Add(row, m.C(b - 1, r), -1.0);
      m.col_ub[m.C(b, r)] = static_cast<double>(b + 1);
      const int order = m.AddRow(-kInf, 0.0);  // x[b+1][r+1] <= c[b][r]
      m.Add(order, m.X(b + 1, r + 1), 1.0);
      m.Add(order, m.C(b, r), -1.0);
    }
  }
}

// Each block on exactly one rank; per rank its token target, its workload
// and non-last tokens under the maxima, z[b][r] (block b and every later
// block of its document on r) under x and the next z.
void AddRankRows(Model& m, int64_t total) {
  const int32_t n = m.ranks;
  const size_t nb = m.blocks.size();
  for (size_t b = 0; b < nb; ++b) {  // each block on exactly one rank
    const int row = m.AddRow(1.0, 1.0);
    for (int32_t r = 0; r < n; ++r) m.Add(row, m.X(b, r), 1.0);
  }
  for (int32_t r = 0; r < n; ++r) {
    const double target = static_cast<double>(RankRealTokens(total, n, r));
    const int tokens = m.AddRow(target, target);  // integer coefficients: exact
    const int work = m.AddRow(-kInf, 0.0);
    const int nonlast = m.AddRow(-kInf, 0.0);
    for (size_t b = 0; b < nb; ++b) {
      const Block& k = m.blocks[b];
      m.Add(tokens, m.X(b, r), static_cast<double>(k.len));
      m.Add(work, m.X(b, r), ShardWorkload(k.start, k.len));
      if (!k.final) {
        const double t = static_cast<double>(k.len);
        m.Add(nonlast, m.X(b, r), t);
        m.Add(nonlast, m.z_base[b] + r, -t);
        const int zx = m.AddRow(-kInf, 0.0);  // z[b][r] <= x[b][r]
        m.Add(zx, m.z_base[b] + r, 1.0);
        m.Add(zx, m.X(b, r), -1.0);
        const int zn = m.AddRow(-kInf, 0.0);  // z[b][r] <= z[b+1][r]
        m.Add(zn, m.z_base[b] + r, 1.0);
        m.Add(zn, m.NextZ(b, r), -1.0);
      }
    }
    m.Add(work, m.w_col, -1.0);
    m.Add(nonlast, m.m_col, -1.0);
  }
}

}  // namespace

Model BuildModel(const Batch& batch, std::vector<Block> blocks, double mean_work,
                 double comm_weight) {
  const int32_t n = batch.cp_size;
  const int64_t total = TotalTokens(batch.doc_lens);
  Model m;
  m.ranks = n;
  m.mean_work = mean_work;
  m.blocks = std::move(blocks);
  int next = AddSymmetryColumns(m, total, AddBlockColumns(m));
  m.w_col = next++;
  m.m_col = next++;
  m.num_cols = next;
  m.col_lb.assign(next, 0.0);
  m.col_ub.assign(next, 1.0);
  m.obj.assign(next, 0.0);
  m.col_ub[m.w_col] = kInf;
  m.col_ub[m.m_col] = kInf;
  m.obj[m.w_col] = 1.0 / mean_work;
  m.obj[m.m_col] = comm_weight / mean_work;
  // Both maxima are integers (pairs, tokens); declaring them so lets CBC round
  // its bounds up, which is most of what proves small instances optimal. Past
  // kMaxIntegralColumn a double no longer resolves CBC's integer tolerance.
  m.w_integral = mean_work * n <= kMaxIntegralColumn;
  m.m_integral = static_cast<double>(total) <= kMaxIntegralColumn;
  // Valid lower bounds: some rank holds at least the mean, and every block.
  double lb = m.w_integral ? std::ceil(mean_work - 1e-9) : mean_work;
  for (const Block& k : m.blocks) lb = std::max(lb, ShardWorkload(k.start, k.len));
  m.col_lb[m.w_col] = lb;

  AddSymmetryRows(m);
  AddRankRows(m, total);
  return m;
}

// Each block's owner in `plan`, whose shard boundaries are all block
// boundaries; nullopt if a block straddles two shards.
std::optional<std::vector<int32_t>> OwnersOf(const Plan& plan, const std::vector<Block>& blocks) {
  std::vector<Shard> shards = plan.shards;
  std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) {
    return std::tie(a.doc, a.start) < std::tie(b.doc, b.start);
  });
  std::vector<int32_t> owners(blocks.size());
  size_t s = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Block& k = blocks[b];
    while (s < shards.size() && (shards[s].doc < k.doc || (shards[s].doc == k.doc &&
                                                           shards[s].start + shards[s].len <= k.start))) {
      ++s;
    }
    if (s == shards.size() || shards[s].doc != k.doc || shards[s].start > k.start ||
        shards[s].start + shards[s].len < k.start + k.len) {
      return std::nullopt;
    }
    owners[b] = shards[s].rank;
  }
  return owners;
}

// Relabels ranks within each target group in order of their first block, the
// one labeling the symmetry rows admit; token targets and objective unchanged.
void Canonicalize(const Model& m, std::vector<int32_t>& owners) {
  std::vector<int32_t> label(m.ranks, -1);
  std::vector<int32_t> next(m.ranks);
  for (int32_t r = 0; r < m.ranks; ++r) next[r] = m.group_start[r];
  for (int32_t& o : owners) {
    if (label[o] < 0) label[o] = next[m.group_start[o]]++;
    o = label[o];
  }
}

// The full column vector (x, z, max workload, max non-last) of an assignment.
std::vector<double> SolutionOf(const Model& m, const std::vector<int32_t>& owners) {
  std::vector<double> sol(m.num_cols, 0.0);
  std::vector<double> work(m.ranks, 0.0), nonlast(m.ranks, 0.0);
  bool tail_same = true;  // after block i: blocks i.. of its document all on owners[i]
  for (size_t i = m.blocks.size(); i-- > 0;) {
    const Block& k = m.blocks[i];
    const int32_t r = owners[i];
    sol[m.X(i, r)] = 1.0;
    work[r] += ShardWorkload(k.start, k.len);
    if (k.final) {
      tail_same = true;
    } else {
      tail_same = tail_same && owners[i + 1] == r;
      if (tail_same) {
        sol[m.z_base[i] + r] = 1.0;
      } else {
        nonlast[r] += static_cast<double>(k.len);
      }
    }
  }
  for (int32_t r = 0; r < m.ranks; ++r) {
    if (m.c_base[r] < 0) continue;
    double held = 0.0;
    for (size_t b = 0; b + 1 < m.blocks.size(); ++b) {
      held += sol[m.X(b, r)];
      sol[m.C(b, r)] = held;
    }
  }
  sol[m.w_col] = *std::max_element(work.begin(), work.end());
  sol[m.m_col] = *std::max_element(nonlast.begin(), nonlast.end());
  return sol;
}

// The owners of a CBC solution: each block's rank with the largest x.
std::vector<int32_t> OwnersFromSolution(const Model& m, const double* sol) {
  std::vector<int32_t> owners(m.blocks.size());
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    int32_t best = 0;
    for (int32_t r = 1; r < m.ranks; ++r) {
      if (sol[m.X(b, r)] > sol[m.X(b, best)]) best = r;
    }
    owners[b] = best;
  }
  return owners;
}

Plan PlanOfOwners(const Batch& batch, const Model& m, const std::vector<int32_t>& owners) {
  std::vector<Shard> pieces;
  pieces.reserve(m.blocks.size());
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    const Block& k = m.blocks[b];
    pieces.push_back(Shard{k.doc, k.start, k.len, owners[b]});
  }
  return FinishPlan(batch, std::move(pieces));
}

}  // namespace flashcp::core::ilp
