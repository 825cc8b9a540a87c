// Throwaway TLS material for tests, made at test time by the `openssl` CLI
// (Debian's openssl package; scripts/install-deps.sh installs it): a CA, a
// server certificate for localhost that it signed, a client certificate that
// it signed, and a second, unrelated CA. Nothing is checked in; every run
// makes fresh keys in a fresh directory.
//   auto tls = GenerateTlsFiles(::testing::TempDir(), absl::Now() + absl::Seconds(60));
//   PlannerProcess::Start(bin, {"--tls_cert", tls->server_cert, "--tls_key", tls->server_key});
#ifndef FLASHCP_TESTS_TESTING_TLS_CERTS_H_
#define FLASHCP_TESTS_TESTING_TLS_CERTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace flashcp::tests::testing {

// Paths of PEM files, all in `dir`. Keys are ECDSA P-256, unencrypted;
// certificates are valid for 7 days from their making.
struct TlsFiles {
  std::string dir;
  std::string ca_cert;        // "CN=flashcp test CA", self-signed, CA:TRUE
  std::string server_cert;    // "CN=localhost", SAN DNS:localhost and IP:127.0.0.1,
  std::string server_key;     //   serverAuth, signed by ca_cert
  std::string client_cert;    // "CN=flashcp test client", clientAuth, signed by ca_cert
  std::string client_key;
  std::string other_ca_cert;  // "CN=flashcp other CA", self-signed: signed none of the above
};

// Makes a new directory under `parent` (mkdtemp) and the files in it, by
// running `openssl` from PATH. Internal if the directory or a file cannot be
// made; FailedPrecondition naming the openssl command, with its exit code and
// output, if one fails (exit 127: no openssl on PATH); DeadlineExceeded if
// the commands run past `deadline`.
absl::StatusOr<TlsFiles> GenerateTlsFiles(const std::string& parent, absl::Time deadline);

}  // namespace flashcp::tests::testing

#endif  // FLASHCP_TESTS_TESTING_TLS_CERTS_H_
