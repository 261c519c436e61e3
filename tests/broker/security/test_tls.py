"""The shared server TLS context: start-up errors that name the file, the RFC 2253 principal of a client
certificate (checked against openssl's own RFC 2253 printing), and reload without dropping connections."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker.security import TlsConfigError
from broker.security.tls import (
    ReloadableTls,
    TlsFiles,
    build_server_context,
    distinguished_name,
    peer_common_name,
    peer_principal,
)
from tests.tls_certs import client_context, make_certs


def _files(tmp_path: Path) -> TlsFiles:
    certs = make_certs(tmp_path / "tls")
    return TlsFiles(certs.cert, certs.key)


def test_missing_certificate_names_the_setting_and_file(tmp_path: Path) -> None:
    files = _files(tmp_path)
    with pytest.raises(TlsConfigError, match=r"security.tls_cert: .*nope.pem does not exist"):
        build_server_context(TlsFiles(tmp_path / "nope.pem", files.key))


def test_a_directory_is_not_a_key_file(tmp_path: Path) -> None:
    files = _files(tmp_path)
    with pytest.raises(TlsConfigError, match="security.tls_key: .* is not a file"):
        build_server_context(TlsFiles(files.cert, tmp_path))


def test_key_of_another_certificate_is_a_mismatch(tmp_path: Path) -> None:
    first, second = make_certs(tmp_path / "a"), make_certs(tmp_path / "b")
    with pytest.raises(TlsConfigError, match="is not the key of security.tls_cert"):
        build_server_context(TlsFiles(first.cert, second.key))


def test_not_pem_is_refused(tmp_path: Path) -> None:
    files = _files(tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(TlsConfigError, match="not a PEM certificate chain"):
        build_server_context(TlsFiles(junk, files.key))


def test_encrypted_key_needs_its_password(tmp_path: Path) -> None:
    files = _files(tmp_path)
    key = serialization.load_pem_private_key(files.key.read_bytes(), None)
    encrypted = tmp_path / "encrypted-key.pem"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"s3cret")))
    with pytest.raises(TlsConfigError, match="is encrypted: set security.tls_key_password"):
        build_server_context(TlsFiles(files.cert, encrypted))
    with pytest.raises(TlsConfigError):
        build_server_context(TlsFiles(files.cert, encrypted, key_password="wrong"))
    assert build_server_context(TlsFiles(files.cert, encrypted, key_password="s3cret")).minimum_version == \
        ssl.TLSVersion.TLSv1_2


def test_client_ca_that_is_not_pem_is_refused(tmp_path: Path) -> None:
    files = _files(tmp_path)
    junk = tmp_path / "ca.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsConfigError, match="security.tls_client_ca"):
        build_server_context(TlsFiles(files.cert, files.key, client_ca=junk))


def _self_signed(tmp_path: Path, subject: x509.Name) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    path = tmp_path / "subject.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_distinguished_name_is_rfc2253_as_openssl_and_java_print_it(tmp_path: Path) -> None:
    subject = x509.Name([
        x509.NameAttribute(NameOID.COUNTRY_NAME, "DE"),
        x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "Berlin"),
        x509.NameAttribute(NameOID.LOCALITY_NAME, "Berlin"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme, Inc."),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Sensors+Gateways"),
        x509.NameAttribute(NameOID.COMMON_NAME, "device-1"),
    ])
    path = _self_signed(tmp_path, subject)
    printed = subprocess.run(["openssl", "x509", "-in", str(path), "-noout", "-subject", "-nameopt", "RFC2253"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert printed.startswith("subject=")
    expected = printed.removeprefix("subject=")
    assert expected == "CN=device-1,OU=Sensors\\+Gateways,O=Acme\\, Inc.,L=Berlin,ST=Berlin,C=DE"
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    assert distinguished_name(cert.subject) == expected


def test_attribute_without_rfc2253_keyword_is_oid_and_hex_der_as_in_java() -> None:
    subject = x509.Name([x509.NameAttribute(NameOID.EMAIL_ADDRESS, "a@b.c"),
                         x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    # Java: new X500Principal("CN=x,EMAILADDRESS=a@b.c").getName() -> "CN=x,1.2.840.113549.1.9.1=#1605614062 2e63"
    assert distinguished_name(subject) == "CN=x,1.2.840.113549.1.9.1=#16056140622e63"


async def _serve_tls(context: ssl.SSLContext) -> tuple[asyncio.Server, int, asyncio.Queue[ssl.SSLObject]]:
    seen: asyncio.Queue[ssl.SSLObject] = asyncio.Queue()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.put_nowait(writer.get_extra_info("ssl_object"))
        while data := await reader.read(100):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=context)
    return server, server.sockets[0].getsockname()[1], seen


async def _peer_serial(port: int, context: ssl.SSLContext) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number, reader, writer


async def test_reload_serves_the_new_certificate_and_keeps_open_connections(tmp_path: Path) -> None:
    old, new = make_certs(tmp_path / "old"), make_certs(tmp_path / "new")
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(old.cert, live / "cert.pem")
    shutil.copy(old.key, live / "key.pem")
    tls = ReloadableTls(TlsFiles(live / "cert.pem", live / "key.pem"))
    server, port, _ = await _serve_tls(tls.context)
    trust_both = ssl.create_default_context(cafile=str(old.ca))
    trust_both.load_verify_locations(cafile=str(new.ca))
    old_serial = x509.load_pem_x509_certificate(old.cert.read_bytes()).serial_number
    new_serial = x509.load_pem_x509_certificate(new.cert.read_bytes()).serial_number
    try:
        serial, reader, writer = await _peer_serial(port, trust_both)
        assert serial == old_serial
        shutil.copy(new.cert, live / "cert.pem")
        shutil.copy(new.key, live / "key.pem")
        assert tls.reload()
        writer.write(b"still here")  # the connection made before the reload goes on
        assert await reader.readexactly(10) == b"still here"
        serial2, _, writer2 = await _peer_serial(port, trust_both)
        assert serial2 == new_serial
        (live / "key.pem").write_text("broken\n")  # a bad file: the certificate in use stays
        assert not tls.reload() and tls.reload_failures == 1
        serial3, _, writer3 = await _peer_serial(port, trust_both)
        assert serial3 == new_serial
        for w in (writer, writer2, writer3):
            w.close()
    finally:
        server.close()


async def test_client_certificate_principal_and_common_name(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls", clients=("device-7",))
    context = build_server_context(TlsFiles(certs.cert, certs.key, client_ca=certs.ca))
    server, port, seen = await _serve_tls(context)
    try:
        _, _, with_cert = await _peer_serial(port, client_context(certs, "device-7"))
        _, _, without = await _peer_serial(port, client_context(certs))
        accepted = [await asyncio.wait_for(seen.get(), 10), await asyncio.wait_for(seen.get(), 10)]
        assert {str(peer_principal(obj)) for obj in accepted} == {"User:CN=device-7,O=Sluice dev", "None"}
        assert {peer_common_name(obj) for obj in accepted} == {"device-7", None}
        with_cert.close()
        without.close()
    finally:
        server.close()


async def test_required_client_auth_refuses_a_handshake_without_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    context = build_server_context(TlsFiles(certs.cert, certs.key, client_ca=certs.ca, client_auth="required"))
    server, port, _ = await _serve_tls(context)
    try:
        # TLS 1.3: the refusal arrives after the client's handshake finished, at its first read
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(certs),
                                                       server_hostname="localhost")
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await reader.readexactly(1)
        writer.close()
    finally:
        server.close()
