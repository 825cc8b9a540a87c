#include "tests/testing/tls_certs.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/subprocess.h"

namespace flashcp::tests::testing {
namespace {

// openssl's configuration for every command here, so that the system's
// openssl.cnf (its default extensions) does not matter. Sections name the
// extensions of each kind of certificate.
constexpr char kConfig[] = R"([req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
)";

constexpr char kDays[] = "7";

// Runs `openssl args...`; FailedPrecondition with the command line, exit
// code and output unless it exits 0.
absl::Status OpenSsl(const std::vector<std::string>& args, absl::Time deadline) {
  std::vector<std::string> argv = {"/usr/bin/env", "openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<CommandResult> r = RunCommand(argv, "", deadline);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat("openssl ", absl::StrJoin(args, " "),
                                                      ": exit ", r->exit_code, ": ", r->output));
  }
  return absl::OkStatus();
}

// A self-signed CA certificate and its key.
absl::Status MakeCa(const std::string& config, const std::string& cn, const std::string& cert,
                    const std::string& key, absl::Time deadline) {
  return OpenSsl({"req", "-x509", "-new", "-newkey", "ec", "-pkeyopt",
                  "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert, "-days",
                  kDays, "-subj", "/CN=" + cn, "-config", config, "-extensions", "ca_ext"},
                 deadline);
}

// A key and a certificate for it, signed by the CA, with the extensions of
// config section `section`.
absl::Status MakeSigned(const TlsFiles& f, const std::string& config, const std::string& ca_key,
                        const std::string& cn, const std::string& section, int serial,
                        const std::string& cert, const std::string& key, absl::Time deadline) {
  const std::string csr = cert + ".csr";
  if (absl::Status s = OpenSsl({"req", "-new", "-newkey", "ec", "-pkeyopt",
                                "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out",
                                csr, "-subj", "/CN=" + cn, "-config", config},
                               deadline);
      !s.ok()) {
    return s;
  }
  return OpenSsl({"x509", "-req", "-in", csr, "-CA", f.ca_cert, "-CAkey", ca_key, "-set_serial",
                  absl::StrCat(serial), "-days", kDays, "-out", cert, "-extfile", config,
                  "-extensions", section},
                 deadline);
}

}  // namespace

absl::StatusOr<TlsFiles> GenerateTlsFiles(const std::string& parent, absl::Time deadline) {
  std::string tmpl = parent + "/flashcp_tls_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, ": ", std::strerror(errno)));
  }
  TlsFiles f;
  f.dir = tmpl;
  f.ca_cert = f.dir + "/ca.pem";
  f.server_cert = f.dir + "/server.pem";
  f.server_key = f.dir + "/server.key";
  f.client_cert = f.dir + "/client.pem";
  f.client_key = f.dir + "/client.key";
  f.other_ca_cert = f.dir + "/other_ca.pem";
  const std::string config = f.dir + "/openssl.cnf";
  const std::string ca_key = f.dir + "/ca.key";
  {
    std::ofstream out(config, std::ios::binary);
    out << kConfig;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", config));
  }
  // In order, stopping at the first failure: the signed certificates need the CA.
  absl::Status s = MakeCa(config, "flashcp test CA", f.ca_cert, ca_key, deadline);
  if (s.ok()) {
    s = MakeSigned(f, config, ca_key, "localhost", "server_ext", 2, f.server_cert, f.server_key,
                   deadline);
  }
  if (s.ok()) {
    s = MakeSigned(f, config, ca_key, "flashcp test client", "client_ext", 3, f.client_cert,
                   f.client_key, deadline);
  }
  if (s.ok()) {
    s = MakeCa(config, "flashcp other CA", f.other_ca_cert, f.dir + "/other_ca.key", deadline);
  }
  if (!s.ok()) return s;
  return f;
}

}  // namespace flashcp::tests::testing
