"""Admission of device connections: a cap on how many are open at once, in total and per client address.

Rules (the MQTT listener and the TCP line listeners each hold one ``Admission``; the TCP listeners of one
Sluice share theirs):

* A new connection is refused when ``max_connections`` are already open, or when its client address
  already has ``max_connections_per_address`` open (0 = no limit). The total is checked first.
* A refused connection is closed as soon as it is accepted, before anything is read from it, as
  Mosquitto does at its ``max_connections`` (no CONNACK: the client sees the connection closed). The
  listener may first write a one-line reason where its protocol has one (TCP ack mode: ``FATAL``).
* Every refusal is counted by reason (the setting's name) and logged as a WARNING, at most one line per
  reason every ``LOG_INTERVAL_S`` saying how many more were refused since the previous line, so a storm
  of connections cannot flood the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["LOG_INTERVAL_S", "Admission", "ConnectionLimits"]

LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 0  # open at once, in total; 0 = no limit
    max_connections_per_address: int = 0  # open at once from one client IP address; 0 = no limit


@dataclass(eq=False)
class Admission:
    """Open connections of one front door (``door`` names it in the log), and its refusals by reason."""

    door: str
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("ingest"))
    clock: Callable[[], float] = time.monotonic
    open: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # reason -> count
    _per_address: dict[str, int] = field(default_factory=dict)
    _logged: dict[str, tuple[float, int]] = field(default_factory=dict)  # reason -> (last line, unlogged)

    def admit(self, address: str) -> str | None:
        """Take a slot for a connection from ``address``; None when admitted, else why it is refused."""
        limits = self.limits
        reason = None
        if limits.max_connections and self.open >= limits.max_connections:
            reason = "max_connections"
        elif limits.max_connections_per_address and self._per_address.get(address, 0) >= (
            limits.max_connections_per_address
        ):
            reason = "max_connections_per_address"
        if reason is not None:
            self.refused[reason] = self.refused.get(reason, 0) + 1
            self._log_refusal(reason, address)
            return reason
        self.open += 1
        self._per_address[address] = self._per_address.get(address, 0) + 1
        return None

    def release(self, address: str) -> None:
        """An admitted connection from ``address`` has closed."""
        self.open -= 1
        left = self._per_address.get(address, 1) - 1
        if left > 0:
            self._per_address[address] = left
        else:
            self._per_address.pop(address, None)

    def _log_refusal(self, reason: str, address: str) -> None:
        now = self.clock()
        logged_at, unlogged = self._logged.get(reason, (float("-inf"), 0))
        if now - logged_at < LOG_INTERVAL_S:
            self._logged[reason] = (logged_at, unlogged + 1)
            return
        limit = getattr(self.limits, reason)
        since = f" ({unlogged} more refused since the previous line)" if unlogged else ""
        self.log.warning(f"refused {self.door} connection from {address}: {reason} = {limit} reached{since}",
                         extra={"peer": address, "reason": reason, "limit": limit})
        self._logged[reason] = (now, 0)
