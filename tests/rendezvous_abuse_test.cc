// The real flashcp-planner on loopback under rendezvous abuse (issue 12):
// it must answer with a clear code and keep serving, never abort.
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/rendezvous_limits.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/tls_certs.h"

namespace flashcp {
namespace {

using core::testing::IsOk;
using ::testing::ElementsAre;

std::chrono::system_clock::time_point In(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

// Issue 12 item 1: naming one 1 MiB value 2,049 times built a response over
// 2 GiB; protobuf refused to serialize it, gRPC asserted and the planner died
// with SIGABRT.
TEST(RendezvousAbuseTest, ThePlannerSurvivesAGetOfOneMiBValueNamed2049Times) {
  auto planner = tests::testing::PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  const std::unique_ptr<v1::Rendezvous::Stub> stub =
      v1::Rendezvous::NewStub((*planner)->NewChannel());

  grpc::ClientContext jc;
  jc.set_deadline(In(30));
  v1::JoinRequest join;
  join.set_group("big");
  join.set_rank(0);
  join.set_world_size(1);
  join.set_incarnation(1);
  v1::JoinResponse joined;
  ASSERT_TRUE(stub->Join(&jc, join, &joined).ok());

  grpc::ClientContext sc;
  sc.set_deadline(In(30));
  v1::SetRequest set;
  set.set_group("big");
  set.set_key("v");
  set.set_value(std::string(proto::rendezvous::kMaxValueBytes, 'x'));
  set.set_token(joined.token());
  v1::SetResponse set_response;
  ASSERT_TRUE(stub->Set(&sc, set, &set_response).ok());

  grpc::ClientContext gc;
  gc.set_deadline(In(120));
  v1::GetRequest get;
  get.set_group("big");
  for (int i = 0; i < 2049; ++i) get.add_keys("v");
  get.set_timeout_ms(0);
  get.set_token(joined.token());
  v1::GetResponse values;
  const grpc::Status refused = stub->Get(&gc, get, &values);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "keys: \"v\" is named more than once");

  // Still serving: the value comes back once.
  grpc::ClientContext gc2;
  gc2.set_deadline(In(30));
  get.clear_keys();
  get.add_keys("v");
  ASSERT_TRUE(stub->Get(&gc2, get, &values).ok());
  ASSERT_EQ(values.values_size(), 1);
  EXPECT_EQ(values.values(0).size(), proto::rendezvous::kMaxValueBytes);
  EXPECT_EQ((*planner)->Terminate(absl::Seconds(60)).value(), 0);  // a clean drain, no SIGABRT
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Joins rank 0 of two new 2-rank groups; the second Join's status.
grpc::Status JoinTwoFormingGroups(v1::Rendezvous::Stub& stub) {
  for (const char* group : {"first", "second"}) {
    grpc::ClientContext c;
    c.set_deadline(In(30));
    v1::JoinRequest join;
    join.set_group(group);
    join.set_rank(0);
    join.set_world_size(2);
    join.set_incarnation(1);
    v1::JoinResponse joined;
    const grpc::Status s = stub.Join(&c, join, &joined);
    if (!s.ok() || std::string(group) == "second") return s;
  }
  return grpc::Status::OK;
}

// The per-peer bound on groups that never formed counts a plaintext client
// by its IP address and an mTLS client by its certificate's identity, which
// the service reads from gRPC's AuthContext (and binds its groups to).
TEST(RendezvousAbuseTest, APeerIsItsAddressOrItsMutualTlsIdentity) {
  {
    auto planner = tests::testing::PlannerProcess::Start(
        FLASHCP_PLANNER_BIN, {"--threads", "1", "--rendezvous_max_forming_per_peer", "1"});
    ASSERT_THAT(planner.status(), IsOk());
    const auto stub = v1::Rendezvous::NewStub((*planner)->NewChannel());
    const grpc::Status s = JoinTwoFormingGroups(*stub);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(s.error_message(),
              "group \"second\": peer \"ipv4:127.0.0.1\" already has 1 groups that never had "
              "all their ranks (--rendezvous_max_forming_per_peer)");
    EXPECT_EQ((*planner)->Terminate(absl::Seconds(60)).value(), 0);
  }
  auto tls = tests::testing::GenerateTlsFiles(::testing::TempDir(),
                                              absl::Now() + absl::Seconds(60));
  ASSERT_THAT(tls.status(), IsOk());
  auto planner = tests::testing::PlannerProcess::Start(
      FLASHCP_PLANNER_BIN,
      {"--threads", "1", "--rendezvous_max_forming_per_peer", "1", "--tls_cert", tls->server_cert,
       "--tls_key", tls->server_key, "--tls_client_ca", tls->ca_cert});
  ASSERT_THAT(planner.status(), IsOk());
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(tls->ca_cert);
  ssl.pem_private_key = ReadFile(tls->client_key);
  ssl.pem_cert_chain = ReadFile(tls->client_cert);
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  const auto stub = v1::Rendezvous::NewStub(
      grpc::CreateCustomChannel((*planner)->grpc_address(), grpc::SslCredentials(ssl), args));
  const grpc::Status s = JoinTwoFormingGroups(*stub);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(),
            "group \"second\": peer \"identity:flashcp test client\" already has 1 groups that "
            "never had all their ranks (--rendezvous_max_forming_per_peer)");
  EXPECT_EQ((*planner)->Terminate(absl::Seconds(60)).value(), 0);
  std::filesystem::remove_all(tls->dir);
}

}  // namespace
}  // namespace flashcp
