"""A Kafka connection's SASL login (``security.auth = "required"``): what is served before it, and how.

Rules (Kafka's ``SaslServerAuthenticator``, in its order):
- Until the login completes a frame may be at most ``sasl_max_receive_bytes`` (Kafka's
  ``sasl.server.max.receive.size``, 512 KiB): a larger one closes the connection before it is read, without
  an answer (``KafkaServer`` sets the limit on the connection; ``on_login`` lifts it). Frames read ahead
  behind the login request are held to it too (Kafka reads one frame at a time while authenticating; real
  clients wait for the login's answer). Not with a verified client certificate: that is a login already.
- Before the handshake only ApiVersions (answered once; an unsupported version of it is answered
  UNSUPPORTED_VERSION and may be retried) and SaslHandshake v1 are served. Any other request, or a second
  ApiVersions, closes the connection without an answer (Kafka: "Unexpected Kafka request of type … during
  SASL handshake"): a client without SASL configured sees the connection drop, as against Kafka.
- SaslHandshake v0 (still served by Kafka: librdkafka's feature check asks for it) is followed by raw SASL
  tokens, each a size-prefixed frame without a request header, answered the same way; a failure closes
  the connection without an answer, as Kafka does.
- SaslHandshake naming an offered mechanism is answered NONE with the offered list; any other mechanism is
  answered UNSUPPORTED_SASL_MECHANISM with the list, then the connection closes.
- Then only SaslAuthenticate is served; each token goes to the mechanism's exchange (``broker.security``).
  A request of another API (ApiVersions and SaslHandshake included) is answered ILLEGAL_SASL_STATE in that
  API's response, then the connection closes (an unsupported version of it: closed without an answer).
  A failed exchange is answered SASL_AUTHENTICATION_FAILED with Kafka's message (which never says whether
  the user exists), then the connection closes.
- When the exchange completes the connection acts as its principal (handlers see it as ``conn.principal``)
  and every request reaches the broker.
  A later SaslHandshake or SaslAuthenticate is answered ILLEGAL_SASL_STATE (``outside_login``), as Kafka's
  request handler does; re-authentication (KIP-368) is not offered (session_lifetime_ms = 0).
- Over TLS with a verified client certificate (``SSL`` and ``SASL_SSL`` share the port): a client that
  starts SASL (SaslHandshake, after an optional ApiVersions) logs in by SASL and acts as that user, as on
  Kafka's SASL_SSL listener; any other request logs the connection in as the certificate's subject DN, as
  on Kafka's SSL listener with client authentication, and is served.
- Every refusal and failure is counted and logged by the ``Authenticator`` (rate-limited) under "kafka";
  error codes in answers are counted in the listener's stats like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from broker.protocol.kafka import (
    ApiKey,
    KafkaProtocolError,
    Request,
    UnsupportedRequestError,
    api_versions_body,
    decode_request,
    encode_unsupported_version,
)
from broker.protocol.kafka.error_responses import error_response
from broker.protocol.kafka.header import peek_api
from broker.protocol.kafka_codes import ErrorCode
from broker.security import AuthenticationFailed, Authenticator, Principal, SaslExchange
from broker.server.handlers_common import ConnectionInfo
from broker.server.kafka_connection import CloseConnection, Dispatch, Frame, Response
from broker.server.stats import KafkaStats

__all__ = ["SaslGate", "outside_login"]

_DOOR = "kafka"
_HANDSHAKE, _AFTER_VERSIONS, _AUTHENTICATE = "handshake", "after-versions", "authenticate"
_SERVED_BEFORE_HANDSHAKE = {
    _HANDSHAKE: (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE),
    _AFTER_VERSIONS: (ApiKey.SASL_HANDSHAKE,),
}


def outside_login(api_key: int) -> dict[str, Any]:
    """Kafka's answer to SaslHandshake/SaslAuthenticate on an authenticated (or auth-off) connection."""
    if api_key == ApiKey.SASL_HANDSHAKE:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}
    return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "auth_bytes": b"", "session_lifetime": 0,
            "error_message": "SaslAuthenticate request received after successful authentication"}


class SaslGate:
    """Wraps a connection's dispatch callable: requests reach ``inner`` only once the login succeeded."""

    def __init__(self, authenticator: Authenticator, stats: KafkaStats, inner: Dispatch,
                 certificate: Principal | None = None, on_login: Callable[[], None] | None = None) -> None:
        self._auth = authenticator
        self._stats = stats
        self._inner = inner
        self._state = _HANDSHAKE
        self._exchange: SaslExchange | None = None
        self._raw_tokens = False  # SaslHandshake v0: tokens come without SaslAuthenticate around them
        self._certificate = certificate  # a verified TLS client certificate's principal
        self._conn: ConnectionInfo | None = None  # the connection as its principal, once logged in
        self._on_login = on_login
        self.principal: Principal | None = None

    async def dispatch(self, frame: Frame, conn: ConnectionInfo) -> Response:
        if self._conn is not None:
            return await self._inner(frame, self._conn)
        frame = bytes(frame)  # before login: small, and tokens are read as bytes
        if self._raw_tokens:
            return self._raw_step(frame, conn)
        if self._certificate is not None and self._state != _AUTHENTICATE and not self._starts_sasl(frame):
            self._logged_in(self._certificate, conn)
            assert self._conn is not None
            return await self._inner(frame, self._conn)
        return self._login_step(frame, conn)

    def _starts_sasl(self, frame: bytes) -> bool:
        """Whether this request belongs to a SASL login (it is then handled here, not by the broker)."""
        try:
            api_key = peek_api(frame)[0]
        except KafkaProtocolError:
            return True  # refused by _login_step
        return api_key == ApiKey.SASL_HANDSHAKE or (api_key == ApiKey.API_VERSIONS and self._state == _HANDSHAKE)

    def _logged_in(self, principal: Principal, conn: ConnectionInfo) -> None:
        self.principal = principal
        self._conn = replace(conn, principal=principal)
        self._auth.succeeded(_DOOR)
        if self._on_login is not None:
            self._on_login()

    def _raw_step(self, token: bytes, conn: ConnectionInfo) -> Response:
        exchange = self._exchange
        assert exchange is not None
        try:
            reply = exchange.step(token)
        except AuthenticationFailed as exc:
            raise self._refuse(conn, getattr(exchange, "user", None), f"{exchange.mechanism}: {exc}") from None
        self._completed(exchange, conn)
        return None, len(reply).to_bytes(4, "big") + reply

    def _login_step(self, frame: bytes, conn: ConnectionInfo) -> Response:
        try:
            api_key, version, correlation_id = peek_api(frame)
        except KafkaProtocolError as exc:
            raise self._refuse(conn, None, f"malformed request before authentication: {exc}") from exc
        self._stats.request(api_key)
        if self._state != _AUTHENTICATE and api_key not in _SERVED_BEFORE_HANDSHAKE[self._state]:
            raise self._refuse(conn, None, f"unexpected request (API key {api_key}) during the SASL handshake")
        try:
            request = decode_request(frame)
        except UnsupportedRequestError as exc:
            if api_key != ApiKey.API_VERSIONS or self._state == _AUTHENTICATE:
                raise self._refuse(conn, None, str(exc)) from exc
            self._stats.error(ErrorCode.UNSUPPORTED_VERSION)
            return None, encode_unsupported_version(api_key, version, correlation_id)
        except KafkaProtocolError as exc:
            raise self._refuse(conn, None, f"malformed request before authentication: {exc}") from exc
        if self._state == _AUTHENTICATE:
            if api_key != ApiKey.SASL_AUTHENTICATE:
                reason = f"unexpected {ApiKey(api_key).name} request during SASL authentication"
                try:
                    answer = error_response(api_key, version, request.body, ErrorCode.ILLEGAL_SASL_STATE)
                except LookupError:
                    raise self._refuse(conn, None, reason) from None
                raise self._refuse(conn, None, reason, (request.header, answer))
            return self._authenticate(request, conn)
        if api_key == ApiKey.API_VERSIONS:
            self._state = _AFTER_VERSIONS
            return request.header, api_versions_body()
        return self._handshake(request, conn)  # SaslHandshake: the only other request served before it

    def _handshake(self, request: Request, conn: ConnectionInfo) -> Response:
        mechanism = str(request.body.mechanism)
        offered = list(self._auth.mechanisms)
        if mechanism not in offered:
            answer = {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": offered}
            raise self._refuse(conn, None, f"unsupported SASL mechanism {mechanism!r}", (request.header, answer))
        self._exchange = self._auth.exchange(mechanism)
        self._state = _AUTHENTICATE
        self._raw_tokens = request.header.api_version == 0
        return request.header, {"error_code": ErrorCode.NONE, "mechanisms": offered}

    def _authenticate(self, request: Request, conn: ConnectionInfo) -> Response:
        exchange = self._exchange
        assert exchange is not None
        try:
            reply = exchange.step(bytes(request.body.auth_bytes))
        except AuthenticationFailed as exc:
            answer = {"error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": str(exc),
                      "auth_bytes": b"", "session_lifetime": 0}
            user = getattr(exchange, "user", None)
            raise self._refuse(conn, user, f"{exchange.mechanism}: {exc}", (request.header, answer)) from None
        self._completed(exchange, conn)
        return request.header, {"error_code": ErrorCode.NONE, "error_message": None, "auth_bytes": reply,
                                "session_lifetime": 0}

    def _completed(self, exchange: SaslExchange, conn: ConnectionInfo) -> None:
        if exchange.complete and exchange.principal is not None:
            self._logged_in(exchange.principal, conn)

    def _refuse(self, conn: ConnectionInfo, user: str | None, reason: str,
                answer: Response | None = None) -> CloseConnection:
        self._auth.failed(_DOOR, conn.peer_host, user, reason)
        return CloseConnection(answer)
