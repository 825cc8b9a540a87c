// Checks of the rank plans (cp_layout.h): simulating the
// exchange on token ids, every staged KV row is exactly the document token the
// attention expects, every round scatters to distinct rows, and the rows moved
// times the row size equal core::AnalyzePlan's predicted bytes.
#include "worker/cp_layout.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "core/analysis.h"
#include "core/strategies.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::worker {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;

// A token's identity: (doc, position), or (-1, -1) for padding / zero rows.
using Tok = std::pair<int64_t, int64_t>;
constexpr Tok kNone{-1, -1};

struct Case {
  std::vector<int64_t> docs;
  int32_t n;
};

std::vector<Case> Cases() {
  return {{{1}, 1},
          {{100}, 1},
          {{64}, 2},
          {{1, 1, 1, 1, 1, 1, 1}, 3},
          {{700, 12, 5, 300, 1, 40}, 4},
          {{1000, 3000, 200, 50, 7, 7, 7, 1200}, 4},
          {{4096}, 8},
          {{5, 900, 33, 2000, 17, 600, 1, 1, 400}, 8},
          {{10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110}, 3}};
}

TEST(CpLayoutTest, StagedRowsAreTheDocumentPrefixAndBytesMatchAnalysis) {
  const core::ModelShape shape{.heads = 4, .head_dim = 16, .dtype_bytes = 2};
  const int64_t row_bytes = 2 * shape.heads * shape.head_dim * shape.dtype_bytes;
  int checked = 0;
  for (const Case& c : Cases()) {
    for (core::Strategy strategy : {core::Strategy::kLlama3, core::Strategy::kPerDoc,
                                    core::Strategy::kZigzag, core::Strategy::kRing,
                                    core::Strategy::kWholeDoc, core::Strategy::kFlashCp}) {
      auto plan = core::MakePlan(strategy, core::Batch{c.docs, c.n});
      ASSERT_THAT(plan, IsOk());
      auto layout = core::BuildCommLayout(*plan);
      ASSERT_THAT(layout, IsOk());
      auto metrics = core::AnalyzePlan(*plan, shape);
      ASSERT_THAT(metrics, IsOk());
      // Token identity of every local row.
      const int64_t local = core::TokensPerRank(core::TotalTokens(c.docs), c.n);
      std::vector<std::vector<Tok>> ids(c.n, std::vector<Tok>(local, kNone));
      for (const core::Shard& s : plan->shards) {
        const core::RankLayout& r = layout->ranks[s.rank];
        for (size_t i = 0; i < r.shards.size(); ++i)
          if (plan->shards[r.shards[i]] == s)
            for (int64_t t = 0; t < s.len; ++t) ids[s.rank][r.shard_offset[i] + t] = {s.doc, s.start + t};
      }
      for (core::CommScheme scheme : core::kKvCommSchemes) {
        SCOPED_TRACE(testing::Message() << core::StrategyName(strategy) << " "
                                        << core::CommSchemeName(scheme) << " n=" << c.n);
        std::vector<CpRankLayout> plans;
        for (int32_t r = 0; r < c.n; ++r) {
          auto p = BuildCpRankLayout(*plan, *layout, r, scheme);
          ASSERT_THAT(p, IsOk());
          plans.push_back(*std::move(p));
        }
        std::vector<std::vector<Tok>> pack(c.n);
        for (int32_t r = 0; r < c.n; ++r)
          for (int64_t row : plans[r].pack_rows) pack[r].push_back(row == kNoRow ? kNone : ids[r][row]);
        // The forward messages: each receive is exactly what its peer sends
        // this rank; under an all-gather every send is the whole pack buffer.
        std::vector<std::vector<Tok>> recvs(c.n);
        for (int32_t r = 0; r < c.n; ++r) {
          const CpRankLayout& p = plans[r];
          recvs[r].assign(p.recv_rows, kNone);
          if (p.collective == Collective::kAllGather) {
            ASSERT_EQ(static_cast<int64_t>(p.pack_rows.size()), p.block_rows);
            ASSERT_EQ(p.sends.size(), p.block_rows > 0 ? size_t(c.n - 1) : 0);
            ASSERT_EQ(p.recv_rows, c.n * p.block_rows);
            for (const RowSegment& seg : p.sends) EXPECT_EQ(seg.first, 0);
          } else {
            EXPECT_EQ(p.block_rows, 0);
          }
          for (const RowSegment& seg : p.recvs) {
            ASSERT_NE(seg.peer, r);
            ASSERT_LE(seg.first + seg.rows, p.recv_rows);
            int found = 0;
            for (const RowSegment& out : plans[seg.peer].sends) {
              if (out.peer != r) continue;
              ASSERT_EQ(out.rows, seg.rows);
              std::copy(pack[seg.peer].begin() + out.first,
                        pack[seg.peer].begin() + out.first + out.rows,
                        recvs[r].begin() + seg.first);
              ++found;
            }
            ASSERT_EQ(found, 1) << "from rank " << seg.peer;
          }
        }
        for (int32_t r = 0; r < c.n; ++r) {
          const CpRankLayout& p = plans[r];
          const std::vector<Tok>& recv = recvs[r];
          // Backward: each peer returns the gradients of the rows it received
          // from this rank; row for row, they are of the pack row sent there.
          ASSERT_EQ(p.back_first.size(), p.sends.size());
          std::vector<Tok> back(p.back_rows, kNone);
          for (size_t i = 0; i < p.sends.size(); ++i) {
            const RowSegment& out = p.sends[i];
            int found = 0;
            for (const RowSegment& in : plans[out.peer].recvs) {
              if (in.peer != r) continue;
              ASSERT_EQ(in.rows, out.rows);
              ASSERT_LE(p.back_first[i] + out.rows, p.back_rows);
              std::copy(recvs[out.peer].begin() + in.first,
                        recvs[out.peer].begin() + in.first + in.rows,
                        back.begin() + p.back_first[i]);
              ++found;
            }
            ASSERT_EQ(found, 1) << "back from rank " << out.peer;
            for (int64_t j = 0; j < out.rows; ++j)
              ASSERT_EQ(back[p.back_first[i] + j], pack[r][out.first + j]) << "back row " << j;
          }
          ASSERT_EQ(static_cast<int64_t>(recv.size()), p.recv_rows);
          // Every staged KV sequence is its document's tokens 0..kv_len-1,
          // and its queries are the last q_len of them.
          int64_t staged = 0;
          for (size_t i = 0; i < p.prefix_q_len.size(); ++i) {
            const Tok first_q = ids[r][p.prefix_q_start[i]];
            for (int32_t j = 0; j < p.prefix_kv_len[i]; ++j) {
              const int64_t src = p.stage_src[staged + j];
              const Tok got = src >= 0 ? ids[r][src] : recv[-1 - src];
              ASSERT_EQ(got, Tok(first_q.first, j)) << "prefix shard " << i << " row " << j;
            }
            EXPECT_EQ(first_q.second, p.prefix_kv_len[i] - p.prefix_q_len[i]);
            staged += p.prefix_kv_len[i];
          }
          EXPECT_EQ(staged, static_cast<int64_t>(p.stage_src.size()));
          for (size_t i = 0; i < p.whole_start.size(); ++i)
            EXPECT_EQ(ids[r][p.whole_start[i]].second, 0);
          // Whole and prefixed shards tile [0, real rows) exactly; padding follows.
          std::vector<int> cover(local, 0);
          for (size_t i = 0; i < p.whole_start.size(); ++i)
            for (int32_t t = 0; t < p.whole_len[i]; ++t) ++cover[p.whole_start[i] + t];
          for (size_t i = 0; i < p.prefix_q_start.size(); ++i)
            for (int32_t t = 0; t < p.prefix_q_len[i]; ++t) ++cover[p.prefix_q_start[i] + t];
          for (int64_t row = 0; row < local; ++row)
            ASSERT_EQ(cover[row], ids[r][row] == kNone ? 0 : 1) << "row " << row;
          for (int64_t row = 1; row < local; ++row)
            ASSERT_FALSE(ids[r][row - 1] == kNone && ids[r][row] != kNone) << "padding before a shard";
          // Rounds: distinct destinations within each, every staged row once.
          std::multiset<int64_t> all;
          for (const auto& round : p.stage_rounds) {
            std::set<int64_t> dst;
            for (int64_t row : round) {
              EXPECT_TRUE(dst.insert(p.stage_src[row]).second) << "destination repeats in a round";
              all.insert(row);
            }
          }
          EXPECT_EQ(all.size(), p.stage_src.size());
          // Bytes: exactly the analysis's prediction for this scheme.
          const RowCounts rows = ExchangedRows(p);
          const core::SchemeBytes& want = metrics->bytes[static_cast<int>(scheme)];
          EXPECT_EQ(rows.sent * row_bytes, want.sent[r]) << "rank " << r;
          EXPECT_EQ(rows.received * row_bytes, want.received[r]) << "rank " << r;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(CpLayoutTest, RejectsBadRank) {
  auto plan = core::MakePlan(core::Strategy::kLlama3, core::Batch{{64}, 2});
  ASSERT_THAT(plan, IsOk());
  auto layout = core::BuildCommLayout(*plan);
  ASSERT_THAT(layout, IsOk());
  EXPECT_THAT(BuildCpRankLayout(*plan, *layout, 2, core::CommScheme::kTargeted),
              StatusIs(absl::StatusCode::kInvalidArgument, testing::HasSubstr("rank 2")));
}

}  // namespace
}  // namespace flashcp::worker
