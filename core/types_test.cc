#include "core/types.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TokensTest, CanonicalPaddingLayout) {
  // 10 tokens on 4 ranks: C/N = ceil(10/4) = 3, padding 4*3 - 10 = 2, on ranks 2 and 3.
  EXPECT_EQ(TokensPerRank(10, 4), 3);
  EXPECT_EQ(PaddingTokens(10, 4), 2);
  EXPECT_EQ(RankRealTokens(10, 4, 0), 3);
  EXPECT_EQ(RankRealTokens(10, 4, 1), 3);
  EXPECT_EQ(RankRealTokens(10, 4, 2), 2);
  EXPECT_EQ(RankRealTokens(10, 4, 3), 2);
  EXPECT_EQ(PaddingTokens(12, 4), 0);
  EXPECT_EQ(RankRealTokens(12, 4, 3), 3);
}

struct BadBatchCase {
  const char* name;
  Batch batch;
  BatchLimits limits;
  absl::StatusCode code;
  const char* message;
};

TEST(ValidateBatchTest, RejectsEachBadInputWithItsField) {
  const std::vector<BadBatchCase> cases = {
      {"empty", {{}, 2}, {}, absl::StatusCode::kInvalidArgument, "doc_lens: the batch has no"},
      {"zero length", {{4, 0}, 2}, {}, absl::StatusCode::kInvalidArgument, "doc_lens[1]"},
      {"negative length", {{-3}, 1}, {}, absl::StatusCode::kInvalidArgument, "doc_lens[0]"},
      {"cp zero", {{4}, 0}, {}, absl::StatusCode::kInvalidArgument, "cp_size: must be at least 1"},
      {"cp above tokens", {{2, 1}, 4}, {}, absl::StatusCode::kInvalidArgument,
       "cp_size: 4 ranks is more than the batch's 3 tokens"},
      {"cp absurd", {{4}, 70000}, {}, absl::StatusCode::kInvalidArgument, "absolute limit"},
      {"overflow", {{int64_t{1} << 62, int64_t{1} << 62}, 1}, {},
       absl::StatusCode::kInvalidArgument, "doc_lens: total tokens exceed"},
      {"above 2^40", {{int64_t{1} << 39, int64_t{1} << 39, 1}, 1}, {},
       absl::StatusCode::kInvalidArgument, "at doc_lens[2]"},
      {"server doc limit", {{1, 1, 1}, 1}, {2, kMaxTokens, kMaxCpSize},
       absl::StatusCode::kResourceExhausted, "doc_lens: 3 documents, above this server's limit of 2"},
      {"server token limit", {{5, 5}, 1}, {kMaxDocs, 9, kMaxCpSize},
       absl::StatusCode::kResourceExhausted, "doc_lens: 10 tokens"},
      {"server cp limit", {{5, 5}, 4}, {kMaxDocs, kMaxTokens, 2},
       absl::StatusCode::kResourceExhausted, "cp_size: 4 ranks"},
  };
  for (const BadBatchCase& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ValidateBatch(c.batch, c.limits), StatusIs(c.code, HasSubstr(c.message)));
  }
}

TEST(ValidateBatchTest, AcceptsBoundaries) {
  EXPECT_THAT(ValidateBatch(Batch{{1}, 1}), IsOk());
  EXPECT_THAT(ValidateBatch(Batch{{2, 1}, 3}), IsOk());  // N equal to the token count
  EXPECT_THAT(ValidateBatch(Batch{{kMaxTokens}, 1}), IsOk());
}

TEST(ValidateBatchTest, TooManyDocumentsIsInvalidBeforeAnyOtherCheck) {
  Batch batch{std::vector<int64_t>(kMaxDocs + 1, 1), 1};
  EXPECT_THAT(ValidateBatch(batch),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1000001 documents")));
}

}  // namespace
}  // namespace flashcp::core
