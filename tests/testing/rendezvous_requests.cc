#include "tests/testing/rendezvous_requests.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::tests::testing {

v1::JoinRequest JoinRequestOf(const std::string& group, int32_t rank, int32_t world_size,
                              uint64_t incarnation, const std::string& job_secret) {
  v1::JoinRequest r;
  r.set_group(group);
  r.set_rank(rank);
  r.set_world_size(world_size);
  r.set_incarnation(incarnation);
  r.set_job_secret(job_secret);
  r.set_member_secret(MemberSecretOf(incarnation));
  return r;
}

std::string MemberSecretOf(uint64_t incarnation) {
  return absl::StrCat("test-member-secret-", incarnation);
}

v1::SetRequest SetRequestOf(const std::string& group, const std::string& key,
                            const std::string& value, const std::string& token) {
  v1::SetRequest r;
  r.set_group(group);
  r.set_key(key);
  r.set_value(value);
  r.set_token(token);
  return r;
}

v1::GetRequest GetRequestOf(const std::string& group, const std::vector<std::string>& keys,
                            int64_t timeout_ms, const std::string& token) {
  v1::GetRequest r;
  r.set_group(group);
  for (const std::string& k : keys) r.add_keys(k);
  r.set_timeout_ms(timeout_ms);
  r.set_token(token);
  return r;
}

absl::StatusOr<std::string> JoinAlone(v1::Rendezvous::StubInterface& stub,
                                      const std::string& group, absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::JoinResponse joined;
  const absl::Status s =
      proto::rpc::FromGrpcStatus(stub.Join(&context, JoinRequestOf(group, 0, 1), &joined));
  if (!s.ok()) return s;
  return joined.token();
}

}  // namespace flashcp::tests::testing
