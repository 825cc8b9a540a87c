// Messages of raw (ByteBuffer) gRPC methods, parsed and serialized in one
// place. A generated handler answers a request that does not parse with
// INTERNAL or UNIMPLEMENTED and no message; the services take their requests
// raw so that such a request gets INVALID_ARGUMENT "could not parse <type>".
#ifndef FLASHCP_PROTO_RPC_RAW_MESSAGE_H_
#define FLASHCP_PROTO_RPC_RAW_MESSAGE_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"

namespace flashcp::proto::rpc {

// `*bytes` (consumed) parsed as a `Message`: INVALID_ARGUMENT naming the
// type unless they are one.
template <typename Message>
absl::Status ParseRaw(grpc::ByteBuffer* bytes, Message* message) {
  if (grpc::SerializationTraits<Message>::Deserialize(bytes, message).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("could not parse ", Message::descriptor()->full_name()));
}

// The same, reading a copy of the buffer (its slices' references): `bytes`
// is left as it was.
template <typename Message>
absl::Status ParseRaw(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);
  return ParseRaw(&copy, message);
}

// `message` serialized into `out`; INTERNAL if protobuf refuses (over 2 GiB).
template <typename Message>
absl::Status SerializeRaw(const Message& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  const grpc::Status s = grpc::SerializationTraits<Message>::Serialize(message, out, &own_buffer);
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("could not serialize ",
                                          Message::descriptor()->full_name(), ": ",
                                          s.error_message()));
}

}  // namespace flashcp::proto::rpc

#endif  // FLASHCP_PROTO_RPC_RAW_MESSAGE_H_
