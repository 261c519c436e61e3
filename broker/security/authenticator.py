"""What every front door asks to authenticate a client: SASL exchanges (Kafka), password checks (MQTT), and
the audit of failures — counted per front door and logged at WARNING, at most one line per front door every
``log_interval_s`` (saying how many more failed since), so a password-guessing client cannot flood the log.

Front doors receive one ``Authenticator`` at construction (``sluice/serve`` builds it from settings) and
never see the user store's file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker.security.errors import UnsupportedMechanismError
from broker.security.principal import Principal
from broker.security.sasl import MECHANISMS, SaslExchange, start_exchange
from broker.security.users import UserStore

__all__ = ["Authenticator"]

log = logging.getLogger("broker.security")


class Authenticator:
    def __init__(self, users: UserStore, *, log_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.users = users
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
        """The principal ``name`` if ``password`` is its password, else None."""
        return Principal(name) if self.users.check_password(name, password) else None

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
