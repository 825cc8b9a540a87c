// The planner's flashcp.v1.Rendezvous service on an in-process gRPC server
// (no port, no process): what unit tests of the service and of the worker's
// rendezvous client and daemon talk to.
#ifndef FLASHCP_TESTS_TESTING_INPROCESS_RENDEZVOUS_H_
#define FLASHCP_TESTS_TESTING_INPROCESS_RENDEZVOUS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"
#include "grpcpp/server.h"
#include "planner_service/rendezvous_service.h"

namespace flashcp::tests::testing {

class InProcessRendezvous {
 public:
  // INTERNAL if the server does not start.
  static absl::StatusOr<std::unique_ptr<InProcessRendezvous>> Start(
      planner_service::RendezvousOptions options = {});
  // Ends waiting calls (UNAVAILABLE, as the planner does on SIGTERM), then
  // shuts the server down.
  ~InProcessRendezvous();
  InProcessRendezvous(const InProcessRendezvous&) = delete;
  InProcessRendezvous& operator=(const InProcessRendezvous&) = delete;

  planner_service::RendezvousHost& host() { return *host_; }
  // A stub on the server's in-process channel; valid while this object lives.
  const std::shared_ptr<v1::Rendezvous::Stub>& stub() const { return stub_; }

 private:
  InProcessRendezvous() = default;
  std::unique_ptr<planner_service::RendezvousHost> host_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<v1::Rendezvous::Stub> stub_;
};

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_INPROCESS_RENDEZVOUS_H_
