// The all-to-all (Ulysses) scheme's part of a rank's exchange layout
// (cp_layout.h's CpRankLayout::a2a; the table entry in cp_layout.cc builds
// it). Within the rank's group (core::PlanRankGroups: the ranks linked by
// the documents they share), every position sends its real local rows of the
// other positions' heads, receives the group's other tokens of its own heads,
// attends every document of the group whole, and returns the output rows to
// their owners (core/rank_groups.h counts exactly these rows).
//
// Rows: "gathered order" lists the group's real tokens position by position,
// each position's local rows [0, tokens[p]) in local order (padding rows
// never travel); the head-parallel buffers hold the same S rows in document
// order (the group's documents by id, each whole), where attention runs.
// Heads: which query and KV heads position j computes is
// core::AllToAllGroupHeads (FailedPrecondition where K does not divide Hq).
#ifndef FLASHCP_WORKER_A2A_LAYOUT_H_
#define FLASHCP_WORKER_A2A_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/analysis.h"
#include "core/rank_groups.h"
#include "core/types.h"

namespace flashcp::worker {

struct AllToAllLayout {
  std::vector<int32_t> group;   // this rank's group, ranks ascending
  int32_t position = 0;         // this rank's index in `group`
  std::vector<int64_t> tokens;  // per position: real local rows, sent as [0, tokens)
  std::vector<int64_t> first;   // per position: its first gathered row
  int64_t rows = 0;             // S: the group's real tokens
  std::vector<int64_t> doc_row;  // per gathered row: its head-parallel row (a permutation)
  // The group's documents in the head-parallel buffers: rows [doc_start,
  // doc_start + doc_len), document positions [0, doc_len).
  std::vector<int64_t> doc_start;
  std::vector<int32_t> doc_len;
  // The two-level scheme (core/two_level.h; two_level_layout.h): `group` is
  // this rank's node part of a larger rank group, the head-parallel rows hold
  // the part's tokens by (document, position), documents need not be whole
  // (doc_start, doc_len empty), and the CpRankLayout's KV-row fields carry
  // the exchange across nodes and the attention batches.
  bool two_level = false;
};

// Rank `rank`'s part; the plan must be valid and `layout` its
// core::BuildCommLayout (not checked here: BuildCpRankLayout checks).
absl::StatusOr<AllToAllLayout> BuildAllToAllLayout(const core::Plan& plan,
                                                   const core::CommLayout& layout, int32_t rank);

// The same over `part` (ranks ascending, holding `rank`; the plan valid),
// whose documents need not be whole: the head-parallel rows hold the part's
// tokens ordered by (document, position in it); doc_start, doc_len empty.
absl::StatusOr<AllToAllLayout> BuildAllToAllPartLayout(const core::Plan& plan,
                                                       const core::CommLayout& layout,
                                                       int32_t rank,
                                                       const std::vector<int32_t>& part);

// The heads of a group of `a.group.size()` ranks for Hq query and Hkv KV
// heads of width head_dim (core::AllToAllGroupHeads: FailedPrecondition
// naming query_heads unless the group's size divides Hq; InvalidArgument for
// a bad shape).
absl::StatusOr<core::AllToAllHeads> AllToAllLayoutHeads(const AllToAllLayout& a,
                                                        int32_t query_heads, int32_t kv_heads,
                                                        int32_t head_dim);

}  // namespace flashcp::worker

#endif  // FLASHCP_WORKER_A2A_LAYOUT_H_
