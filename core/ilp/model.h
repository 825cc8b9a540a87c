// The ILP strategy's model (ilp.cc, docs/ilp.md): blocks of documents, the
// MILP's columns and rows in CBC's terms, and the maps between plans,
// block owners and column vectors.
#ifndef FLASHCP_CORE_ILP_MODEL_H_
#define FLASHCP_CORE_ILP_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/types.h"

namespace flashcp::core::ilp {

struct Block {
  int32_t doc = 0;
  int64_t start = 0;
  int64_t len = 0;
  bool final = false;  // the last block of its document
};

// The MILP's columns and rows, in CBC's terms.
struct Model {
  int32_t ranks = 0;
  std::vector<Block> blocks;
  std::vector<int> z_base;  // per block: column of z[b][0], -1 for a final block
  std::vector<int32_t> group_start;  // per rank: first rank with the same token target
  std::vector<int> c_base;  // per rank r: column of c[0][r], or -1 (see BuildModel)
  int w_col = 0;            // max rank workload, (query, key) pairs
  int m_col = 0;            // max rank non-last tokens
  int num_cols = 0;
  double mean_work = 1.0;  // mean rank workload, (query, key) pairs
  bool w_integral = false;  // w_col is an integer column
  bool m_integral = false;  // m_col is an integer column
  std::vector<double> col_lb, col_ub, obj;
  std::vector<int> row_idx, col_idx;
  std::vector<double> elems;
  std::vector<double> row_lb, row_ub;

  int X(size_t b, int32_t r) const { return static_cast<int>(b) * ranks + r; }
  int C(size_t b, int32_t r) const { return c_base[r] + static_cast<int>(b); }
  int NextZ(size_t b, int32_t r) const {  // z[b+1][r], or x[b+1][r] when b+1 is final
    return blocks[b + 1].final ? X(b + 1, r) : z_base[b + 1] + r;
  }
  int AddRow(double lb, double ub) {
    row_lb.push_back(lb);
    row_ub.push_back(ub);
    return static_cast<int>(row_lb.size()) - 1;
  }
  void Add(int row, int col, double v) {
    row_idx.push_back(row);
    col_idx.push_back(col);
    elems.push_back(v);
  }
};

// Blocks of at most `g` tokens, also cut at every shard boundary of `plans`.
std::vector<Block> MakeBlocks(const Batch& batch, int64_t g, const std::vector<Plan>& plans);
// The model of `blocks` (ilp.cc's header comment states it).
Model BuildModel(const Batch& batch, std::vector<Block> blocks, double mean_work,
                 double comm_weight);
// Each block's owner in `plan`, whose shard boundaries are all block
// boundaries; nullopt if a block straddles two shards.
std::optional<std::vector<int32_t>> OwnersOf(const Plan& plan, const std::vector<Block>& blocks);
// Relabels ranks within each target group in order of their first block, the
// one labeling the symmetry rows admit; token targets and objective unchanged.
void Canonicalize(const Model& m, std::vector<int32_t>& owners);
// The full column vector (x, z, max workload, max non-last) of an assignment.
std::vector<double> SolutionOf(const Model& m, const std::vector<int32_t>& owners);
// The owners of a CBC solution: each block's rank with the largest x.
std::vector<int32_t> OwnersFromSolution(const Model& m, const double* sol);
// The plan of an assignment.
Plan PlanOfOwners(const Batch& batch, const Model& m, const std::vector<int32_t>& owners);

}  // namespace flashcp::core::ilp

#endif  // FLASHCP_CORE_ILP_MODEL_H_
