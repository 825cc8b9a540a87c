#include "worker/attention_cpu.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/attention_reference.h"

namespace flashcp::worker {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;

// Tolerances of the fp32 blocked kernel against the double-accumulated
// reference, as MaxRelError (max abs diff / max |reference|). fp32 online
// softmax over up to ~500 keys: observed errors are at most 1.2e-7 (out),
// 1e-7 (lse), 1e-6 (dq, dk, dv) on AVX-512; the bounds leave an order of
// magnitude for other compilers and vector widths.
constexpr double kOutTol = 1e-5;
constexpr double kLseTol = 1e-6;
constexpr double kGradTol = 1e-5;

std::vector<float> Random(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& f : x) f = u(rng);
  return x;
}

struct Case {
  const char* name;
  std::vector<int64_t> doc_lens;
  int32_t heads, head_dim;
};

std::vector<Case> Cases() {
  std::vector<int64_t> tiny(300, 1);
  for (size_t i = 0; i < tiny.size(); i += 7) tiny[i] = 3;
  return {
      {"one_token", {1}, 1, 1},
      {"single_long_doc", {517}, 2, 16},
      {"mixed", {130, 1, 64, 65, 200, 7}, 3, 8},
      {"tiny_docs", tiny, 2, 4},
      {"odd_head_dim", {150, 90}, 2, 13},
      {"head_dim_128", {200}, 1, 128},
  };
}

class KernelVsReferenceTest : public ::testing::TestWithParam<Case> {};

// Whole documents: one query range per document, rows packed in order.
TEST_P(KernelVsReferenceTest, WholeDocumentsMatchReference) {
  const Case& c = GetParam();
  AttentionShape shape{c.heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  int64_t total = 0;
  for (int64_t len : c.doc_lens) total += len;
  const size_t n = static_cast<size_t>(total) * c.heads * c.head_dim;
  std::mt19937_64 rng(42);
  const std::vector<float> q = Random(n, rng), k = Random(n, rng), v = Random(n, rng),
                           dout = Random(n, rng);
  std::vector<float> o(n), lse(total * c.heads), dq(n), dk(n), dv(n);
  std::vector<DocAttention> docs;
  int64_t base = 0;
  const int64_t hd = int64_t{c.heads} * c.head_dim;
  for (int64_t len : c.doc_lens) {
    DocAttention doc;
    doc.k = k.data() + base * hd;
    doc.v = v.data() + base * hd;
    doc.kv_len = len;
    doc.queries = {QueryRange{base, 0, len}};
    doc.dk = dk.data() + base * hd;
    doc.dv = dv.data() + base * hd;
    docs.push_back(doc);
    base += len;
  }
  ThreadPool pool(2);
  ASSERT_THAT(AttentionForwardCpu(shape, docs, total, q.data(), o.data(), lse.data(), pool), IsOk());
  ASSERT_THAT(AttentionBackwardCpu(shape, docs, total, q.data(), o.data(), lse.data(),
                                   dout.data(), dq.data(), pool),
              IsOk());
  std::vector<float> ro(n), rlse(total * c.heads), rdq(n), rdk(n), rdv(n);
  ASSERT_THAT(ReferenceForward(shape, c.doc_lens, q, k, v, absl::MakeSpan(ro), absl::MakeSpan(rlse)),
              IsOk());
  ASSERT_THAT(ReferenceBackward(shape, c.doc_lens, q, k, v, dout, absl::MakeSpan(rdq),
                                absl::MakeSpan(rdk), absl::MakeSpan(rdv)),
              IsOk());
  EXPECT_LE(MaxRelError(o, ro), kOutTol);
  EXPECT_LE(MaxRelError(lse, rlse), kLseTol);
  EXPECT_LE(MaxRelError(dq, rdq), kGradTol);
  EXPECT_LE(MaxRelError(dk, rdk), kGradTol);
  EXPECT_LE(MaxRelError(dv, rdv), kGradTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelVsReferenceTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// A document of 300 tokens whose queries are split over two ranges held in
// reversed row order (as on a rank holding a zigzag head and tail): results on
// those rows equal the whole-document reference, and dk/dv equal the reference
// restricted to the gradients these queries produce.
TEST(KernelTest, PartialQueryRangesMatchReferenceRows) {
  const int32_t heads = 2, head_dim = 8;
  const int64_t len = 300, hd = heads * head_dim;
  AttentionShape shape{heads, head_dim, 1.0f / std::sqrt(8.0f)};
  std::mt19937_64 rng(7);
  const std::vector<float> q = Random(len * hd, rng), k = Random(len * hd, rng),
                           v = Random(len * hd, rng), dout = Random(len * hd, rng);
  // Local rows: [0, 50) hold positions [250, 300); [50, 120) hold [0, 70).
  const int64_t rows = 120;
  std::vector<float> lq(rows * hd), ldout(rows * hd);
  auto copy_rows = [&](const std::vector<float>& src, std::vector<float>& dst, int64_t row,
                       int64_t pos, int64_t n) {
    std::copy(src.begin() + pos * hd, src.begin() + (pos + n) * hd, dst.begin() + row * hd);
  };
  copy_rows(q, lq, 0, 250, 50);
  copy_rows(q, lq, 50, 0, 70);
  copy_rows(dout, ldout, 0, 250, 50);
  copy_rows(dout, ldout, 50, 0, 70);
  std::vector<float> o(rows * hd), lse(rows * heads), dq(rows * hd), dk(len * hd), dv(len * hd);
  DocAttention doc{k.data(), v.data(), len, {{0, 250, 50}, {50, 0, 70}}, dk.data(), dv.data()};
  ThreadPool pool(2);
  ASSERT_THAT(AttentionForwardCpu(shape, {doc}, rows, lq.data(), o.data(), lse.data(), pool),
              IsOk());
  ASSERT_THAT(AttentionBackwardCpu(shape, {doc}, rows, lq.data(), o.data(), lse.data(),
                                   ldout.data(), dq.data(), pool),
              IsOk());
  // Reference: full document forward; backward with dout zeroed outside the
  // two ranges, which is exactly the gradient of the loss restricted to them.
  std::vector<float> ro(len * hd), rlse(len * heads);
  ASSERT_THAT(ReferenceForward(shape, {len}, q, k, v, absl::MakeSpan(ro), absl::MakeSpan(rlse)),
              IsOk());
  std::vector<float> masked(len * hd, 0.0f);
  std::copy(dout.begin() + 250 * hd, dout.end(), masked.begin() + 250 * hd);
  std::copy(dout.begin(), dout.begin() + 70 * hd, masked.begin());
  std::vector<float> rdq(len * hd), rdk(len * hd), rdv(len * hd);
  ASSERT_THAT(ReferenceBackward(shape, {len}, q, k, v, masked, absl::MakeSpan(rdq),
                                absl::MakeSpan(rdk), absl::MakeSpan(rdv)),
              IsOk());
  std::vector<float> want_o(rows * hd), want_lse(rows * heads), want_dq(rows * hd);
  copy_rows(ro, want_o, 0, 250, 50);
  copy_rows(ro, want_o, 50, 0, 70);
  copy_rows(rdq, want_dq, 0, 250, 50);
  copy_rows(rdq, want_dq, 50, 0, 70);
  for (int64_t i = 0; i < 50; ++i)
    for (int h = 0; h < heads; ++h) want_lse[i * heads + h] = rlse[(250 + i) * heads + h];
  for (int64_t i = 0; i < 70; ++i)
    for (int h = 0; h < heads; ++h) want_lse[(50 + i) * heads + h] = rlse[i * heads + h];
  EXPECT_LE(MaxRelError(o, want_o), kOutTol);
  EXPECT_LE(MaxRelError(lse, want_lse), kLseTol);
  EXPECT_LE(MaxRelError(dq, want_dq), kGradTol);
  EXPECT_LE(MaxRelError(dk, rdk), kGradTol);
  EXPECT_LE(MaxRelError(dv, rdv), kGradTol);
}

TEST(KernelTest, DeterministicAcrossThreadCounts) {
  const int64_t len = 333, hd = 2 * 8;
  AttentionShape shape{2, 8, 0.3f};
  std::mt19937_64 rng(3);
  const std::vector<float> q = Random(len * hd, rng), k = Random(len * hd, rng),
                           v = Random(len * hd, rng);
  std::vector<float> o1(len * hd), o2(len * hd), l1(len * 2), l2(len * 2);
  DocAttention doc{k.data(), v.data(), len, {{0, 0, len}}, nullptr, nullptr};
  ThreadPool one(1), two(2);
  ASSERT_THAT(AttentionForwardCpu(shape, {doc}, len, q.data(), o1.data(), l1.data(), one), IsOk());
  ASSERT_THAT(AttentionForwardCpu(shape, {doc}, len, q.data(), o2.data(), l2.data(), two), IsOk());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

TEST(KernelTest, RejectsRangesOutsideTheDocument) {
  std::vector<float> buf(64, 0.0f);
  DocAttention doc{buf.data(), buf.data(), 4, {{0, 2, 3}}, nullptr, nullptr};
  ThreadPool pool(1);
  EXPECT_THAT(AttentionForwardCpu(AttentionShape{1, 1, 1.0f}, {doc}, 8, buf.data(), buf.data(),
                                  buf.data(), pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("docs[0].queries[0]")));
  DocAttention ok{buf.data(), buf.data(), 4, {{0, 0, 4}}, nullptr, nullptr};
  EXPECT_THAT(AttentionBackwardCpu(AttentionShape{1, 1, 1.0f}, {ok}, 8, buf.data(), buf.data(),
                                   buf.data(), buf.data(), buf.data(), pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null dk or dv")));
  EXPECT_THAT(ValidateDocs(AttentionShape{0, 1, 1.0f}, {}, 0, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("heads 0")));
}

TEST(KernelTest, AttentionPairsIsEquationThree) {
  DocAttention doc;
  doc.kv_len = 10;
  doc.queries = {{0, 0, 4}, {4, 6, 4}};  // (0+4+1)*4/2 + (12+4+1)*4/2 = 10 + 34
  EXPECT_EQ(AttentionPairs({doc}), 44.0);
}

TEST(ReferenceTest, BackwardTakesDFromTheStoredOutput) {
  // One 2-token document, 1 head, head_dim 1, scale 1. q = [0, 0], so every
  // score is 0 and token 1 attends to keys 0 and 1 with P = [1/2, 1/2];
  // k = [1, 2], v = [1, 3], dout = [0, 1] (token 0 adds nothing).
  // dP = dout_1 * v = [1, 3]; exact D = P . dP = 2 (= dout_1 * o_1, o_1 = 2).
  // dS = P (dP - D) = [-1/2, 1/2]: dq_1 = dS . k = -1/2 + 1 = 1/2.
  // With o_stored_1 = 2.5: D = 2.5, dS = [-3/4, 1/4], dq_1 = -3/4 + 1/2 = -1/4.
  // dk = dS * q_1 = 0 and dv = P * dout_1 = [1/2, 1/2] either way.
  const AttentionShape shape{1, 1, 1.0f};
  const std::vector<float> q = {0, 0}, k = {1, 2}, v = {1, 3}, dout = {0, 1};
  std::vector<float> dq(2), dk(2), dv(2);
  ASSERT_THAT(ReferenceBackward(shape, {2}, q, k, v, dout, absl::MakeSpan(dq), absl::MakeSpan(dk),
                                absl::MakeSpan(dv)),
              IsOk());
  EXPECT_THAT(dq, ::testing::ElementsAre(0.0f, 0.5f));
  const std::vector<float> o_stored = {1, 2.5f};
  ASSERT_THAT(ReferenceBackward(shape, {2}, q, k, v, dout, absl::MakeSpan(dq), absl::MakeSpan(dk),
                                absl::MakeSpan(dv), o_stored),
              IsOk());
  EXPECT_THAT(dq, ::testing::ElementsAre(0.0f, -0.25f));
  EXPECT_THAT(dk, ::testing::ElementsAre(0.0f, 0.0f));
  EXPECT_THAT(dv, ::testing::ElementsAre(0.5f, 0.5f));
  const std::vector<float> short_o = {1};
  EXPECT_THAT(ReferenceBackward(shape, {2}, q, k, v, dout, absl::MakeSpan(dq), absl::MakeSpan(dk),
                                absl::MakeSpan(dv), short_o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("o_stored")));
}

TEST(ThreadPoolTest, RunsEveryItemOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  }
}

}  // namespace
}  // namespace flashcp::worker
