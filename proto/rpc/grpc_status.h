// The one mapping between absl::Status and grpc::Status (STYLE item 6). Both
// use google.rpc.Code numbering, so codes map 1:1 and the message is kept.
#ifndef FLASHCP_PROTO_RPC_GRPC_STATUS_H_
#define FLASHCP_PROTO_RPC_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace flashcp::proto::rpc {

// Same code, same message. An OK status keeps no message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Same code, same message; a code outside google.rpc.Code's 0..16 (which no
// conforming peer sends) becomes UNKNOWN with the original number in the message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace flashcp::proto::rpc

#endif  // FLASHCP_PROTO_RPC_GRPC_STATUS_H_
