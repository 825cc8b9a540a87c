// A minimal HTTP/1.0 GET for tests (scraping /metrics); no TLS, no redirects.
#ifndef FLASHCP_TESTS_TESTING_HTTP_H_
#define FLASHCP_TESTS_TESTING_HTTP_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flashcp::tests::testing {

struct HttpResponse {
  int status = 0;    // e.g. 200
  std::string body;  // headers stripped
};

// GET http://`host_port``path` (host_port "127.0.0.1:9464", IPv4 or a name).
// Unavailable if it cannot connect; DeadlineExceeded past `deadline`;
// DataLoss for a reply that is not HTTP.
absl::StatusOr<HttpResponse> HttpGet(absl::string_view host_port, absl::string_view path,
                                     absl::Time deadline);

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_HTTP_H_
