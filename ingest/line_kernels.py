"""The per-line loops of the line path (``ingest/line_routes.py``, ``IngestSink.ingest_lines``).

Each function is the whole loop over a read's lines, with what it decides spelled out in the module
that owns the rule (the plan's checks in line_routes' docstring, the grouping in the sink's); anything
unusual goes back to the caller through a callback. Compiled with mypyc where a compiler is available
(``native-modules.txt``; callers pick the build with ``broker.native.select``), the same source runs
as it is otherwise; tests/ingest/test_line_routes.py runs both. Keep it to what mypyc compiles well:
typed locals, ``bytes``/``list``/``dict`` work, no closures or generators in the loops.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import crc32c

if TYPE_CHECKING:  # mypyc's 64-bit native int; plain int when the source runs as it is (no runtime dependency)
    from mypy_extensions import i64

__all__ = ["LineGroup", "LineTarget", "PreparedRecord", "bucket_lines", "encode_line_group", "route_influx_lines"]

_DIGITS_TO_9: Final = bytes(0x39 if 0x30 <= b <= 0x39 else b for b in range(256))
_MAX_MS: Final = 2**53
_QUOTE: Final = 0x22  # b'"'
_BACKSLASH: Final = 0x5C  # b"\\"


class LineTarget:
    """Where lines that route alike go: log topic, device, key and headers (``key_part`` and
    ``header_part``: the last two as they sit in a record). ``partition`` is the key's partition when the
    topic had ``partitions`` partitions (the sink's cache; -1: not known), ``slot`` (topic, partition).
    ``group`` is the slot's group in the ``bucket_lines`` call numbered ``call``; ``lines`` and ``nbytes``
    what that call has counted for the target so far (folded into the health counts at its end)."""

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
        self.group: LineGroup | None = None
        self.call = -1
        self.lines = 0
        self.nbytes = 0
        self.key_and_length: dict[int, bytes] = {}  # value length -> key_part + the length's varint


# (value, encoded key, encoded headers, timestamp ms): broker/protocol/prepared_records' record
PreparedRecord = tuple[bytes, bytes, bytes, int]


class LineGroup:
    """The records one read sends to one (topic, partition), in line order, without a tuple per record:
    ``owners[k]`` is the line of record k, which is that line as it came with its target's key and headers
    at its stamp, unless ``extra`` holds record k itself (a line ``route_each`` routed: its own value, key
    and headers)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.owners: list[int] = []
        self.extra: dict[int, PreparedRecord] = {}

    def add(self, owner: int, record: PreparedRecord) -> None:
        """Record ``record`` (of line ``owner``) next."""
        self.extra[len(self.owners)] = record
        self.owners.append(owner)


def bucket_lines(
    lines: list[bytes],
    targets: list[LineTarget | None],
    partitions: dict[str, int],
    groups: dict[tuple[str, int], LineGroup],
    seen: dict[str | None, list[Any]],
    now: float,
    resolve: Callable[[int], None],
    call: int,
) -> None:
    """Append each line to its (topic, partition) group, in line order, and count it in ``seen``
    (device -> [lines, bytes, last seen]: ``HealthRegistry.open_counts``, at ``now``). A line is left to
    ``resolve(index)`` (which does all of that itself) when it has no target, no key (keyless records take
    a partition each), or its target's partition is not known for the topic's partition count in
    ``partitions`` (filled by ``resolve``); a partition's group is made by the first line that needs it.
    ``call``: a number no earlier call had.

    Counts are kept on each target while the loop runs (no boxed integers per line) and added to ``seen``
    at the end; a device enters ``seen`` at its first line, so devices are still created in the order
    their lines came (the order decides which ones a device cap folds into the overflow device)."""
    touched: list[LineTarget] = []
    try:
        for index in range(len(lines)):
            target = targets[index]
            if target is None or target.key is None:
                resolve(index)
                continue
            if target.call == call:
                group = target.group
            else:
                known = partitions.get(target.topic, -1)  # -1: not looked up in this call
                if known < 0 or target.partitions != known:
                    resolve(index)
                    continue
                group = groups.get(target.slot)
                if group is None:  # the partition is known (checked above): its group starts here
                    group = groups[target.slot] = LineGroup(target.topic, target.partition)
                target.group = group
                target.call = call
            assert group is not None
            group.owners.append(index)
            if target.lines == 0:
                touched.append(target)
                if target.device not in seen:
                    seen[target.device] = [0, 0, now]
            target.lines += 1
            target.nbytes += len(lines[index])
    finally:
        for target in touched:
            counts = seen[target.device]
            counts[0] += target.lines
            counts[1] += target.nbytes
            counts[2] = now
            target.lines = 0
            target.nbytes = 0
            target.group = None


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
        # ints, not one-byte bytes: `b'"' in line` tries its operand as an int first and builds a TypeError
        if _QUOTE in line or _BACKSLASH in line:
            screened = False
            break
    for line in lines:
        stamp = arrival_ms
        target: Any = None
        if screened or (_QUOTE not in line and _BACKSLASH not in line):
            sections = line.split(b" ")
            count = len(sections)
            ok = count == 2 or count == 3
            if count == 3:
                # bytes.isdigit() and int() in one pass over the digits, in a 64-bit integer (mypyc's int
                # multiplies through Python objects beyond 2**30): up to 18 digits, which cannot overflow it;
                # epoch ns only need the digits before the last 6 (value // 10**6 of a non-negative value)
                timestamp = sections[2]
                size = len(timestamp)
                ok = size > 0
                used = size - 6 if time_format == "epoch_ns" else size
                acc: i64 = 0
                for j in range(size):
                    digit = timestamp[j] - 0x30
                    if digit < 0 or digit > 9:
                        ok = False
                        break
                    if j < used and j < 18:
                        acc = acc * 10 + digit
                if ok and time_format is not None:
                    if time_format == "epoch_ns":
                        stamp = int(acc) if used <= 18 else int(timestamp) // 1_000_000
                        ok = stamp < _MAX_MS
                    else:
                        try:
                            stamp = to_ms(int(acc) if used <= 18 else int(timestamp), time_format)
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


# ---------------------------------------------------------------- RecordBatch v2 of a LineGroup
# The same bytes as broker/protocol/prepared_records.encode_prepared_records of the group's records (the
# base timestamp is the smallest; tests/ingest/test_line_routes.py compares them), written from the lines
# themselves: no record tuple per line between bucketing and the batch.

_BEFORE_CRC: Final = struct.Struct(">qiibI")  # base offset, batch length, leader epoch, magic, CRC
_AFTER_CRC: Final = struct.Struct(">hiqqqhii")  # attributes … record count: what the CRC covers
_BATCH_OVERHEAD: Final = 49  # the batch length counts the header from the leader epoch on
_SMALL_LIMIT: Final = 16384  # zigzag varints of 0 .. _SMALL_LIMIT - 1, looked up instead of computed


def _varint(n: int) -> bytes:
    """``n`` (non-negative: a length or a delta) as a zigzag varint."""
    v = n << 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL: Final = [_varint(n) for n in range(_SMALL_LIMIT)]
# attributes, timestamp delta 0 and offset delta n, as they follow a record's length: one part, not three
_HEADS: Final = [b"\x00\x00" + _varint(n) for n in range(_SMALL_LIMIT)]
_KEY_AND_LENGTH_MAX: Final = 256  # value lengths remembered per target; forgotten when more


def encode_line_group(group: LineGroup, lines: list[bytes], targets: list[LineTarget | None],
                      stamps: list[int] | None, arrival_ms: int, start: int, end: int) -> bytes:
    """One RecordBatch (base offset 0) of the group's records ``start`` to ``end`` - 1: a plain record's
    value is its line, key and headers its target's, timestamp ``stamps[line]`` (None: ``arrival_ms``)."""
    owners = group.owners
    extra = group.extra
    mixed = len(extra) > 0
    base_ts = arrival_ms
    max_ts = arrival_ms
    if stamps is not None or mixed:
        first = True
        for k in range(start, end):
            record = extra.get(k) if mixed else None
            ts = record[3] if record is not None else stamps[owners[k]] if stamps is not None else arrival_ms
            if first or ts < base_ts:
                base_ts = ts
            if first or ts > max_ts:
                max_ts = ts
            first = False
    small = _SMALL
    heads = _HEADS
    parts: list[bytes] = []
    zero = b"\x00"  # a record's attributes
    # Each record is joined from as few parts as the usual case allows (bytes.join costs per part): its
    # length, then attributes + timestamp delta + offset delta from one table (delta 0: every line of an
    # NDJSON read), key + value length from the target's cache, the value, the headers.
    for k in range(start, end):
        record = extra.get(k) if mixed else None
        delta = k - start
        if record is None:
            line_index = owners[k]
            value = lines[line_index]
            target = targets[line_index]
            assert target is not None
            ts_delta = (stamps[line_index] if stamps is not None else arrival_ms) - base_ts
            n = len(value)
            if ts_delta == 0 and delta < _SMALL_LIMIT:
                cached = target.key_and_length
                key_and_length = cached.get(n)
                if key_and_length is None:
                    if len(cached) >= _KEY_AND_LENGTH_MAX:
                        cached.clear()
                    key_and_length = target.key_part + (small[n] if n < _SMALL_LIMIT else _varint(n))
                    cached[n] = key_and_length
                head = heads[delta]
                headers = target.header_part
                size = len(head) + len(key_and_length) + n + len(headers)
                parts.append(small[size] if size < _SMALL_LIMIT else _varint(size))
                parts.append(head)
                parts.append(key_and_length)
                parts.append(value)
                parts.append(headers)
                continue
            key = target.key_part
            headers = target.header_part
        else:
            value, key, headers, ts = record
            ts_delta = ts - base_ts
        tsv = small[ts_delta] if ts_delta < _SMALL_LIMIT else _varint(ts_delta)
        dv = small[delta] if delta < _SMALL_LIMIT else _varint(delta)
        n = len(value)
        vv = small[n] if n < _SMALL_LIMIT else _varint(n)
        size = 1 + len(tsv) + len(dv) + len(key) + len(vv) + n + len(headers)
        parts.append(small[size] if size < _SMALL_LIMIT else _varint(size))
        parts.append(zero)
        parts.append(tsv)
        parts.append(dv)
        parts.append(key)
        parts.append(vv)
        parts.append(value)
        parts.append(headers)
    payload = b"".join(parts)
    count = end - start
    after = _AFTER_CRC.pack(0, count - 1, base_ts, max_ts, -1, -1, -1, count)
    crc = crc32c.crc32c(payload, crc32c.crc32c(after))
    head = _BEFORE_CRC.pack(0, _BATCH_OVERHEAD + len(payload), 0, 2, crc)
    return b"".join([head, after, payload])
