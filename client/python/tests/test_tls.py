"""flashcp_client over TLS and mTLS (grpc.ssl_channel_credentials) against
the real planner with the certificates conftest makes: the exact plan over
TLS, and the exact code of each refusal."""
import grpc
import pytest

from expected_plans import assert_ring_plan_for_5_3
from flashcp_client import Client


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_tls_plan_is_exact(tls_planner_address, tls_files):
    creds = grpc.ssl_channel_credentials(root_certificates=read(tls_files.ca))
    with Client(tls_planner_address, timeout=60, credentials=creds) as c:
        assert_ring_plan_for_5_3(c.plan([5, 3], cp_size=2, strategy="ring"))
        assert c.server_info().api_version == "flashcp.v1"


def test_plaintext_to_tls_server_is_unavailable(tls_planner_address):
    with Client(tls_planner_address, timeout=60) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.plan([5, 3], cp_size=2, strategy="ring")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_wrong_ca_is_unavailable(tls_planner_address, tls_files):
    creds = grpc.ssl_channel_credentials(root_certificates=read(tls_files.other_ca))
    with Client(tls_planner_address, timeout=60, credentials=creds) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.plan([5, 3], cp_size=2, strategy="ring")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mtls_needs_the_client_certificate(mtls_planner_address, tls_files):
    without = grpc.ssl_channel_credentials(root_certificates=read(tls_files.ca))
    with Client(mtls_planner_address, timeout=60, credentials=without) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.plan([5, 3], cp_size=2, strategy="ring")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    with_cert = grpc.ssl_channel_credentials(root_certificates=read(tls_files.ca),
                                             private_key=read(tls_files.client_key),
                                             certificate_chain=read(tls_files.client_cert))
    with Client(mtls_planner_address, timeout=60, credentials=with_cert) as c:
        assert_ring_plan_for_5_3(c.plan([5, 3], cp_size=2, strategy="ring"))
        assert_ring_plan_for_5_3(c.plan_async([5, 3], cp_size=2, strategy="ring")
                                 .result(timeout=60))
