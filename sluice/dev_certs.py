"""Development certificates: a private CA, a server certificate for this machine, and client certificates.

``sluice certs dev --data-dir DIR`` writes them into ``DIR/tls/`` (keys readable by the owner only) and
prints the settings that use them. They are for trying TLS out and for tests, never for production: the
CA key lies beside the certificates and anyone who has it can mint clients.

Files: ``ca.pem`` (give it to clients: ``--cafile``, ``ssl.ca.location``, ``curl --cacert``),
``ca-key.pem``, ``server.pem`` + ``server-key.pem`` (``security.tls_cert`` / ``security.tls_key``; valid for
localhost, 127.0.0.1, ::1, the host name and any extra names given), and per client ``<name>.pem`` +
``<name>-key.pem`` (subject ``CN=<name>,O=Sluice dev``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DevCertificates", "issue_client", "write_dev_certificates"]

_ORG = "Sluice dev"
_VALID_DAYS = 825  # the longest validity Apple's TLS clients accept for a server certificate


@dataclass(frozen=True, slots=True)
class DevCertificates:
    directory: Path
    ca: Path
    ca_key: Path
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organization: str = _ORG) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS)))


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca-key.pem").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def _alt_names(names: Sequence[str]) -> list[x509.GeneralName]:
    result: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            result.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            result.append(x509.DNSName(name))
    return result


def write_dev_certificates(directory: Path, hosts: Sequence[str] = ()) -> DevCertificates:
    """A new CA and server certificate in ``directory`` (created; existing files are replaced)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("Sluice dev CA")
    ca = (_builder(ca_name, ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server_key = _key()
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), *hosts]
    server = (_builder(_name("localhost"), ca_name, server_key.public_key())
              .add_extension(x509.SubjectAlternativeName(_alt_names(names)), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    files = DevCertificates(directory, directory / "ca.pem", directory / "ca-key.pem",
                            directory / "server.pem", directory / "server-key.pem")
    _write_key(files.ca_key, ca_key)
    _write_cert(files.ca, ca)
    _write_key(files.key, server_key)
    _write_cert(files.cert, server)
    return files


def issue_client(directory: Path, name: str, organization: str = _ORG) -> tuple[Path, Path]:
    """A client certificate ``CN=<name>,O=<organization>`` signed by the dev CA in ``directory``:
    returns (certificate, key) paths."""
    ca, ca_key = _load_ca(directory)
    key = _key()
    cert = (_builder(_name(name, organization), ca.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert_path, key_path
