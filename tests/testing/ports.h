// A loopback TCP port for a test server that must be told its port before it
// starts (a late-starting planner, Prometheus) or for an address nobody
// listens on. Never a fixed port.
#ifndef FLASHCP_TESTS_TESTING_PORTS_H_
#define FLASHCP_TESTS_TESTING_PORTS_H_

#include "absl/status/statusor.h"

namespace flashcp::tests::testing {

// A 127.0.0.1 port that was free a moment ago: bound to port 0, read back,
// closed. The only race is another process taking it in between. INTERNAL
// with errno's text if the socket calls fail.
absl::StatusOr<int> FreeLoopbackPort();

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_PORTS_H_
