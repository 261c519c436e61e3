"""The per-record loops of a processor's hot path: JSON values into items, items into tumbling windows.

``decode_json`` is the loop of ``Executor.process`` for JSON sources (with the ``key_by`` under the
source done in the same loop when it is the source's only operator); ``tumbling_items`` is
``KeyedRuntime.on_items`` for tumbling windows (``windows.tumbling_on_items`` says when). Each is
the whole loop over a batch; anything unusual goes back to the caller through a callback or the
general code (``WindowLogic.on_item``), whose module owns the rule. Compiled with mypyc where a
compiler is available (``native-modules.txt``; callers pick the build with ``broker.native.select``),
the same source runs as it is otherwise; tests/processors/test_record_kernels.py runs both.
``decode_stored_json`` is ``decode_json`` over stored RecordBatch v2 bytes (uncompressed): it reads
each record's fields where they lie, so no record object is made (``processors.fastdecode.StoredRecords``). Keep it to
what mypyc compiles well: typed locals, ``list``/``dict``/``int`` work, no closures or generators.

JSON: a value is read with orjson (about four times quicker than the stdlib on sensor-sized values)
unless orjson's reading could differ from ``json.loads``'s: orjson refuses NaN, Infinity, lone
surrogates and numbers beyond a double (the stdlib accepts them), and reads an integer beyond 64 bits
as a float (the stdlib keeps the exact int). So a value orjson refuses, or whose result holds a float of
magnitude 2**63 or more (every integer orjson turned into a float is one), is read by the stdlib
again, which accepts it or raises its own error. Floats orjson accepts are read as the stdlib reads
them (correctly rounded, both), checked on 500,000 random long decimals.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final

import orjson

from processors.source_record import SourceRecord

__all__ = ["ADD_CALL", "ADD_COUNT", "ADD_MEAN", "ADD_SUM", "StoredCursor", "decode_json",
           "decode_stored_json", "json_exact", "loads", "segment_cursor", "tumbling_items"]

_TWO_63: Final = 9223372036854775808.0
_NO_TIME: Final = -(2**63)  # processors.time.NO_TIME (not imported: a compiled module keeps its own)
_ORJSON_LOADS: Final = orjson.loads
_ORJSON_ERROR: Final = orjson.JSONDecodeError


def json_exact(value: object) -> bool:
    """False when ``value`` (as orjson read it) holds a float of magnitude 2**63 or more, NaN or an
    infinity: maybe an integer the stdlib would keep exact. Walks lists and dicts."""
    kind = type(value)
    if kind is dict:
        assert isinstance(value, dict)
        for item in value.values():
            kind = type(item)
            if kind is float:
                if not -_TWO_63 < item < _TWO_63:
                    return False
            elif (kind is dict or kind is list) and not json_exact(item):
                return False
        return True
    if kind is list:
        assert isinstance(value, list)
        for item in value:
            kind = type(item)
            if kind is float:
                if not -_TWO_63 < item < _TWO_63:
                    return False
            elif (kind is dict or kind is list) and not json_exact(item):
                return False
        return True
    if kind is float:
        assert isinstance(value, float)
        return -_TWO_63 < value < _TWO_63
    return True


def loads(raw: bytes) -> Any:
    """``json.loads(raw.decode())``: the same value, or the same error (see the module docstring)."""
    try:
        value = _ORJSON_LOADS(raw)
        if json_exact(value):
            return value
    except _ORJSON_ERROR:
        pass
    return json.loads(raw.decode())


def decode_json(
    records: Sequence[Any],
    event_time: Callable[[Any], Any] | None,
    key_by: Callable[[Any], Any] | None,
    punctuation: Callable[[Any], bool],
    undecodable: Callable[[Any, Exception], None],
    key_failures: list[tuple[int, Any, Exception]],
    raws: list[bytes | None] | None = None,
) -> tuple[list[Any], int, int]:
    """Each record's value decoded (``loads``; None stays None) with its event time (``event_time(value)``
    as an int, or the record's timestamp): ``(ts, value)`` items, or ``(ts, key_by(value), value)`` with
    ``key_by``. Returns the items, how many records decoded and their greatest event time.

    A record with headers goes to ``punctuation(record)`` first, and is skipped when that says True (a
    watermark punctuation); a value that does not decode, or whose event time fails, goes to
    ``undecodable(record, error)``; a decoded value whose key fails is counted as decoded and appended
    to ``key_failures`` as ``(ts, value, error)``. ``raws`` (without ``key_by``) gets each item's value
    bytes (a repartition forwards them as they came)."""
    items: list[Any] = []
    decoded = 0
    max_ts = _NO_TIME
    for r in records:
        if r.headers and punctuation(r):
            continue
        raw = r.value
        ts: int
        try:
            value: Any = None
            if raw is not None:
                exact = False
                try:
                    value = _ORJSON_LOADS(raw)
                    exact = json_exact(value)
                except _ORJSON_ERROR:
                    pass
                if not exact:
                    value = json.loads(raw.decode())  # the stdlib decides (see the module docstring)
            stamp = r.timestamp if event_time is None else event_time(value)
            ts = stamp if type(stamp) is int else int(stamp)
        except Exception as exc:
            undecodable(r, exc)
            continue
        decoded += 1
        if ts > max_ts:
            max_ts = ts
        if key_by is None:
            items.append((ts, value))
            if raws is not None:
                raws.append(raw)
            continue
        try:
            key = key_by(value)
        except Exception as exc:
            key_failures.append((ts, value, exc))
            continue
        items.append((ts, key, value))
    return items, decoded, max_ts


class StoredCursor:
    """Where ``decode_stored_json`` is in ``data[pos:end]``, whole uncompressed v2 batches: at a batch
    header when ``left`` is 0, else at the next of the current batch's ``left`` records."""

    def __init__(self, data: bytes, pos: int, end: int, min_offset: int) -> None:
        self.data = data
        self.pos = pos
        self.end = end
        self.min_offset = min_offset  # records below it (a batch read from its start) are stepped over
        self.left = 0
        self.base_offset = 0
        self.base_timestamp = 0
        self.append_time = _NO_TIME  # the batch's max timestamp when it is LogAppendTime
        self.more = True  # False: the records of the current batch are all (segment_cursor)

    def done(self) -> bool:
        return self.left == 0 and (not self.more or self.pos >= self.end)


def segment_cursor(data: bytes, pos: int, count: int, offset: int, base_timestamp: int) -> StoredCursor:
    """A cursor over ``count`` records of one CreateTime v2 batch from byte ``pos`` of ``data``, the
    first at ``offset``, the batch's first timestamp ``base_timestamp`` (a fetched batch's records,
    ``processors.kafka_records.RawSegment``): the batch's base offset is ``offset`` less the first
    record's offset delta."""
    cur = StoredCursor(data, pos, len(data), offset)
    cur.more = False
    cur.left = count
    cur.base_timestamp = base_timestamp
    if count > 0:
        p = _varint(data, pos)[1] + 1  # the record's length, its attributes
        p = _varint(data, p)[1]  # the timestamp delta
        cur.base_offset = offset - _varint(data, p)[0]
    return cur


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (up to 64 bits) at ``pos``; IndexError past the end of ``buf``."""
    shift = 0
    result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _int(buf: bytes, pos: int, size: int) -> int:
    return int.from_bytes(buf[pos : pos + size], "big", signed=True)


def _next_batch(cur: StoredCursor) -> bool:
    """Move ``cur`` into the next batch with records (control batches stepped over); False at the end."""
    data = cur.data
    while cur.more and cur.pos < cur.end:
        start = cur.pos
        size = 12 + _int(data, start + 8, 4)
        if size < 61 or start + size > cur.end:
            raise ValueError(f"stored batch at {start} runs past the data read")
        attributes = _int(data, start + 21, 2)
        cur.pos = start + size
        if attributes & 0x20:  # a control batch (transaction marker): nothing for the processor
            continue
        if attributes & 0x07:
            raise ValueError("a compressed batch among stored batches read as uncompressed")
        cur.base_offset = _int(data, start, 8)
        cur.base_timestamp = _int(data, start + 27, 8)
        cur.append_time = _int(data, start + 35, 8) if attributes & 0x08 else _NO_TIME
        count = _int(data, start + 57, 4)
        if count > 0:
            cur.left = count
            cur.pos = start + 61
            return True
    return False


def decode_stored_json(
    cur: StoredCursor,
    limit: int,
    event_time: Callable[[Any], Any] | None,
    key_by: Callable[[Any], Any] | None,
    punctuation: Callable[[Any], bool],
    undecodable: Callable[[Any, Exception], None],
    key_failures: list[tuple[int, Any, Exception]],
) -> tuple[list[Any], int, int]:
    """``decode_json`` over the next ``limit`` records at ``cur`` (fewer at the end; records before its
    ``min_offset`` are stepped over and not counted), read from the
    stored bytes: the value sliced out and decoded, the offset and timestamp from the deltas; a
    ``SourceRecord`` only for ``punctuation`` (a record with headers) and ``undecodable``. The same
    items, counts and callbacks as ``decode_json`` over those records. Malformed bytes raise
    ValueError or IndexError (the caller reports the data as corrupt)."""
    items: list[Any] = []
    decoded = 0
    max_ts = _NO_TIME
    data = cur.data
    walked = 0
    while walked < limit:
        if cur.left == 0 and not _next_batch(cur):
            break
        cur.left -= 1
        p = cur.pos
        b = data[p]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            length, p = _varint(data, p)
        record_end = p + length
        if length < 0 or record_end > cur.end:
            raise ValueError("stored record runs past the end of its batch")
        p += 1  # attributes
        b = data[p]
        if b < 0x80:
            ts_delta = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            ts_delta, p = _varint(data, p)
        b = data[p]
        if b < 0x80:
            offset_delta = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            offset_delta, p = _varint(data, p)
        b = data[p]
        if b < 0x80:
            key_size = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            key_size, p = _varint(data, p)
        key_at = p
        if key_size > 0:
            p += key_size
        b = data[p]
        if b < 0x80:
            value_size = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            value_size, p = _varint(data, p)
        value_at = p
        if value_size > 0:
            p += value_size
        b = data[p]
        if b < 0x80:
            header_count = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            header_count, p = _varint(data, p)
        cur.pos = record_end
        offset = cur.base_offset + offset_delta
        if offset < cur.min_offset:
            continue
        walked += 1  # as slices of decode_from's records: those from min_offset on
        stamp_of_record = cur.base_timestamp + ts_delta if cur.append_time == _NO_TIME else cur.append_time
        raw: bytes | None = None if value_size < 0 else data[value_at : value_at + value_size]
        record: SourceRecord | None = None
        if header_count:
            headers: list[tuple[str, bytes | None]] = []
            for _ in range(header_count):
                name_size, p = _varint(data, p)
                name = data[p : p + max(name_size, 0)]
                p += max(name_size, 0)
                size, p = _varint(data, p)
                headers.append((name.decode("utf-8", "replace"), None if size < 0 else data[p : p + size]))
                p += max(size, 0)
            if p != record_end:
                raise ValueError("stored record's headers do not end where the record does")
            record = SourceRecord(offset, stamp_of_record, None if key_size < 0 else data[key_at : key_at + key_size],
                                  raw, headers)
            if punctuation(record):
                continue
        elif p != record_end:
            raise ValueError("stored record's fields do not end where the record does")
        ts: int
        try:
            value: Any = None
            if raw is not None:
                value = loads(raw)
            stamp = stamp_of_record if event_time is None else event_time(value)
            ts = stamp if type(stamp) is int else int(stamp)
        except Exception as exc:
            if record is None:
                record = SourceRecord(offset, stamp_of_record,
                                      None if key_size < 0 else data[key_at : key_at + key_size], raw, [])
            undecodable(record, exc)
            continue
        decoded += 1
        if ts > max_ts:
            max_ts = ts
        if key_by is None:
            items.append((ts, value))
            continue
        try:
            key = key_by(value)
        except Exception as exc:
            key_failures.append((ts, value, exc))
            continue
        items.append((ts, key, value))
    return items, decoded, max_ts


# how tumbling_items adds a value to a window's accumulator (processors.aggregations)
ADD_CALL: Final = 0  # the aggregation's add(acc, value)
ADD_MEAN: Final = 1  # Mean(field) with a field name: acc is [sum, count]
ADD_SUM: Final = 2  # Sum(field) with a field name
ADD_COUNT: Final = 3  # Count()


def tumbling_items(
    items: list[tuple[int, Hashable, Any]],
    logics: dict[Hashable, Any],
    add: Callable[[Any, Any], Any],
    how: int,
    field: str,
    size: int,
    offset: int,
    watermark: int,
    slow: Callable[[int, Hashable, Any], None],
    errors: list[tuple[int, Any, str]],
    dirty: set[Hashable] | None,
) -> None:
    """Each item into its key's tumbling window when that window is open and has not fired (the
    aggregation's ``add``, or what it does spelled out here per ``how``; ``dirty`` gets the key
    under an early trigger); any other item (a new key, a new window, a fired or late one) to
    ``slow(ts, key, value)``, the general path. An add that fails leaves the window as it was and
    appends ``(ts, value, repr(error))`` to ``errors``: a spelled-out add that raises is done again by
    ``add``, so the error is the aggregation's own. A window slot is ``[end, acc, fired, count,
    emitted]`` (``processors.windows``)."""
    for ts, key, value in items:
        logic = logics.get(key)
        if logic is not None:
            slot: list[Any] | None = logic.windows.get(ts - (ts - offset) % size)
            if slot is not None and not slot[2] and watermark < slot[0] - 1:
                try:
                    if how == ADD_MEAN:
                        acc: list[Any] = slot[1]
                        acc[0] += value[field]
                        acc[1] += 1
                    elif how == ADD_SUM:
                        slot[1] = slot[1] + value[field]
                    elif how == ADD_COUNT:
                        slot[1] = slot[1] + 1
                    else:
                        slot[1] = add(slot[1], value)
                except Exception:
                    try:
                        slot[1] = add(slot[1], value)
                    except Exception as exc:
                        errors.append((ts, value, repr(exc)))
                        continue
                slot[3] += 1
                if dirty is not None:
                    dirty.add(key)
                continue
        slow(ts, key, value)
