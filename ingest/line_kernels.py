"""The per-line loops of the line path (``ingest/line_routes.py``, ``IngestSink.ingest_lines``).

Each function is the whole loop over a read's lines, with what it decides spelled out in the module
that owns the rule (the plan's checks in line_routes' docstring, the grouping in the sink's); anything
unusual goes back to the caller through a callback. Compiled with mypyc where a compiler is available
(``native-modules.txt``; callers pick the build with ``broker.native.select``), the same source runs
as it is otherwise; tests/ingest/test_line_routes.py runs both. Keep it to what mypyc compiles well:
typed locals, ``bytes``/``list``/``dict`` work, no closures or generators in the loops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["Group", "LineTarget", "bucket_lines", "route_influx_lines"]

_DIGITS_TO_9: Final = bytes(0x39 if 0x30 <= b <= 0x39 else b for b in range(256))
_MAX_MS: Final = 2**53


class LineTarget:
    """Where lines that route alike go: log topic, device, key and headers (``key_part`` and
    ``header_part``: the last two as they sit in a record). ``partition`` is the key's partition when the
    topic had ``partitions`` partitions (the sink's cache; -1: not known), ``slot`` (topic, partition)."""

    def __init__(self, topic: str, device: str | None, key: bytes | None,
                 headers: tuple[tuple[str, bytes | None], ...], key_part: bytes, header_part: bytes) -> None:
        self.topic = topic
        self.device = device
        self.key = key
        self.headers = headers
        self.key_part = key_part
        self.header_part = header_part
        self.partition = -1
        self.partitions = -1
        self.slot = (topic, -1)


# (records, lines): what one (topic, partition) gets from one read, in line order
Group = tuple[list[tuple[bytes, bytes, bytes, int]], list[int]]


def bucket_lines(
    lines: list[bytes],
    targets: list[LineTarget | None],
    stamps: list[int] | None,
    arrival_ms: int,
    partitions: dict[str, int],
    groups: dict[tuple[str, int], Group],
    seen: dict[str | None, list[Any]],
    now: float,
    resolve: Callable[[int], None],
) -> None:
    """Append each line's record to its (topic, partition) group, in line order, and count it in ``seen``
    (device -> [lines, bytes, last seen]: ``HealthRegistry.open_counts``, at ``now``). A line is left to
    ``resolve(index)`` (which does all of that itself) when it has no target, no key (keyless records take
    a partition each), or its target's partition is not known for the topic's partition count in
    ``partitions`` (filled by ``resolve``) or has no group yet."""
    for index in range(len(lines)):
        target = targets[index]
        if target is None or target.key is None or target.partitions != partitions.get(target.topic, -1):
            resolve(index)
            continue
        group = groups.get(target.slot)
        if group is None:
            resolve(index)
            continue
        line = lines[index]
        group[0].append((line, target.key_part, target.header_part,
                         stamps[index] if stamps is not None else arrival_ms))
        group[1].append(index)
        counts = seen.get(target.device)
        if counts is None:
            seen[target.device] = [1, len(line), now]
        else:
            counts[0] += 1
            counts[1] += len(line)
            counts[2] = now


def route_influx_lines(
    lines: list[bytes],
    arrival_ms: int,
    time_format: str | None,
    series_targets: dict[bytes, Any],
    shapes: dict[bytes, bool],
    learn: Callable[[bytes, bytes, int], Any],
    valid_fields: Callable[[bytes], bool],
    to_ms: Callable[[int, str], int],
    slow: Any,
) -> tuple[list[Any], list[int]]:
    """InfluxLinePlan's loop (its rules are in line_routes' docstring): per line its target or None, and
    its event time. ``time_format`` None: arrival time; ``learn(series, line, stamp)`` makes (or refuses
    with ``slow``) a series' target; ``valid_fields(shape)`` checks a field-section shape."""
    out: list[Any] = []
    stamps: list[int] = []
    screened = True
    for line in lines:
        if b'"' in line or b"\\" in line:
            screened = False
            break
    for line in lines:
        stamp = arrival_ms
        target: Any = None
        if screened or (b'"' not in line and b"\\" not in line):
            sections = line.split(b" ")
            count = len(sections)
            ok = count == 2 or count == 3
            if count == 3:
                timestamp = sections[2]
                if not timestamp.isdigit():
                    ok = False
                elif time_format is not None:
                    if time_format == "epoch_ns":
                        stamp = int(timestamp) // 1_000_000
                        ok = stamp < _MAX_MS
                    else:
                        try:
                            stamp = to_ms(int(timestamp), time_format)
                        except Exception:  # out of range for the rule: route_each says so
                            ok = False
            if ok:
                series = sections[0]
                shape = sections[1].translate(_DIGITS_TO_9)
                valid = shapes.get(shape)
                if valid is None:
                    valid = valid_fields(shape)
                    shapes[shape] = valid
                found = series_targets.get(series)
                if found is None:
                    found = learn(series, line, stamp)
                    series_targets[series] = found
                if valid and found is not slow:
                    target = found
        out.append(target)
        stamps.append(stamp if target is not None else arrival_ms)
    return out, stamps
