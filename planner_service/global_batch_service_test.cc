// flashcp.v1.GlobalBatchPlanner on a real server on loopback (port 0).
#include "planner_service/global_batch_service.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/global_batch_planner_client.h"
#include "core/global_batch.h"
#include "core/testing/status_matchers.h"
#include "core/testing/ticking_clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "planner_service/server.h"
#include "proto/convert.h"
#include "proto/global_batch.h"
#include "proto/plan_batch.h"
#include "tests/testing/counting_observer.h"

namespace flashcp::planner_service {
namespace {

using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using ::flashcp::tests::testing::CountingObserver;

class GlobalBatchServiceTest : public ::testing::Test {
 public:
  // docs over dp_size replicas of cp_size ranks, context tokens each.
  static v1::PlanGlobalBatchRequest Request(uint64_t id, std::vector<int64_t> docs,
                                            int32_t dp_size, int32_t cp_size, int64_t context,
                                            const std::string& strategy = "per_doc") {
    v1::PlanGlobalBatchRequest r;
    r.set_batch_id(id);
    for (int64_t d : docs) r.add_doc_lens(d);
    r.set_dp_size(dp_size);
    r.set_context(context);
    r.mutable_plan()->set_cp_size(cp_size);
    r.mutable_plan()->set_strategy(strategy);
    return r;
  }

 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics = "";
    auto server = PlannerServer::Start(options, &observer_, &clock_);
    ASSERT_THAT(server, IsOk());
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::GlobalBatchPlanner::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  grpc::Status Call(const v1::PlanGlobalBatchRequest& r, v1::GlobalBatchPlan* out) {
    grpc::ClientContext context;
    return stub_->PlanGlobalBatch(&context, r, out);
  }

  core::testing::TickingClock clock_{absl::Milliseconds(1)};
  CountingObserver observer_;
  std::unique_ptr<PlannerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GlobalBatchPlanner::Stub> stub_;
};

// Hand-worked (core/global_batch_test.cc): C = 10, two replicas. First fit:
// [9, 1] (45 + 1 pairs) and [3, 3, 3] (18): 46 / 32. Balanced: [9] (45) and
// [1, 3, 3, 3] (19): 45 / 32. Each replica's plan is the PlanResponse that
// Plan gives for its documents.
TEST_F(GlobalBatchServiceTest, HandWorkedTwoReplicasWithPlansAsPlanAnswers) {
  v1::GlobalBatchPlan plan;
  const grpc::Status s = Call(Request(7, {9, 1, 3, 3, 3}, 2, 2, 10), &plan);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(plan.batch_id(), 7u);
  EXPECT_THAT(plan.piece_lens(), ElementsAre(9, 1, 3, 3, 3));
  EXPECT_THAT(plan.piece_doc(), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_DOUBLE_EQ(plan.first_fit_imbalance(), 46.0 / 32.0);
  EXPECT_DOUBLE_EQ(plan.imbalance(), 45.0 / 32.0);
  EXPECT_EQ(plan.planning_seconds(), 0.001);  // two readings of the ticking clock
  ASSERT_EQ(plan.replicas_size(), 2);
  EXPECT_THAT(plan.replicas(0).pieces(), ElementsAre(0));
  EXPECT_THAT(plan.replicas(0).doc_lens(), ElementsAre(9));
  EXPECT_EQ(plan.replicas(0).workload(), 45.0);
  EXPECT_THAT(plan.replicas(1).pieces(), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(plan.replicas(1).doc_lens(), ElementsAre(1, 3, 3, 3));
  EXPECT_EQ(plan.replicas(1).workload(), 19.0);
  core::testing::TickingClock clock{absl::Milliseconds(1)};
  proto::NullPlanObserver none;
  for (int r = 0; r < 2; ++r) {
    v1::PlanRequest one = Request(7, {}, 2, 2, 10).plan();
    one.set_batch_id(7);
    for (int64_t d : plan.replicas(r).doc_lens()) one.add_doc_lens(d);
    auto in = proto::RequestFromProto(one, proto::kDefaultBatchLimits);
    ASSERT_THAT(in, IsOk());
    auto want = proto::PlanBatch(*in, clock, none);
    ASSERT_THAT(want, IsOk());
    want->mutable_metrics()->set_planning_seconds(0);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(plan.replicas(r).plan(), *want))
        << "replica " << r << ":\n" << plan.replicas(r).plan().DebugString() << "want:\n"
        << want->DebugString();
  }
  // Replica 0 holds the 9-token document as per_doc's 2N = 4 pieces over 2 ranks.
  EXPECT_EQ(plan.replicas(0).plan().strategy(), "per_doc");
  EXPECT_EQ(plan.replicas(0).plan().cp_size(), 2);
  absl::MutexLock lock(&observer_.mu);
  EXPECT_THAT(observer_.done, ElementsAre("PlanGlobalBatch:OK"));
  EXPECT_EQ(observer_.inflight, 0);
}

TEST_F(GlobalBatchServiceTest, BadRequestsGetTheirCodeNamingTheField) {
  struct Case {
    v1::PlanGlobalBatchRequest request;
    grpc::StatusCode code;
    std::string message_prefix;
  };
  std::vector<Case> cases;
  auto with = [&](auto edit, grpc::StatusCode code, std::string prefix) {
    v1::PlanGlobalBatchRequest r = Request(1, {9, 1, 3, 3, 3}, 2, 2, 10);
    edit(r);
    cases.push_back({r, code, prefix});
  };
  const auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  with([](auto& r) { r.mutable_plan()->add_doc_lens(5); }, kInvalid,
       "plan.doc_lens: 1 documents; must be empty");
  with([](auto& r) { r.mutable_plan()->set_choose_schemes(true); }, kInvalid,
       "plan.choose_schemes: not supported by PlanGlobalBatch");
  with([](auto& r) { r.mutable_plan()->set_include_layout(true); }, kInvalid,
       "plan.include_layout: not supported by PlanGlobalBatch");
  with([](auto& r) { r.mutable_plan()->set_cluster("h100"); }, kInvalid,
       "plan.cluster: not supported by PlanGlobalBatch");
  with([](auto& r) { r.set_dp_size(0); }, kInvalid, "dp_size: 0; must be in [1, 4096]");
  with([](auto& r) { r.set_dp_size(4097); }, kInvalid, "dp_size: 4097; must be in [1, 4096]");
  with([](auto& r) { r.clear_doc_lens(); }, kInvalid, "doc_lens: no documents");
  with([](auto& r) { r.set_doc_lens(1, 0); }, kInvalid,
       "doc_lens[1]: 0; every length must be >= 1");
  with([](auto& r) { r.set_context(0); }, kInvalid, "context: 0; must be >= 1");
  with([](auto& r) { r.set_context((int64_t{1} << 24) + 1); },
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       "context: 16777217 tokens, above this server's --max_tokens (16777216)");
  with([](auto& r) { r.mutable_plan()->set_cp_size(11); }, kInvalid,
       "context: 10 tokens; must be at least plan.cp_size (11)");
  with([](auto& r) { r.mutable_plan()->set_cp_size(0); }, kInvalid, "plan.cp_size: ");
  with([](auto& r) { r.mutable_plan()->set_strategy("nope"); }, kInvalid, "plan.strategy: ");
  with([](auto& r) { r.mutable_plan()->set_target_imbalance(0.5); }, kInvalid,
       "plan.target_imbalance: ");
  with([](auto& r) { r.mutable_plan()->set_strategy("ilp"); }, grpc::StatusCode::UNIMPLEMENTED,
       "plan.strategy: ilp is disabled on this server");
  // The core's checks: the tokens fit dp_size x context, first fit places
  // every piece whole, every replica gets a batch.
  with([](auto& r) { r.set_doc_lens(0, 11); r.set_doc_lens(1, 10); }, kInvalid,
       "doc_lens: 30 tokens; more than dp_size x context = 2 x 10");
  with([](auto& r) { r.clear_doc_lens(); for (int i = 0; i < 3; ++i) r.add_doc_lens(6); },
       grpc::StatusCode::FAILED_PRECONDITION,
       "doc_lens: piece 2 (6 tokens) fits in none of the 2 replicas of 10 tokens");
  with([](auto& r) { r.clear_doc_lens(); r.add_doc_lens(5); r.add_doc_lens(5); r.set_dp_size(3); },
       kInvalid, "replica 2: ");
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::GlobalBatchPlan plan;
    const grpc::Status s = Call(cases[i].request, &plan);
    EXPECT_EQ(s.error_code(), cases[i].code) << i << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), StartsWith(cases[i].message_prefix)) << i;
  }
  absl::MutexLock lock(&observer_.mu);
  EXPECT_EQ(observer_.done.size(), cases.size());
  EXPECT_EQ(observer_.inflight, 0);
}

// The C++ client from core structs: the same packing and the same replica
// plans as core::PlanGlobalBatch in process, with flashcp's plans.
TEST_F(GlobalBatchServiceTest, CppClientEqualsTheCoreInProcess) {
  const std::vector<int64_t> docs = {5000, 300,  1200, 7000, 64, 2500, 900, 3100,
                                     450,  1000, 20,   600, 4000, 150, 2900};
  core::GlobalBatchOptions o;
  o.dp_size = 4;
  o.cp_size = 8;
  o.context = 8192;
  o.strategy = core::Strategy::kFlashCp;
  auto want = core::PlanGlobalBatch(docs, o);
  ASSERT_THAT(want, IsOk());
  client::GlobalBatchPlannerClient client(channel_);
  auto got = client.PlanGlobalBatch(docs, o, /*batch_id=*/3);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->pieces.lens, want->pieces.lens);
  EXPECT_EQ(got->pieces.doc, want->pieces.doc);
  EXPECT_EQ(got->imbalance, want->imbalance);
  EXPECT_EQ(got->first_fit_imbalance, want->first_fit_imbalance);
  ASSERT_EQ(got->replicas.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(got->replicas[r].pieces, want->replicas[r].pieces) << r;
    EXPECT_EQ(got->replicas[r].doc_lens, want->replicas[r].doc_lens) << r;
    EXPECT_EQ(got->replicas[r].workload, want->replicas[r].workload) << r;
    EXPECT_EQ(got->replicas[r].plan.shards, want->replicas[r].plan.shards) << r;
    EXPECT_EQ(got->replicas[r].plan.padding, want->replicas[r].plan.padding) << r;
  }
  o.context = 4;  // below cp_size: the server's error, code and field kept
  EXPECT_THAT(client.PlanGlobalBatch(docs, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       StartsWith("context: 4 tokens; must be at least plan.cp_size (8)")));
}

// The answer's size is bounded from the request before any planning
// (proto::CheckGlobalBatchBounds): above --max_response_bytes the call is
// RESOURCE_EXHAUSTED naming dp_size, cp_size, the documents and the flag.
TEST(GlobalBatchBoundsTest, AnswerOverMaxResponseBytesIsRefusedBeforePlanning) {
  CountingObserver observer;
  core::testing::TickingClock clock{absl::Milliseconds(1)};
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics = "";
  options.bounds.max_response_bytes = 20000;
  auto server = PlannerServer::Start(options, &observer, &clock);
  ASSERT_THAT(server, IsOk());
  auto stub = v1::GlobalBatchPlanner::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const v1::PlanGlobalBatchRequest& r, v1::GlobalBatchPlan* out) {
    grpc::ClientContext context;
    return stub->PlanGlobalBatch(&context, r, out);
  };
  auto bound = [](const v1::PlanGlobalBatchRequest& r) {
    auto in = proto::GlobalBatchRequestFromProto(r, proto::kDefaultBatchLimits);
    EXPECT_THAT(in, IsOk());
    return proto::MaxGlobalBatchResponseBytes(*in);
  };
  v1::GlobalBatchPlan plan;
  // Two replicas of 2 ranks, 5 documents: within the bound, and the answer
  // is no larger than it.
  const v1::PlanGlobalBatchRequest small =
      GlobalBatchServiceTest::Request(1, {9, 1, 3, 3, 3}, 2, 2, 10);
  ASSERT_LE(bound(small), 20000);
  grpc::Status s = call(small, &plan);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LE(static_cast<int64_t>(plan.ByteSizeLong()), bound(small));
  // 64 replicas of 8 ranks, 200 documents: refused with the exact account.
  std::vector<int64_t> docs(200, 100);
  const v1::PlanGlobalBatchRequest big = GlobalBatchServiceTest::Request(2, docs, 64, 8, 400);
  const int64_t big_bytes = bound(big);
  ASSERT_GT(big_bytes, 20000);
  s = call(big, &plan);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(),
            absl::StrCat("dp_size: 64 replicas x cp_size 8 x 200 documents (context 400) may "
                         "make an answer of up to ", big_bytes, " bytes, above "
                         "--max_response_bytes = 20000; plan fewer replicas or documents, or a "
                         "longer context"));
  // A context of 1 token over 64 documents of 2^24 tokens cuts 2^30 pieces:
  // refused from the count alone, none of them made (making them would take
  // 16 GiB before planning began).
  const v1::PlanGlobalBatchRequest pieces = GlobalBatchServiceTest::Request(
      3, std::vector<int64_t>(64, int64_t{1} << 24), 1, 1, 1);
  s = call(pieces, &plan);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(),
              StartsWith("dp_size: 1 replicas x cp_size 1 x 64 documents (context 1) may make "
                         "an answer of up to "));
  EXPECT_GT(bound(pieces), int64_t{2} << 30);  // 2^30 pieces, two bytes each at least
  (*server)->Shutdown();
  absl::MutexLock lock(&observer.mu);
  EXPECT_THAT(observer.done,
              ElementsAre("PlanGlobalBatch:OK", "PlanGlobalBatch:RESOURCE_EXHAUSTED",
                          "PlanGlobalBatch:RESOURCE_EXHAUSTED"));
}

// The bound holds: on random global batches (1-4 replicas of 1-4 ranks,
// 1-30 documents, some cut to the context), every answer
// that plans is no larger than proto::MaxGlobalBatchResponseBytes.
TEST(GlobalBatchBoundsTest, BoundHoldsOnRandomBatches) {
  std::mt19937_64 rng(27);
  const char* strategies[] = {"per_doc", "flashcp", "llama3", "zigzag", "whole_doc"};
  core::testing::TickingClock clock{absl::Milliseconds(1)};
  int planned = 0, cut_planned = 0;
  for (int i = 0; i < 1000; ++i) {
    const int32_t dp = 1 + static_cast<int32_t>(rng() % 4);
    const int32_t cp = 1 + static_cast<int32_t>(rng() % 4);
    // Every fourth batch: 1-3 long documents and a context that cuts them;
    // else 1-30 documents and room for about twice their tokens.
    const bool cut = i % 4 == 0;
    std::vector<int64_t> docs(1 + rng() % (cut ? 3 : 30));
    for (int64_t& d : docs) d = cut ? 100 + static_cast<int64_t>(rng() % 500)
                                    : 1 + static_cast<int64_t>(rng() % 100);
    const int64_t total = core::TotalTokens(docs);
    const int64_t context = std::max<int64_t>(
        {cp, 20, (cut ? total / dp + 50 : 2 * total / dp) + static_cast<int64_t>(rng() % 50)});
    const v1::PlanGlobalBatchRequest r =
        GlobalBatchServiceTest::Request(i, docs, dp, cp, context, strategies[i % 5]);
    auto in = proto::GlobalBatchRequestFromProto(r, proto::kDefaultBatchLimits);
    ASSERT_THAT(in, IsOk());
    auto plan = proto::PlanGlobalBatchRequest(*in, clock);
    if (!plan.ok()) continue;  // first fit left a piece or a replica empty
    ++planned;
    cut_planned += plan->piece_lens_size() > static_cast<int>(docs.size());
    EXPECT_LE(static_cast<int64_t>(plan->ByteSizeLong()), proto::MaxGlobalBatchResponseBytes(*in))
        << r.DebugString();
  }
  EXPECT_GE(planned, 500);
  EXPECT_GE(cut_planned, 50);
}

}  // namespace
}  // namespace flashcp::planner_service
