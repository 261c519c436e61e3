"""TLS for every listener: one server ``SSLContext`` built from PEM files, reloaded in place, and the
principal a verified client certificate stands for.

Rules:
- TLS 1.2 at least (``minimum_version``), the ``ssl`` module's default cipher list (no RC4, 3DES, MD5,
  export or anonymous suites), no compression, the server's cipher preference, no session tickets
  (a ticket key rotated by nobody outlives a certificate reload).
- Client certificates (mTLS) are asked for only when a client CA is configured: ``requested`` lets a
  client without one in (it logs in as usual), ``required`` refuses the handshake without one (Kafka's
  ``ssl.client.auth``). A certificate that does not verify against the CA always fails the handshake.
- ``ReloadableTls.reload()`` (SIGHUP) checks the new files on a scratch context first, then loads them
  into the live context: handshakes from then on present the new certificate, connections already up
  keep theirs and are not dropped. A bad new file leaves the old certificate in use (the error says why).
  CA certificates can be added by a reload, never removed (OpenSSL's trust store only grows): removing a
  CA takes a restart.
- The principal of a verified certificate: for Kafka its subject's distinguished name in RFC 2253 form
  (``User:CN=device-1,O=Acme``), as Kafka's ``DefaultKafkaPrincipalBuilder`` with the default
  ``ssl.principal.mapping.rules``; for MQTT its Common Name (Mosquitto's ``use_identity_as_username``).
  No certificate (or none verified) is no principal: the caller decides (Kafka: ANONYMOUS).
- Start-up errors name the setting and the file: missing, unreadable, not PEM, encrypted without the
  password, or a key that is not the certificate's.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.x509.oid import NameOID

from broker.security.errors import TlsConfigError
from broker.security.principal import Principal

__all__ = [
    "ClientAuth",
    "ReloadableTls",
    "TlsFiles",
    "build_server_context",
    "distinguished_name",
    "peer_common_name",
    "peer_distinguished_name",
    "peer_principal",
]

log = logging.getLogger("broker.security.tls")

ClientAuth = Literal["requested", "required"]

# Java's X500Principal.getName(RFC2253) keywords; any other attribute type is written as its dotted OID
# with the hex of its DER value (RFC 2253 §2.4), as Java does.
_RFC2253_KEYWORDS = {
    NameOID.COMMON_NAME: "CN",
    NameOID.COUNTRY_NAME: "C",
    NameOID.LOCALITY_NAME: "L",
    NameOID.STATE_OR_PROVINCE_NAME: "ST",
    NameOID.ORGANIZATION_NAME: "O",
    NameOID.ORGANIZATIONAL_UNIT_NAME: "OU",
    NameOID.STREET_ADDRESS: "STREET",
    NameOID.DOMAIN_COMPONENT: "DC",
    NameOID.USER_ID: "UID",
}


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the server's certificate chain and key are, and the CA client certificates must chain to."""

    cert: Path
    key: Path
    key_password: str | None = None
    client_ca: Path | None = None
    client_auth: ClientAuth = "requested"


def _readable(path: Path, setting: str) -> None:
    if not path.exists():
        raise TlsConfigError(f"{setting}: {path} does not exist")
    if not path.is_file():
        raise TlsConfigError(f"{setting}: {path} is not a file")
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise TlsConfigError(f"{setting}: cannot read {path}: {exc.strerror}") from exc


def _no_password() -> bytes:
    raise TlsConfigError("security.tls_key is encrypted: set security.tls_key_password")


def _load_chain(context: ssl.SSLContext, files: TlsFiles) -> None:
    _readable(files.cert, "security.tls_cert")
    _readable(files.key, "security.tls_key")
    password = files.key_password.encode() if files.key_password is not None else _no_password
    try:
        context.load_cert_chain(files.cert, files.key, password=password)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if reason == "KEY_VALUES_MISMATCH":
            raise TlsConfigError(f"security.tls_key ({files.key}) is not the key of security.tls_cert "
                                 f"({files.cert})") from exc
        if files.key_password is not None and reason in ("BAD_DECRYPT", "bad decrypt"):
            raise TlsConfigError(f"security.tls_key_password does not decrypt {files.key}") from exc
        raise TlsConfigError(f"security.tls_cert / security.tls_key ({files.cert}, {files.key}): not a PEM "
                             f"certificate chain and its private key ({reason})") from exc
    if files.client_ca is not None:
        _readable(files.client_ca, "security.tls_client_ca")
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"security.tls_client_ca: {files.client_ca} holds no PEM CA certificate "
                                 f"({exc.reason or exc})") from exc


def build_server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context with the rules above; raises ``TlsConfigError`` saying which file is wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_TICKET
    _load_chain(context, files)
    if files.client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED if files.client_auth == "required" else ssl.CERT_OPTIONAL
    return context


class ReloadableTls:
    """The one server context every listener shares; ``reload()`` swaps its certificate in place."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.context = build_server_context(files)
        self.reloads = 0
        self.reload_failures = 0

    def reload(self) -> bool:
        """Load the files again (SIGHUP). True when the new certificate is in use; a failure is logged once
        and the certificate in use stays."""
        try:
            build_server_context(self.files)  # the whole check first: the live context is never half-updated
            _load_chain(self.context, self.files)
        except TlsConfigError as exc:
            self.reload_failures += 1
            log.error(f"TLS certificate reload failed; still using the previous certificate: {exc}")
            return False
        self.reloads += 1
        log.info("TLS certificate reloaded", extra={"cert": str(self.files.cert)})
        return True


def _verified_certificate(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> x509.Certificate | None:
    """The peer's certificate if the handshake verified it against the client CA, else None."""
    if ssl_object is None or ssl_object.context.verify_mode == ssl.CERT_NONE:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    return x509.load_der_x509_certificate(der)


def _rfc2253_value(attribute: x509.NameAttribute[str | bytes]) -> str:
    value = attribute.value
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    escaped = "".join("\\" + ch if ch in ',+"\\<>;' else ch for ch in value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and len(escaped) > 1:
        escaped = escaped[:-1] + "\\ "
    return escaped


def _hex_der(attribute: x509.NameAttribute[str | bytes]) -> str:
    """``#`` and the hex of the value's DER encoding (tag, length, bytes), for attribute types without a
    keyword (RFC 2253 §2.4)."""
    raw = attribute.value if isinstance(attribute.value, bytes) else attribute.value.encode("utf-8")
    tag = getattr(attribute, "_type", None)
    tag_byte = int(tag.value) if tag is not None else 0x0C  # UTF8String when the type is unknown
    length = len(raw)
    if length < 0x80:
        header = bytes([tag_byte, length])
    else:
        size = length.to_bytes((length.bit_length() + 7) // 8, "big")
        header = bytes([tag_byte, 0x80 | len(size)]) + size
    return "#" + (header + raw).hex()


def distinguished_name(name: x509.Name) -> str:
    """``name`` as Java's ``X500Principal.getName()`` (RFC 2253): the last RDN first, comma-separated."""
    rdns = []
    for rdn in reversed(list(name.rdns)):
        parts = []
        for attribute in rdn:
            keyword = _RFC2253_KEYWORDS.get(attribute.oid)
            if keyword is None:
                parts.append(f"{attribute.oid.dotted_string}={_hex_der(attribute)}")
            else:
                parts.append(f"{keyword}={_rfc2253_value(attribute)}")
        rdns.append("+".join(parts))
    return ",".join(rdns)


def peer_distinguished_name(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The verified client certificate's subject in RFC 2253 form, or None."""
    cert = _verified_certificate(ssl_object)
    return distinguished_name(cert.subject) if cert is not None else None


def peer_principal(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Principal | None:
    """Kafka's principal for a verified client certificate: ``User:<subject DN>``; None without one."""
    dn = peer_distinguished_name(ssl_object)
    return Principal(dn) if dn is not None else None


def peer_common_name(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The verified client certificate's (last) Common Name, as Mosquitto's use_identity_as_username."""
    cert = _verified_certificate(ssl_object)
    if cert is None:
        return None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[-1].value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
