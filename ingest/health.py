"""Source health: per source and per device counters, last-seen times and idle detection.

One ``HealthRegistry`` per running Sluice (``runtime.registries["ingest_health"]``); the ingest sink
counts messages, bytes and errors, listeners count connections and the time their reads were paused
by backpressure. The CLI, the HTTP API and metrics read ``snapshot()``.

Time comes from an injected clock (seconds since the epoch, ``time.time`` by default), so idle
detection is tested without sleeping. A source or device is idle when nothing arrived from it for
``idle_timeout_s`` (a source that never sent anything counts from when it was registered).
Each row also carries ``rate_per_s`` and a ``state`` (active, slow, idle or bursty; the rules are in
``ingest/arrivals.py``), so every reader describes a device the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ingest.arrivals import ArrivalRate, bucket_of, slow_devices
from ingest.routing import SourceRef

__all__ = ["OVERFLOW_DEVICE", "DeviceHealth", "HealthRegistry", "SourceHealth"]

OVERFLOW_DEVICE = "_other"  # devices beyond max_devices_per_source are counted under this name


@dataclass(slots=True)
class DeviceHealth:
    device: str
    messages: int = 0
    bytes: int = 0
    errors: int = 0
    last_seen: float | None = None
    arrivals: ArrivalRate = field(default_factory=ArrivalRate)


@dataclass(slots=True)
class SourceHealth:
    source: SourceRef
    registered: float
    messages: int = 0
    bytes: int = 0
    errors: int = 0
    last_seen: float | None = None
    last_error: str | None = None
    in_flight: int = 0
    paused_s: float = 0.0
    pauses: int = 0
    paused_since: float | None = None
    paused_count: int = 0  # readers currently paused (a listener has many connections)
    connections: int = 0
    connections_total: int = 0
    devices: dict[str, DeviceHealth] = field(default_factory=dict)
    arrivals: ArrivalRate = field(default_factory=ArrivalRate)
    # The devices' counts of the open 100 ms bucket, not yet in ``devices`` (device -> [messages, bytes, last
    # seen]; a None device is ignored): writes add to them directly, and they are folded in once the bucket
    # closes or anything reads the registry, so a write costs nothing per device beyond two additions.
    counting: dict[str | None, list[Any]] = field(default_factory=dict)
    counting_bucket: int = -1


class HealthRegistry:
    def __init__(
        self,
        *,
        idle_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        max_devices_per_source: int = 100_000,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self.max_devices_per_source = max_devices_per_source
        self._sources: dict[SourceRef, SourceHealth] = {}

    # -- recording ------------------------------------------------------------------------------

    def register(self, source: SourceRef) -> SourceHealth:
        entry = self._sources.get(source)
        if entry is None:
            entry = self._sources[source] = SourceHealth(source, self._clock())
        return entry

    def _device(self, entry: SourceHealth, device: str) -> DeviceHealth:
        found = entry.devices.get(device)
        if found is None:
            if len(entry.devices) >= self.max_devices_per_source:
                device = OVERFLOW_DEVICE
                found = entry.devices.get(device)
            if found is None:
                found = entry.devices[device] = DeviceHealth(device)
        return found

    def record(self, source: SourceRef, device: str | None, nbytes: int, *, messages: int = 1) -> None:
        """Messages received (accepted or not: errors are counted separately)."""
        self.record_batch(source, {device: (messages, nbytes)})

    def record_batch(self, source: SourceRef, per_device: Mapping[str | None, Sequence[int]]) -> None:
        """Many messages at once: ``per_device`` maps a device (None: unknown) to ``[messages, bytes]``.

        The same counts as one ``record`` per message, with one clock read for the whole batch
        (the ingest sink calls this once per write instead of once per message)."""
        if not per_device:
            return
        counting, now = self.open_counts(source)
        total_messages = total_bytes = 0
        for device, (messages, nbytes) in per_device.items():
            total_messages += messages
            total_bytes += nbytes
            if device is not None:
                counts = counting.get(device)
                if counts is None:
                    counting[device] = [messages, nbytes, now]
                else:
                    counts[0] += messages
                    counts[1] += nbytes
                    counts[2] = now
        self.counted(source, total_messages, total_bytes, now)

    def open_counts(self, source: SourceRef) -> tuple[dict[str | None, list[Any]], float]:
        """For a write that counts its messages per device itself (the line path's kernel): the open bucket's
        counts to add them to (device -> [messages, bytes, last seen]; a new device gets ``[messages, bytes,
        now]``, a known one ``now`` as last seen) and ``now``. Then ``counted`` with the write's totals, with
        no await in between."""
        now = self._clock()
        bucket = bucket_of(now)
        entry = self.register(source)
        if bucket != entry.counting_bucket:
            self._settle(entry)
            entry.counting_bucket = bucket
        return entry.counting, now

    def counted(self, source: SourceRef, messages: int, nbytes: int, now: float) -> None:
        """The source's totals of a write whose devices were counted through ``open_counts`` (at ``now``)."""
        entry = self.register(source)
        entry.messages += messages
        entry.bytes += nbytes
        entry.last_seen = now
        entry.arrivals.add(bucket_of(now), messages)

    def _settle(self, entry: SourceHealth) -> None:
        """Fold the open bucket's device counts into the devices (the same result as adding them one write
        at a time: every count of one bucket lands in the same arrivals bucket)."""
        counting = entry.counting
        if not counting:
            return
        entry.counting = {}
        bucket = entry.counting_bucket
        known = entry.devices
        for device, (messages, nbytes, seen) in counting.items():
            if device is None:
                continue
            dev = known.get(device) or self._device(entry, device)
            dev.messages += messages
            dev.bytes += nbytes
            if dev.last_seen is None or seen > dev.last_seen:  # devices folded into OVERFLOW_DEVICE: the latest
                dev.last_seen = seen
            arrivals = dev.arrivals
            if arrivals.bucket == bucket:
                arrivals.count += messages
            else:
                arrivals.add(bucket, messages)

    def _settled(self, source: SourceRef) -> SourceHealth | None:
        entry = self._sources.get(source)
        if entry is not None:
            self._settle(entry)
        return entry

    def error(self, source: SourceRef, device: str | None, reason: str) -> None:
        entry = self.register(source)
        self._settle(entry)  # devices are created in the order they were first seen
        entry.errors += 1
        entry.last_error = reason
        if device is not None:
            self._device(entry, device).errors += 1

    def add_in_flight(self, source: SourceRef, delta: int) -> None:
        self.register(source).in_flight += delta

    def pause_started(self, source: SourceRef) -> None:
        entry = self.register(source)
        if entry.paused_count == 0:
            entry.paused_since = self._clock()
            entry.pauses += 1
        entry.paused_count += 1

    def pause_ended(self, source: SourceRef) -> None:
        entry = self.register(source)
        if entry.paused_count == 0:
            return
        entry.paused_count -= 1
        if entry.paused_count == 0 and entry.paused_since is not None:
            entry.paused_s += max(0.0, self._clock() - entry.paused_since)
            entry.paused_since = None

    @contextmanager
    def paused(self, source: SourceRef) -> Iterator[None]:
        self.pause_started(source)
        try:
            yield
        finally:
            self.pause_ended(source)

    def connection_opened(self, source: SourceRef) -> None:
        entry = self.register(source)
        entry.connections += 1
        entry.connections_total += 1

    def connection_closed(self, source: SourceRef) -> None:
        entry = self.register(source)
        entry.connections = max(0, entry.connections - 1)

    # -- reading --------------------------------------------------------------------------------

    def source(self, source: SourceRef) -> SourceHealth | None:
        return self._settled(source)

    def sources(self) -> list[SourceHealth]:
        for entry in self._sources.values():
            self._settle(entry)
        return list(self._sources.values())

    def is_idle(self, source: SourceRef, device: str | None = None) -> bool:
        entry = self._settled(source)
        if entry is None:
            return True
        now = self._clock()
        if device is None:
            since = entry.last_seen if entry.last_seen is not None else entry.registered
        else:
            dev = entry.devices.get(device)
            if dev is None or dev.last_seen is None:
                return True
            since = dev.last_seen
        return now - since > self.idle_timeout_s

    def idle_devices(self, source: SourceRef) -> list[str]:
        entry = self._settled(source)
        if entry is None:
            return []
        return [name for name in entry.devices if self.is_idle(source, name)]

    def snapshot(self, *, devices: bool = True) -> list[dict[str, Any]]:
        """JSON-ready rows: one ``"type": "source"`` row per source, then its ``"device"`` rows."""
        now = self._clock()
        bucket = bucket_of(now)
        rows: list[dict[str, Any]] = []
        for entry in self._sources.values():
            self._settle(entry)
            paused = entry.paused_s + (now - entry.paused_since if entry.paused_since is not None else 0.0)
            since = entry.last_seen if entry.last_seen is not None else entry.registered
            idle = now - since > self.idle_timeout_s
            rate, _ = entry.arrivals.read(bucket)
            rows.append(
                {
                    "type": "source",
                    "source": entry.source.label,
                    "kind": entry.source.kind,
                    "name": entry.source.name,
                    "messages": entry.messages,
                    "bytes": entry.bytes,
                    "errors": entry.errors,
                    "last_error": entry.last_error,
                    "last_seen_ms": _ms(entry.last_seen),
                    "idle": idle,
                    "rate_per_s": round(rate, 3),
                    "state": "idle" if idle else "bursty" if entry.arrivals.bursty(bucket) else "active",
                    "in_flight": entry.in_flight,
                    "paused": entry.paused_count > 0,
                    "paused_s": round(paused, 6),
                    "pauses": entry.pauses,
                    "connections": entry.connections,
                    "connections_total": entry.connections_total,
                    "devices": len(entry.devices),
                }
            )
            if devices:
                rows.extend(self._device_rows(entry, now, bucket))
        return rows

    def _device_rows(self, entry: SourceHealth, now: float, bucket: int) -> list[dict[str, Any]]:
        idle = {
            dev.device: dev.last_seen is None or now - dev.last_seen > self.idle_timeout_s
            for dev in entry.devices.values()
        }
        rates = {dev.device: dev.arrivals.read(bucket)[0] for dev in entry.devices.values()}
        slow = slow_devices({name: rate for name, rate in rates.items() if not idle[name]})
        rows = []
        for dev in entry.devices.values():
            if idle[dev.device]:
                state = "idle"
            elif dev.arrivals.bursty(bucket):
                state = "bursty"
            else:
                state = "slow" if dev.device in slow else "active"
            rows.append(
                {
                    "type": "device",
                    "source": entry.source.label,
                    "device": dev.device,
                    "messages": dev.messages,
                    "bytes": dev.bytes,
                    "errors": dev.errors,
                    "last_seen_ms": _ms(dev.last_seen),
                    "idle": idle[dev.device],
                    "rate_per_s": round(rates[dev.device], 3),
                    "state": state,
                }
            )
        return rows


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)
