#include "proto/rpc/grpc_status.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace flashcp::proto::rpc {
namespace {

struct CodePair {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};

// Every google.rpc.Code, both ways.
const std::vector<CodePair>& AllCodes() {
  static const auto* codes = new std::vector<CodePair>{
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  return *codes;
}

TEST(GrpcStatusTest, OkMapsToOkBothWays) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::OkStatus()).error_message(), "");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, EveryCodeMapsOneToOneWithItsMessage) {
  for (const CodePair& c : AllCodes()) {
    const std::string msg = "cp_size: must be at least 1, got 0";
    const grpc::Status g = ToGrpcStatus(absl::Status(c.absl_code, msg));
    EXPECT_EQ(g.error_code(), c.grpc_code) << absl::StatusCodeToString(c.absl_code);
    EXPECT_EQ(g.error_message(), msg);
    const absl::Status a = FromGrpcStatus(grpc::Status(c.grpc_code, msg));
    EXPECT_EQ(a.code(), c.absl_code) << absl::StatusCodeToString(c.absl_code);
    EXPECT_EQ(a.message(), msg);
    EXPECT_EQ(FromGrpcStatus(ToGrpcStatus(absl::Status(c.absl_code, msg))),
              absl::Status(c.absl_code, msg));
  }
}

TEST(GrpcStatusTest, CodesOutsideTheRangeBecomeUnknown) {
  const absl::Status a = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(42), "odd"));
  EXPECT_EQ(a, absl::UnknownError("status code 42: odd"));
  const grpc::Status g = ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(g.error_message(), "odd");  // absl::Status normalized the code already
}

}  // namespace
}  // namespace flashcp::proto::rpc
