"""Injected clocks: processing time comes from a ``Clock`` so that tests never sleep.

``SystemClock`` reads the wall clock and sleeps with asyncio; ``processors.testing.FakeClock``
moves only when a test calls ``advance`` and wakes sleepers whose deadline has passed.
Times are integers in milliseconds since the epoch, like Kafka record timestamps.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Protocol

__all__ = ["NO_TIME", "Clock", "SystemClock", "duration_ms", "ms"]

NO_TIME = -(2**63)  # "no event time seen yet"; below every real timestamp


def ms(seconds: float) -> int:
    """Seconds to integer milliseconds (``ms(10)`` == 10_000)."""
    return round(seconds * 1000)


class Clock(Protocol):
    def now_ms(self) -> int:
        """Processing time, ms since the epoch."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""


class SystemClock:
    """The wall clock."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def duration_ms(value: int | float | timedelta) -> int:
    """A duration in ms: ints are ms already, a ``timedelta`` is converted."""
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)
