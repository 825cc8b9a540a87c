// The standard gRPC services a server exposes besides its own: health
// (grpc.health.v1) and reflection (grpc.reflection.v1alpha, what Debian 12's
// gRPC serves). Debian ships neither proto, so these speak the few wire fields
// they need through grpc::GenericStub; protoc still runs in proto/ only.
#ifndef FLASHCP_TESTS_TESTING_GRPC_PROBES_H_
#define FLASHCP_TESTS_TESTING_GRPC_PROBES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace flashcp::tests::testing {

// A unary call of `request` as it is (no serialization) to `method`
// ("/package.Service/Method"), waiting until `deadline`; the call's status,
// and the answer's bytes in `response` when it is non-null.
grpc::Status RawUnaryCall(grpc::GenericStub& stub, const std::string& method,
                          const grpc::ByteBuffer& request, absl::Time deadline,
                          grpc::ByteBuffer* response = nullptr);

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
const char* HealthStatusName(HealthStatus s);

// Health/Check for `service` ("" is the whole server). The RPC's error as a
// Status (e.g. NotFound for a service the server does not know).
absl::StatusOr<HealthStatus> CheckHealth(std::shared_ptr<grpc::Channel> channel, const std::string& service,
                                         absl::Time deadline);

// Retries CheckHealth until it answers SERVING; DeadlineExceeded (with the
// last answer) if it has not by `deadline`.
absl::Status WaitForServing(std::shared_ptr<grpc::Channel> channel, const std::string& service,
                            absl::Time deadline);

// An open Health/Watch stream: the server sends the current status, then
// every change.
class HealthWatch {
 public:
  static absl::StatusOr<std::unique_ptr<HealthWatch>> Start(
      std::shared_ptr<grpc::Channel> channel, const std::string& service, absl::Time deadline);
  ~HealthWatch();  // cancels the call and drains it

  // The next status sent. DeadlineExceeded past `deadline`; the call's error
  // if the stream ended.
  absl::StatusOr<HealthStatus> Next(absl::Time deadline);

 private:
  HealthWatch() = default;
  absl::Status Await(void* tag, absl::Time deadline, bool* ok);

  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  grpc::ByteBuffer read_buf_;
  int pending_ = 0;  // operations started and not yet returned by the queue
};

// Service names the server lists over reflection (ServerReflectionInfo,
// list_services), e.g. {"flashcp.v1.Planner", "grpc.health.v1.Health", ...}.
absl::StatusOr<std::vector<std::string>> ListServicesByReflection(
    std::shared_ptr<grpc::Channel> channel, absl::Time deadline);

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_GRPC_PROBES_H_
