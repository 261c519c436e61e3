"""What every front door asks to authenticate a client: SASL exchanges (Kafka), password checks (MQTT), and
the audit of failures — counted per front door and logged at WARNING, at most one line per front door every
``log_interval_s`` (saying how many more failed since), so a password-guessing client cannot flood the log.

Front doors receive one ``Authenticator`` at construction (``sluice/serve`` builds it from settings) and
never see the user store's file.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable

from broker.security.errors import UnsupportedMechanismError
from broker.security.principal import Principal
from broker.security.sasl import MECHANISMS, SaslExchange, start_exchange
from broker.security.tokens import TokenStore
from broker.security.users import SCRAM_MECHANISMS, UserStore

__all__ = ["Authenticator"]

log = logging.getLogger("broker.security")


_VERIFIED_CACHE = 1024  # (user, password) pairs whose PBKDF2 check is remembered (HTTP Basic: one per request)


class Authenticator:
    def __init__(self, users: UserStore, *, tokens: TokenStore | None = None, log_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.users = users
        self.tokens = tokens  # bearer tokens (HTTP); None: tokens are not accepted
        # HMAC(process key, user NUL password) -> the StoredKey it was verified against: HTTP Basic sends the
        # password with every request and PBKDF2 costs milliseconds. Only this process's random key makes the
        # entries, so they give nothing to brute-force; a changed password (new StoredKey) is checked afresh.
        self._cache_key = os.urandom(32)
        self._verified: dict[bytes, bytes] = {}
        self.mechanisms: tuple[str, ...] = MECHANISMS
        self.failures: dict[str, int] = {}  # failed logins by front door ("kafka", "mqtt")
        self.successes: dict[str, int] = {}  # successful logins by front door
        self._log_interval_s = log_interval_s
        self._clock = clock
        self._logged: dict[str, tuple[float, int]] = {}  # front door -> (last line at, failures since)

    def exchange(self, mechanism: str) -> SaslExchange:
        if mechanism not in self.mechanisms:
            raise UnsupportedMechanismError(f"Unsupported SASL mechanism {mechanism}")
        return start_exchange(self.users, mechanism)

    def check_password(self, name: str, password: str) -> Principal | None:
        """The principal ``name`` if ``password`` is its password, else None (constant-time comparisons)."""
        credential = self.users.credential(name, SCRAM_MECHANISMS[0])
        try:
            secret = f"{name}\0{password}".encode()
        except UnicodeEncodeError:  # a lone surrogate: no stored password can be it
            return None
        if credential is None:
            return None
        key = hmac.digest(self._cache_key, secret, hashlib.sha256)
        known = self._verified.get(key)
        if known is not None and hmac.compare_digest(known, credential.stored_key):
            return Principal(name)
        if not credential.matches(SCRAM_MECHANISMS[0], password):
            return None
        if len(self._verified) >= _VERIFIED_CACHE:
            self._verified.pop(next(iter(self._verified)))
        self._verified[key] = credential.stored_key
        return Principal(name)

    def check_token(self, token: str) -> Principal | None:
        """The principal a bearer token acts as, or None (no token store, unknown or revoked token)."""
        return self.tokens.principal(token) if self.tokens is not None else None

    def succeeded(self, door: str) -> None:
        self.successes[door] = self.successes.get(door, 0) + 1

    def failed(self, door: str, peer: str, user: str | None, reason: str) -> None:
        """Count a failed login and log it (rate-limited per front door)."""
        self.failures[door] = self.failures.get(door, 0) + 1
        now = self._clock()
        last, unlogged = self._logged.get(door, (float("-inf"), 0))
        if now - last < self._log_interval_s:
            self._logged[door] = (last, unlogged + 1)
            return
        since = f" ({unlogged} more since the previous line)" if unlogged else ""
        log.warning(f"{door} login failed from {peer} as {user!r}: {reason}{since}",
                    extra={"peer": peer, "front_door": door, "user": user})
        self._logged[door] = (now, 0)
