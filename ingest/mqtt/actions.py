"""What a connection machine and its transport adapter exchange: the connection states, the ``Action``s the
machine returns (``machine.py``), and the ``Endpoint`` (the adapter as the machine sees it).

Defined apart from the machine so that its parts (``machine.py``, ``publish_in.py``) and the adapters
(``session.py``) share them without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ingest.mqtt.ports import Link

__all__ = ["CLOSED", "CONNECTED", "NEW", "Action", "Do", "Endpoint", "Linger"]

NEW, CONNECTED, CLOSED = 0, 1, 2


class Do(Enum):
    """Transport operations (``bytes`` actions are writes)."""

    CLOSE = "close"  # close the transport (it then reports the loss: ``lost``)
    PAUSE_READING = "pause"
    RESUME_READING = "resume"
    START_APPENDING = "append"  # run the append loop: take_batch → IngestPort.ingest → appended, until None


@dataclass(frozen=True, slots=True)
class Linger:
    """``machine.py`` rule 10: write nothing more, keep reading (the machine discards it) and close once
    ``linger_over(now, until)`` says so; ask it every ``LINGER_QUIET_S``."""

    until: float


Action = bytes | Do | Linger


class Endpoint(Link, Protocol):
    """The connection adapter as its machine sees it: the ``Link`` it registers with the hub, and the peer
    address for log lines."""

    def peername(self) -> Any: ...
