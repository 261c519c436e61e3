"""Server sides of the SASL mechanisms Kafka clients speak: PLAIN (RFC 4616), SCRAM-SHA-256/512 (RFC 5802,
RFC 7677). Sans-IO: tokens in, tokens out; SCRAM with hashlib/hmac (scramp checks the final nonce
strictly, which refuses older librdkafka clients that Kafka accepts; see ``ScramExchange``).

Each exchange is used once: ``step(token) -> reply`` until ``complete``; any failure raises
``AuthenticationFailed`` whose message is the one Kafka sends (it never tells whether the user exists),
and the exchange is finished. PLAIN takes one step, SCRAM two (client-first, client-final).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from typing import Protocol

from broker.security.errors import AuthenticationFailed
from broker.security.principal import Principal
from broker.security.users import SCRAM_MECHANISMS, ScramCredential, UserStore, hash_name

__all__ = ["MECHANISMS", "PlainExchange", "SaslExchange", "ScramExchange", "start_exchange"]

MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)  # offered in this order (SaslHandshake's list)
_INVALID = "Authentication failed: Invalid username or password"  # Kafka's PLAIN wording
_INVALID_SCRAM = "Authentication failed: Invalid user credentials"  # Kafka's SCRAM wording


class SaslExchange(Protocol):
    mechanism: str
    complete: bool
    principal: Principal | None

    def step(self, token: bytes) -> bytes: ...


class PlainExchange:
    """``[authzid] NUL authcid NUL passwd``; an authzid other than the user is refused (as Kafka does)."""

    mechanism = "PLAIN"

    def __init__(self, users: UserStore) -> None:
        self._users = users
        self.complete = False
        self.principal: Principal | None = None
        self.user: str | None = None  # the name the client gave, for the failure log

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise AuthenticationFailed("Authentication failed: PLAIN exchange already complete")
        self.complete = True
        try:
            authzid, user, password = token.decode("utf-8").split("\0")
        except ValueError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens") from None
        self.user = user or None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username")
        if not self._users.check_password(user, password):
            raise AuthenticationFailed(_INVALID)
        self.principal = Principal(user)
        return b""


class ScramExchange:
    """RFC 5802 server: client-first -> server-first (nonce, salt, iterations); client-final (proof) -> server-final.

    As Kafka's ScramSaslServer: the GS2 header must be ``n,`` (no channel binding) with no authzid or the
    user's own; extensions (``tokenauth``) are ignored; the final nonce must *end with* the combined nonce
    (Kafka's check, on which older librdkafka — Debian's kcat — relies: it repeats the client nonce). The
    proof is verified over the messages as sent, so that tolerance weakens nothing.
    """

    def __init__(self, users: UserStore, mechanism: str) -> None:
        self.mechanism = mechanism
        self._users = users
        self._hash = hash_name(mechanism)
        self._steps = 0
        self._credential: ScramCredential | None = None
        self._gs2_header = ""
        self._auth_prefix = ""  # client-first-bare "," server-first
        self._nonce = ""
        self.complete = False
        self.principal: Principal | None = None
        self.user: str | None = None

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise AuthenticationFailed(f"Authentication failed: {self.mechanism} exchange already complete")
        self._steps += 1
        try:
            message = token.decode("utf-8")
            if self._steps == 1:
                return self._client_first(message)
            self.complete = True
            return self._client_final(message)
        except (ValueError, KeyError):  # UnicodeDecodeError, a missing attribute, bad base64
            self.complete = True
            raise AuthenticationFailed(_INVALID_SCRAM) from None
        except AuthenticationFailed:
            self.complete = True
            raise

    def _client_first(self, message: str) -> bytes:
        flag, authzid, bare = message.split(",", 2)
        if flag != "n" or (authzid and not authzid.startswith("a=")):
            raise AuthenticationFailed(f"Authentication failed: {self.mechanism} without channel binding expected")
        attrs = _attributes(bare)
        self.user = _unescape(attrs["n"])
        if authzid and _unescape(authzid[2:]) != self.user:
            raise AuthenticationFailed("Authentication failed: authorization id differs from the user name")
        client_nonce = attrs["r"]
        credential = self._credential = self._users.credential(self.user, self.mechanism)
        if credential is None or not client_nonce:
            raise AuthenticationFailed(_INVALID_SCRAM)
        self._gs2_header = f"{flag},{authzid},"
        self._nonce = client_nonce + secrets.token_urlsafe(24)
        server_first = f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},i={credential.iterations}"
        self._auth_prefix = f"{bare},{server_first}"
        return server_first.encode()

    def _client_final(self, message: str) -> bytes:
        without_proof, _, proof_attr = message.rpartition(",")
        attrs = _attributes(without_proof)
        if not proof_attr.startswith("p=") or not attrs["r"].endswith(self._nonce):
            raise AuthenticationFailed(_INVALID_SCRAM)
        if base64.b64decode(attrs["c"], validate=True) != self._gs2_header.encode():
            raise AuthenticationFailed(_INVALID_SCRAM)
        credential = self._credential
        assert credential is not None and self.user is not None
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        proof = base64.b64decode(proof_attr[2:], validate=True)
        signature = hmac.digest(credential.stored_key, auth_message, self._hash)
        if len(proof) != len(signature):
            raise AuthenticationFailed(_INVALID_SCRAM)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), credential.stored_key):
            raise AuthenticationFailed(_INVALID_SCRAM)
        self.principal = Principal(self.user)
        server_signature = hmac.digest(credential.server_key, auth_message, self._hash)
        return b"v=" + base64.b64encode(server_signature)


def _attributes(message: str) -> dict[str, str]:
    """``k=v,k=v`` -> {k: v} (RFC 5802 §5.1 attribute-value pairs; a value holds no comma)."""
    return dict(part.split("=", 1) for part in message.split(",") if len(part) >= 2 and part[1] == "=")


def _unescape(saslname: str) -> str:
    if re.search(r"=(?!2C|3D)", saslname):
        raise ValueError("bad saslname escape")
    return saslname.replace("=2C", ",").replace("=3D", "=")


def start_exchange(users: UserStore, mechanism: str) -> SaslExchange:
    """A fresh exchange for ``mechanism`` (one of ``MECHANISMS``)."""
    if mechanism == "PLAIN":
        return PlainExchange(users)
    if mechanism in SCRAM_MECHANISMS:
        return ScramExchange(users, mechanism)
    raise ValueError(f"unsupported SASL mechanism {mechanism!r}")
