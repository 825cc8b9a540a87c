// flashcp.v1.PipelinePlanner on a real server on loopback (port 0).
#include "planner_service/pipeline_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/pipeline_planner_client.h"
#include "core/pipeline.h"
#include "core/testing/status_matchers.h"
#include "core/testing/ticking_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/server.h"
#include "proto/pipeline_convert.h"
#include "tests/testing/counting_observer.h"

namespace flashcp::planner_service {
namespace {

using ::flashcp::core::testing::IsOk;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using ::flashcp::tests::testing::CountingObserver;

class PipelineServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics = "";
    auto server = PlannerServer::Start(options, &observer_, &clock_);
    ASSERT_THAT(server, IsOk());
    server_ = *std::move(server);
    stub_ = v1::PipelinePlanner::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  static v1::PlanPipelineRequest Request(uint64_t id, std::vector<int64_t> docs) {
    v1::PlanPipelineRequest r;
    r.set_batch_id(id);
    for (int64_t d : docs) r.add_doc_lens(d);
    return r;
  }

  core::testing::TickingClock clock_{absl::Milliseconds(1)};
  CountingObserver observer_;
  std::unique_ptr<PlannerServer> server_;
  std::unique_ptr<v1::PipelinePlanner::Stub> stub_;
};

TEST_F(PipelineServiceTest, PlansWithDefaultsAndTheIlp) {
  const std::vector<int64_t> docs = {40000, 20000, 9000, 5000, 3000, 1200, 800};
  v1::PipelinePlan plan;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->PlanPipeline(&context, Request(7, docs), &plan).ok());
  EXPECT_EQ(plan.batch_id(), 7u);
  EXPECT_EQ(plan.strategy(), "dpp");
  EXPECT_THAT(plan.ckpt_solver(), ::testing::AnyOf("ilp", "greedy"));
  EXPECT_EQ(plan.ckpt_size(), 4);
  EXPECT_EQ(plan.planning_seconds(), 0.001);  // two readings of the ticking clock
  // The plan replays to the prediction it carries.
  auto core_plan = proto::PipelinePlanFromProto(plan);
  ASSERT_THAT(core_plan, IsOk());
  core::PipelineRequest req;
  req.doc_lens = docs;
  auto full = core::CompletePipelineRequest(req);
  auto sim = core::SimulatePipeline(*full, *core_plan);
  ASSERT_THAT(sim, IsOk());
  EXPECT_EQ(sim->iteration_s, plan.prediction().iteration_s());
}

TEST_F(PipelineServiceTest, ErrorsKeepTheirCodes) {
  v1::PlanPipelineRequest bad = Request(1, {100, 200});
  bad.set_pp_size(3);
  v1::PipelinePlan plan;
  {
    grpc::ClientContext context;
    const grpc::Status s = stub_->PlanPipeline(&context, bad, &plan);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("model.layers"));
  }
  bad = Request(2, {131072});
  bad.set_memory_budget_bytes(30e9);
  {
    grpc::ClientContext context;
    const grpc::Status s = stub_->PlanPipeline(&context, bad, &plan);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("GiB) more"));
  }
  bad = Request(3, {100});
  bad.set_strategy("ring");
  {
    grpc::ClientContext context;
    const grpc::Status s = stub_->PlanPipeline(&context, bad, &plan);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), StartsWith("strategy: "));
  }
}

TEST_F(PipelineServiceTest, StreamAnswersInOrderAndGoesOnAfterABadItem) {
  grpc::ClientContext context;
  auto stream = stub_->PlanPipelineStream(&context);
  v1::PlanPipelineRequest bad = Request(2, {0});
  v1::PlanPipelineRequest token = Request(3, {9000, 3000});
  token.set_strategy("token_level");
  ASSERT_TRUE(stream->Write(Request(1, {5000, 3000, 100})));
  ASSERT_TRUE(stream->Write(bad));
  ASSERT_TRUE(stream->Write(token));
  stream->WritesDone();
  std::vector<v1::PipelinePlan> got;
  v1::PipelinePlan p;
  while (stream->Read(&p)) got.push_back(p);
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].batch_id(), 1u);
  EXPECT_EQ(got[0].error(), "");
  EXPECT_EQ(got[1].batch_id(), 2u);
  EXPECT_EQ(got[1].error(), "INVALID_ARGUMENT: doc_lens[0]: must be in [1, 1099511627776], got 0");
  EXPECT_EQ(got[2].batch_id(), 3u);
  EXPECT_EQ(got[2].strategy(), "token_level");
}

TEST_F(PipelineServiceTest, CppClientPlansCoreRequests) {
  client::PipelinePlannerClient c(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  core::PipelineRequest req;
  req.doc_lens = {30000, 4000, 4000, 2000, 700};
  req.pp_size = 8;
  auto plan = c.PlanPipeline(req, core::PipelineStrategy::kDppFullCkpt);
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->strategy, core::PipelineStrategy::kDppFullCkpt);
  EXPECT_EQ(plan->ckpt.size(), 8u);
  for (const auto& stage : plan->ckpt) {
    for (int32_t layers : stage) EXPECT_EQ(layers, 4);  // L / d_p, every layer
  }
  req.pp_size = 5;  // 32 layers do not split into 5 stages
  EXPECT_THAT(c.PlanPipeline(req, core::PipelineStrategy::kDpp),
              core::testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.layers")));
}

}  // namespace
}  // namespace flashcp::planner_service
