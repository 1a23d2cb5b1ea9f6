"""Authentication (--auth-token) and TLS (--tls-cert/--tls-key) with real clients."""

from __future__ import annotations

import datetime
import ipaddress

import adbc_driver_flightsql.dbapi as flight_sql
import adbc_driver_manager as adbc
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.flight.server import ServerProcess

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def secured():
    process = ServerProcess("--auth-token", TOKEN, "--demo")
    try:
        yield process
    finally:
        process.stop()


def test_calls_without_credentials_are_unauthenticated(secured):
    with flight_sql.connect(secured.uri, autocommit=True) as conn, conn.cursor() as cur:
        with pytest.raises(adbc.ProgrammingError, match="UNAUTHENTICATED") as caught:
            cur.execute("SELECT * FROM region_sales")
        assert "Traceback" not in str(caught.value)
    with fl.connect(secured.uri) as client:
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(client.list_flights())
        with pytest.raises(fl.FlightUnauthenticatedError):
            client.authenticate_basic_token("ivm", "wrong")


def test_wrong_bearer_token_is_rejected(secured):
    kwargs = {"adbc.flight.sql.authorization_header": "Bearer nope"}
    with flight_sql.connect(secured.uri, db_kwargs=kwargs, autocommit=True) as conn, conn.cursor() as cur:
        with pytest.raises(adbc.ProgrammingError, match="UNAUTHENTICATED"):
            cur.execute("SELECT 1")


def test_bearer_token(secured):
    kwargs = {"adbc.flight.sql.authorization_header": f"Bearer {TOKEN}"}
    with flight_sql.connect(secured.uri, db_kwargs=kwargs, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM customers")
        assert cur.fetchall() == [(20,)]


def test_user_and_password_get_a_bearer_token(secured):
    kwargs = {"username": "anyone", "password": TOKEN}
    with flight_sql.connect(secured.uri, db_kwargs=kwargs, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM customers")
        assert cur.fetchall() == [(20,)]
    with fl.connect(secured.uri) as client:
        header = client.authenticate_basic_token("ivm", TOKEN)
        assert header == (b"authorization", f"Bearer {TOKEN}".encode())
        options = fl.FlightCallOptions(headers=[header])
        names = {f.descriptor.path[0].decode() for f in client.list_flights(options=options)}
        assert {"orders", "customers", "region_sales"} <= names
    with pytest.raises(adbc.ProgrammingError, match="UNAUTHENTICATED"):  # the handshake fails on connect
        flight_sql.connect(secured.uri, db_kwargs={"username": "anyone", "password": "bad"})


def make_certificate(tmp_path) -> tuple[str, str, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(pem)
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path), pem


def test_tls_with_token(tmp_path):
    cert, key, pem = make_certificate(tmp_path)
    with ServerProcess("--tls-cert", cert, "--tls-key", key, "--auth-token", TOKEN) as server:
        assert server.uri.startswith("grpc+tls://127.0.0.1:")
        kwargs = {"adbc.flight.sql.client_option.tls_root_certs": pem.decode(),
                  "adbc.flight.sql.authorization_header": f"Bearer {TOKEN}"}
        with flight_sql.connect(server.uri, db_kwargs=kwargs, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (a BIGINT)")
            cur.adbc_ingest("t", pa.table({"a": [1, 2]}), mode="append")
            cur.execute("SELECT SUM(a) FROM t")
            assert cur.fetchall() == [(3,)]
        with fl.connect(server.uri, tls_root_certs=pem) as client:
            options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
            info = client.get_flight_info(fl.FlightDescriptor.for_path("t"), options)
            assert client.do_get(info.endpoints[0].ticket, options).read_all().num_rows == 2
        # A client that does not trust the certificate cannot talk to it.
        with fl.connect(server.uri) as untrusting:
            with pytest.raises(fl.FlightUnavailableError):
                list(untrusting.list_flights(options=fl.FlightCallOptions(timeout=5)))


def test_banner_suggests_the_demo_view_where_the_demo_is_loaded(secured):
    from tests.flight.test_shell import banner

    text = banner(secured)
    assert 'cur.execute("SELECT * FROM region_sales")' in text
    assert f"ivm sql --connect {secured.uri} --auth-token <token>" in text
