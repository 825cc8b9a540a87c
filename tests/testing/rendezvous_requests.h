// Rendezvous requests as tests write them, one line each, and the call most
// of them start with: rank 0 joining a group of one.
#ifndef FLASHCP_TESTS_TESTING_RENDEZVOUS_REQUESTS_H_
#define FLASHCP_TESTS_TESTING_RENDEZVOUS_REQUESTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "flashcp/v1/rendezvous.grpc.pb.h"

namespace flashcp::tests::testing {

// The member secret is MemberSecretOf(incarnation): one process, one secret.
v1::JoinRequest JoinRequestOf(const std::string& group, int32_t rank, int32_t world_size,
                              uint64_t incarnation = 1, const std::string& job_secret = "");
// "test-member-secret-<incarnation>" (at least kMinMemberSecretBytes).
std::string MemberSecretOf(uint64_t incarnation);
v1::SetRequest SetRequestOf(const std::string& group, const std::string& key,
                            const std::string& value, const std::string& token);
v1::GetRequest GetRequestOf(const std::string& group, const std::vector<std::string>& keys,
                            int64_t timeout_ms, const std::string& token);

// Joins rank 0 of a new 1-rank group (incarnation 1) by `deadline`; its token,
// or the call's status.
absl::StatusOr<std::string> JoinAlone(v1::Rendezvous::StubInterface& stub,
                                      const std::string& group, absl::Time deadline);

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_RENDEZVOUS_REQUESTS_H_
