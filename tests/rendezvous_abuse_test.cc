// The real flashcp-planner on loopback under rendezvous abuse (issue 12):
// it must answer with a clear code and keep serving, never abort.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/rendezvous_limits.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/rendezvous_requests.h"
#include "tests/testing/tls_certs.h"

namespace flashcp {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;
using tests::testing::GetRequestOf;
using tests::testing::JoinAlone;
using tests::testing::JoinRequestOf;
using tests::testing::SetRequestOf;
using ::testing::ElementsAre;
using ::testing::Eq;

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

  const absl::StatusOr<std::string> token =
      JoinAlone(*stub, "big", absl::Now() + absl::Seconds(30));
  ASSERT_THAT(token, IsOk());

  grpc::ClientContext sc;
  sc.set_deadline(In(30));
  v1::SetResponse set_response;
  ASSERT_TRUE(stub->Set(&sc,
                        SetRequestOf("big", "v", std::string(proto::rendezvous::kMaxValueBytes, 'x'),
                                     *token),
                        &set_response)
                  .ok());

  grpc::ClientContext gc;
  gc.set_deadline(In(120));
  v1::GetRequest get = GetRequestOf("big", std::vector<std::string>(2049, "v"), 0, *token);
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
    v1::JoinResponse joined;
    const grpc::Status s = stub.Join(&c, JoinRequestOf(group, 0, 2), &joined);
    if (!s.ok() || std::string(group) == "second") return s;
  }
  return grpc::Status::OK;
}

// The per-peer bound on groups counts a plaintext client
// by its IP address and an mTLS client by its certificate's identity, which
// the service reads from gRPC's AuthContext (and binds its groups to).
TEST(RendezvousAbuseTest, APeerIsItsAddressOrItsMutualTlsIdentity) {
  {
    auto planner = tests::testing::PlannerProcess::Start(
        FLASHCP_PLANNER_BIN, {"--threads", "1", "--rendezvous_max_groups_per_peer", "1"});
    ASSERT_THAT(planner.status(), IsOk());
    const auto stub = v1::Rendezvous::NewStub((*planner)->NewChannel());
    const grpc::Status s = JoinTwoFormingGroups(*stub);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(s.error_message(),
              "group \"second\": peer \"ipv4:127.0.0.1\" already created 1 groups that still "
              "exist (--rendezvous_max_groups_per_peer)");
    EXPECT_EQ((*planner)->Terminate(absl::Seconds(60)).value(), 0);
  }
  auto tls = tests::testing::GenerateTlsFiles(::testing::TempDir(),
                                              absl::Now() + absl::Seconds(60));
  ASSERT_THAT(tls.status(), IsOk());
  auto planner = tests::testing::PlannerProcess::Start(
      FLASHCP_PLANNER_BIN,
      {"--threads", "1", "--rendezvous_max_groups_per_peer", "1", "--tls_cert", tls->server_cert,
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
            "group \"second\": peer \"identity:flashcp test client\" already created 1 groups "
            "that still exist (--rendezvous_max_groups_per_peer)");
  EXPECT_EQ((*planner)->Terminate(absl::Seconds(60)).value(), 0);
  std::filesystem::remove_all(tls->dir);
}

// A channel whose one connection comes from `source` (another loopback
// address, so the planner sees another peer); null if the socket fails.
std::shared_ptr<grpc::Channel> ChannelFrom(const char* source, const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return nullptr;
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return nullptr;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return nullptr;
  }
  return grpc::CreateInsecureChannelFromFd(address, fd);  // owns fd
}

// Review of issue 12 item 8: one peer filled all 4,096 group slots with
// world_size 1 groups (formed at once, so the per-peer bound never counted
// them). Every group a peer created counts while it exists.
TEST(RendezvousAbuseTest, OnePeerCannotTakeEveryGroupSlot) {
  auto planner = tests::testing::PlannerProcess::Start(
      FLASHCP_PLANNER_BIN, {"--threads", "1", "--rendezvous_max_groups_per_peer", "3"});
  ASSERT_THAT(planner.status(), IsOk());
  const auto stub = v1::Rendezvous::NewStub((*planner)->NewChannel());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 3; ++i) {
    ASSERT_THAT(JoinAlone(*stub, absl::StrCat("g", i), deadline), IsOk()) << i;
  }
  EXPECT_THAT(JoinAlone(*stub, "g3", deadline),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       Eq("group \"g3\": peer \"ipv4:127.0.0.1\" already created 3 groups that "
                          "still exist (--rendezvous_max_groups_per_peer)")));
  // Another peer (another loopback source address) still gets a group.
  const std::shared_ptr<grpc::Channel> other = ChannelFrom("127.0.0.2", (*planner)->grpc_address());
  ASSERT_NE(other, nullptr);
  const auto other_stub = v1::Rendezvous::NewStub(other);
  EXPECT_THAT(JoinAlone(*other_stub, "real-job", deadline), IsOk());
  EXPECT_EQ((*planner)->Terminate(absl::Seconds(60)).value(), 0);
}

// Review of issue 12: a Get's DEADLINE_EXCEEDED named every missing key;
// past about 8 KB of names gRPC's metadata limit turned it into
// RESOURCE_EXHAUSTED ("received initial metadata size exceeds limit").
TEST(RendezvousAbuseTest, ADeadlineNamesAFewMissingKeysAndCountsTheRest) {
  auto planner = tests::testing::PlannerProcess::Start(FLASHCP_PLANNER_BIN, {"--threads", "1"});
  ASSERT_THAT(planner.status(), IsOk());
  const auto stub = v1::Rendezvous::NewStub((*planner)->NewChannel());
  const absl::StatusOr<std::string> token =
      JoinAlone(*stub, "m", absl::Now() + absl::Seconds(30));
  ASSERT_THAT(token, IsOk());
  grpc::ClientContext c;
  c.set_deadline(In(60));
  std::vector<std::string> keys;
  for (size_t i = 0; i < proto::rendezvous::kMaxKeysPerGet; ++i) {
    std::string key(proto::rendezvous::kMaxKeyBytes, 'k');
    const std::string n = absl::StrCat(i);
    key.replace(0, n.size(), n);
    keys.push_back(std::move(key));
  }
  const v1::GetRequest get = GetRequestOf("m", keys, 0, *token);
  v1::GetResponse out;
  const grpc::Status s = stub->Get(&c, get, &out);
  std::string named;
  for (int i = 0; i < 8; ++i) {
    absl::StrAppend(&named, i == 0 ? "" : ", ", "\"", get.keys(i).substr(0, 64),
                    "\"... (256 bytes)");
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(s.error_message(), absl::StrCat("group \"m\": keys ", named, " and 4088 more not set"));
  EXPECT_EQ((*planner)->Terminate(absl::Seconds(60)).value(), 0);
}

}  // namespace
}  // namespace flashcp
