#include "proto/rpc/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace flashcp::proto::rpc {
namespace {

// google.rpc.Code's range; both enums use it.
constexpr int kMaxCode = 16;

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::Status already stores any code outside 0..16 as kUnknown.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  if (code < 0 || code > kMaxCode) {
    return absl::UnknownError(absl::StrCat("status code ", code, ": ", status.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

}  // namespace flashcp::proto::rpc
