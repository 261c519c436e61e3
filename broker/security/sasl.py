"""Server sides of the SASL mechanisms Kafka clients speak: PLAIN (RFC 4616), SCRAM-SHA-256/512 (RFC 5802,
RFC 7677). Sans-IO: tokens in, tokens out; the SCRAM message rules are ``scramp``'s.

Each exchange is used once: ``step(token) -> reply`` until ``complete``; any failure raises
``AuthenticationFailed`` whose message is the one Kafka sends (it never tells whether the user exists),
and the exchange is finished. PLAIN takes one step, SCRAM two (client-first, client-final).
"""

from __future__ import annotations

from typing import Protocol

import scramp

from broker.security.errors import AuthenticationFailed
from broker.security.principal import Principal
from broker.security.users import SCRAM_MECHANISMS, UserStore

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
    """client-first -> server-first (salt, iterations, nonce); client-final (proof) -> server-final."""

    def __init__(self, users: UserStore, mechanism: str) -> None:
        self.mechanism = mechanism
        self._users = users
        self._server = scramp.ScramMechanism(mechanism).make_server(self._auth_info)
        self._steps = 0
        self.complete = False
        self.principal: Principal | None = None
        self.user: str | None = None

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = username
        credential = self._users.credential(username, self.mechanism)
        if credential is None:
            raise AuthenticationFailed(_INVALID_SCRAM)
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise AuthenticationFailed(f"Authentication failed: {self.mechanism} exchange already complete")
        self._steps += 1
        try:
            message = token.decode("utf-8")
            if self._steps == 1:
                self._server.set_client_first(message)
                return str(self._server.get_server_first()).encode()
            self.complete = True
            self._server.set_client_final(message)
            final = str(self._server.get_server_final()).encode()
        except AuthenticationFailed:
            self.complete = True
            raise
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            self.complete = True
            raise AuthenticationFailed(_INVALID_SCRAM) from exc
        assert self.user is not None
        self.principal = Principal(self.user)
        return final


def start_exchange(users: UserStore, mechanism: str) -> SaslExchange:
    """A fresh exchange for ``mechanism`` (one of ``MECHANISMS``)."""
    if mechanism == "PLAIN":
        return PlainExchange(users)
    if mechanism in SCRAM_MECHANISMS:
        return ScramExchange(users, mechanism)
    raise ValueError(f"unsupported SASL mechanism {mechanism!r}")
