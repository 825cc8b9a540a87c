"""Starts the real flashcp-planner on port 0 for the tests and reads its
address back from the LISTENING line (every wait has a deadline). For the
TLS tests, openssl makes a CA, a localhost server certificate, a client
certificate and an unrelated CA at test time (as tests/testing/tls_certs.cc
does for the C++ tests). The fixtures shared with tests_torch/ (planner_bin,
closing clients) are in ../testing/flashcp_pytest.py."""
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest

import flashcp.planner_process

# The shared plugin (../testing/flashcp_pytest.py): only that folder goes on
# sys.path, so flashcp and flashcp_client still come from the installed copy.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "testing"))
pytest_plugins = ["flashcp_pytest"]

STARTUP_TIMEOUT_S = 60.0


def _run_planner(planner_bin, extra_args):
    """Yields the grpc HOST:PORT of a planner started with extra_args."""
    with flashcp.planner_process.start(planner_bin, extra_args,
                                       startup_timeout=STARTUP_TIMEOUT_S) as address:
        yield address


@pytest.fixture(scope="session")
def planner_address(planner_bin):
    yield from _run_planner(planner_bin, [])


# openssl's configuration for every command, so that the system's openssl.cnf
# does not matter; one section of extensions per kind of certificate.
_OPENSSL_CNF = """[req]
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
"""

_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args):
    r = subprocess.run(["openssl", *args], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=60)
    if r.returncode != 0:
        pytest.fail(f"openssl {' '.join(args)}: exit {r.returncode}: {r.stderr.decode()}")


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """Paths of fresh PEM files: ca, server (localhost, 127.0.0.1), client
    (signed by ca) and other_ca (unrelated)."""
    d = tmp_path_factory.mktemp("tls")
    cnf = str(d / "openssl.cnf")
    (d / "openssl.cnf").write_text(_OPENSSL_CNF)
    p = {name: str(d / name) for name in (
        "ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key",
        "other_ca.pem", "other_ca.key")}
    for ca, cn in (("ca", "flashcp test CA"), ("other_ca", "flashcp other CA")):
        _openssl("req", "-x509", "-new", *_EC_KEY, "-keyout", p[f"{ca}.key"], "-out",
                 p[f"{ca}.pem"], "-days", "7", "-subj", f"/CN={cn}", "-config", cnf,
                 "-extensions", "ca_ext")
    for name, cn, serial in (("server", "localhost", 2), ("client", "flashcp test client", 3)):
        csr = str(d / f"{name}.csr")
        _openssl("req", "-new", *_EC_KEY, "-keyout", p[f"{name}.key"], "-out", csr,
                 "-subj", f"/CN={cn}", "-config", cnf)
        _openssl("x509", "-req", "-in", csr, "-CA", p["ca.pem"], "-CAkey", p["ca.key"],
                 "-set_serial", str(serial), "-days", "7", "-out", p[f"{name}.pem"],
                 "-extfile", cnf, "-extensions", f"{name}_ext")
    return SimpleNamespace(ca=p["ca.pem"], server_cert=p["server.pem"],
                           server_key=p["server.key"], client_cert=p["client.pem"],
                           client_key=p["client.key"], other_ca=p["other_ca.pem"])


@pytest.fixture(scope="session")
def tls_planner_address(planner_bin, tls_files):
    """A planner serving TLS with the test server certificate."""
    yield from _run_planner(planner_bin, ["--tls_cert", tls_files.server_cert,
                                      "--tls_key", tls_files.server_key])


@pytest.fixture(scope="session")
def mtls_planner_address(planner_bin, tls_files):
    """A planner that also requires a client certificate signed by the test CA."""
    yield from _run_planner(planner_bin, ["--tls_cert", tls_files.server_cert,
                                      "--tls_key", tls_files.server_key,
                                      "--tls_client_ca", tls_files.ca])
