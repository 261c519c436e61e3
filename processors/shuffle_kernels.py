"""The repartition topic's per-record loops: items into RecordBatches, fetched records into items.

``write_items`` is the upstream stage's loop (``processors.repartition``): it keys each item, picks
its repartition partition, numbers it and appends it, encoded as a Kafka v2 record, to that
partition's ``RecordsBuilder``; a builder grown past ``BATCH_BYTES`` is finished there and then.
The stage hands finished records to the sink as an ``executor.OutBatch``, which it sends as one
RecordBatch (``processors.kafka``), so no client object is made per record. ``read_raw`` is the
downstream stage's loop: the sequence header, the duplicate check (``SeqFilter``), the key and the value
of each fetched record, read where it lies in the fetched bytes (``processors.kafka_records.RawRecords``);
``read_records`` is the same loop over record objects (batches the fetch path hands to aiokafka's parser).
The rules (what a sequence number means, what marks do) belong to ``processors.repartition``; these
loops only apply them.

Compiled with mypyc where a compiler is available (``native-modules.txt``; callers pick the build with
``broker.native.select``); the same source runs as it is otherwise, and
tests/processors/test_shuffle_kernels.py runs both. Keep it to what mypyc compiles well: typed locals,
``bytes``/``bytearray``/``int``/``dict`` work, no closures or generators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = [
    "BATCH_BYTES",
    "HEADER_SHUFFLE_MARK",
    "HEADER_SHUFFLE_SEQ",
    "Finished",
    "RecordsBuilder",
    "prefixed",
    "SeqFilter",
    "decode_raw",
    "read_raw",
    "read_records",
    "skip_records",
    "write_items",
]

HEADER_SHUFFLE_SEQ: Final = "sluice-shuffle-seq"
HEADER_SHUFFLE_MARK: Final = "sluice-shuffle-mark"
# A batch is finished once its records pass this size: well under the 1 MiB max.message.bytes that
# Kafka and Sluice default to, and large enough that per-batch costs vanish.
BATCH_BYTES: Final = 256 * 1024
_SEQ_NAME: Final = HEADER_SHUFFLE_SEQ.encode()
_MARK_NAME: Final = HEADER_SHUFFLE_MARK.encode()


def _varint(n: int) -> bytes:
    """``n`` as Kafka's zigzag varint (signed: timestamp deltas may be negative)."""
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL_LIMIT: Final = 16384  # varints of 0 .. _SMALL_LIMIT - 1, looked up instead of computed
_SMALL: Final = [_varint(n) for n in range(_SMALL_LIMIT)]
_ZERO: Final = b"\x00"  # a record's attributes
_SEQ_HEAD: Final = b"\x02" + _varint(len(_SEQ_NAME)) + _SEQ_NAME  # one header, its name
_MARK_HEAD: Final = b"\x01\x00\x02" + _varint(len(_MARK_NAME)) + _MARK_NAME  # null key, empty value, one header


_ZERO_SMALL: Final = [_ZERO + v for v in _SMALL]  # the attributes byte and a small timestamp delta


def _small(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < _SMALL_LIMIT else _varint(n)


def seq_tails(origin: bytes) -> list[bytes]:
    """The fixed part of a record's ``sluice-shuffle-seq`` header for ``origin``, by the number of digits
    of the sequence number that follows it (index 1..20): the header count, the name, the value's length
    and the origin."""
    return [_SEQ_HEAD + _small(len(origin) + n) + origin for n in range(21)]


def prefixed(raw: bytes) -> bytes:
    """A key as it sits in a record: its length, then its bytes."""
    return _small(len(raw)) + raw


# a finished builder: (partition, records section, record count, base timestamp, max timestamp); the
# stage wraps it into an ``executor.OutBatch`` and the sink adds the batch header
Finished = tuple[int, bytes, int, int, int]


class RecordsBuilder:
    """Records being encoded for one repartition partition (Kafka's v2 record layout)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.buf = bytearray()
        self.count = 0
        self.base_ts = 0
        self.max_ts = 0

    def _delta(self, ts: int) -> bytes:
        if self.count == 0:
            self.base_ts = ts
            self.max_ts = ts
        elif ts > self.max_ts:
            self.max_ts = ts
        return _small(ts - self.base_ts)

    def add_keyed(self, key: bytes, value: bytes, ts: int, origin: bytes, seq: int) -> None:
        """A keyed item (``key`` as ``prefixed`` made it) with its ``sluice-shuffle-seq`` header
        ``<origin><seq>``."""
        self.add_seq(key, value, ts, seq_tails(origin), seq)

    def add_seq(self, key: bytes, value: bytes, ts: int, tails: list[bytes], seq: int) -> None:
        """``add_keyed`` with the header's fixed part looked up: ``tails`` is ``seq_tails(origin)``."""
        if self.count == 0:
            self.base_ts = ts
            self.max_ts = ts
        elif ts > self.max_ts:
            self.max_ts = ts
        delta = ts - self.base_ts
        head = _ZERO_SMALL[delta] if 0 <= delta < _SMALL_LIMIT else _ZERO + _varint(delta)
        dv = _small(self.count)
        n = len(value)
        vv = _small(n)
        digits = str(seq).encode()
        tail = tails[len(digits)]
        size = len(head) + len(dv) + len(key) + len(vv) + n + len(tail) + len(digits)
        buf = self.buf
        buf += _small(size)
        buf += head
        buf += dv
        buf += key
        buf += vv
        buf += value
        buf += tail
        buf += digits
        self.count += 1

    def add_mark(self, mark: bytes, ts: int) -> None:
        """A mark: no key, an empty value, the ``sluice-shuffle-mark`` header."""
        tsv = self._delta(ts)
        dv = _small(self.count)
        mv = _small(len(mark))
        size = 1 + len(tsv) + len(dv) + len(_MARK_HEAD) + len(mv) + len(mark)
        buf = self.buf
        buf += _small(size)
        buf += _ZERO
        buf += tsv
        buf += dv
        buf += _MARK_HEAD
        buf += mv
        buf += mark
        self.count += 1

    def size(self) -> int:
        return len(self.buf)

    def finish(self) -> Finished | None:
        """The records so far (None when there are none); the builder starts afresh."""
        if self.count == 0:
            return None
        batch = (self.partition, bytes(self.buf), self.count, self.base_ts, self.max_ts)
        self.buf = bytearray()
        self.count = 0
        return batch


def write_items(
    items: list[tuple[int, Any]],
    raws: list[bytes | None] | None,
    key_fn: Callable[[Any], Any],
    where: dict[Any, tuple[bytes, int]],
    locate: Callable[[Any], tuple[bytes, int]],
    encode_value: Callable[[Any], bytes],
    builders: list[RecordsBuilder],
    counters: list[int],
    origin: bytes,
    batches: list[Finished],
    failures: list[tuple[int, Any, Exception]],
) -> None:
    """Key, place and number each ``(ts, value)`` item, appending it to its partition's builder.

    ``raws``: the value bytes of each item as they came (forwarded as they are), else each value is
    ``encode_value(value)``. ``locate(key)`` gives the encoded key and its partition; ``where`` caches
    that per hashable key (the key ``prefixed``), cleared at 100,000 keys. ``counters``: the next
    sequence number per partition (of the input partition these items came from, named by ``origin``,
    ``<topic>:<partition>:``).
    Builders that outgrow ``BATCH_BYTES`` are finished into ``batches``; items whose key or value fails
    go to ``failures`` as ``(ts, value, exception)``."""
    tails = seq_tails(origin)
    for i in range(len(items)):
        item = items[i]
        ts: int = item[0]
        value = item[1]
        try:
            key = key_fn(value)
            placed: tuple[bytes, int] | None
            try:
                placed = where.get(key)
            except TypeError:  # not hashable: located each time
                located = locate(key)
                placed = (prefixed(located[0]), located[1])
            else:
                if placed is None:
                    located = locate(key)
                    placed = (prefixed(located[0]), located[1])
                    if len(where) >= 100_000:
                        where.clear()
                    where[key] = placed
            raw: bytes | None = raws[i] if raws is not None else None
            if raw is None:
                raw = encode_value(value)
        except Exception as exc:
            failures.append((ts, value, exc))
            continue
        p = placed[1]
        seq = counters[p]
        counters[p] = seq + 1
        builder = builders[p]
        builder.add_seq(placed[0], raw, ts, tails, seq)
        if len(builder.buf) >= BATCH_BYTES:
            batch = builder.finish()
            if batch is not None:
                batches.append(batch)


def _cached_key(keys: dict[bytes, Any], raw_key: bytes, decode_key: Callable[[bytes], Any]) -> Any:
    key = keys.get(raw_key)
    if key is None:
        key = decode_key(raw_key)
        if len(keys) >= 100_000:
            keys.clear()
        keys[raw_key] = key
    return key


class SeqFilter:
    """The duplicate check over one repartition partition's records, in the order they are read: a
    record is new when its sequence number is above the highest seen from its origin (``seqs``,
    updated as records are accepted; the current origin's number is written back by ``close``).
    ``origins`` caches decoded origins (cleared at 100,000 entries)."""

    def __init__(self, seqs: dict[str, int], origins: dict[bytes, str]) -> None:
        self.seqs = seqs
        self.origins = origins
        self.last_origin = ""  # the origin of the previous record (when have_origin) and its highest number
        self.last_prefix = b""  # (its bytes)
        self.have_origin = False
        self.last_seq = -1

    def fresh(self, prefix: bytes, seq: int) -> bool:
        """Whether ``seq`` from origin ``prefix`` (``<topic>:<partition>``) is above the highest seen;
        ``accept`` records it once the record is read."""
        origin = self.origins.get(prefix)
        if origin is None:
            origin = prefix.decode()
            if len(self.origins) >= 100_000:
                self.origins.clear()
            self.origins[prefix] = origin
        if not self.have_origin or origin != self.last_origin:
            if self.have_origin:
                self.seqs[self.last_origin] = self.last_seq
            self.have_origin = True
            self.last_origin = origin
            self.last_seq = self.seqs.get(origin, -1)
        self.last_prefix = prefix
        return seq > self.last_seq

    def accept(self, seq: int) -> None:
        self.last_seq = seq

    def close(self) -> None:
        if self.have_origin:
            self.seqs[self.last_origin] = self.last_seq


def read_records(
    records: Sequence[Any],
    dedupe: SeqFilter,
    keys: dict[bytes, Any],
    decode_key: Callable[[bytes], Any],
    loads: Callable[[bytes], Any],
    marks: list[Any],
    bad: list[tuple[Any, Exception]],
) -> tuple[list[tuple[int, Any, Any]], int]:
    """The keyed items ``(ts, key, value)`` of fetched repartition records and how many were
    duplicates (a sequence number at or below the highest seen from its origin: ``dedupe``, which
    goes on from one call to the next; its ``close`` ends a partition's reading). Marks are collected
    into ``marks`` for the caller; records that cannot be read go to ``bad`` as ``(record, exception)``.
    ``keys`` caches decoded keys (cleared at 100,000 entries)."""
    items: list[tuple[int, Any, Any]] = []
    duplicates = 0
    for r in records:
        seq_header: bytes | None = None
        is_mark = False
        for header in r.headers:
            name = header[0]
            if name == HEADER_SHUFFLE_SEQ:
                seq_header = header[1]
                break
            if name == HEADER_SHUFFLE_MARK:
                is_mark = True
                break
        if is_mark:
            marks.append(r)
            continue
        if seq_header is None:
            bad.append((r, ValueError(f"a repartition record without a {HEADER_SHUFFLE_SEQ} header")))
            continue
        try:
            raw_seq: bytes = seq_header
            colon = raw_seq.rfind(b":")
            if colon < 0:
                raise ValueError(f"a {HEADER_SHUFFLE_SEQ} header without an origin: {raw_seq!r}")
            seq = int(raw_seq[colon + 1 :])
            if not dedupe.fresh(raw_seq[:colon], seq):
                duplicates += 1  # written again by a replaying upstream instance
                continue
            key = _cached_key(keys, r.key or b"null", decode_key)
            raw_value: bytes | None = r.value
            items.append((r.timestamp, key, None if raw_value is None else loads(raw_value)))
            dedupe.accept(seq)
        except Exception as exc:
            bad.append((r, exc))
    return items, duplicates


# -- raw records sections (processors.kafka_records.RawRecords) --------------------------------------
# A segment: ``count`` records of one v2 batch from byte ``pos`` of ``data``, the first at ``offset``,
# the batch's first timestamp ``base_ts``. Only batches the fetch path has walked get here (every
# record inside its length, offset deltas 0, 1, 2, ...: ``broker.protocol.record_walk``), uncompressed
# and CreateTime, so record i of a segment is at ``offset + i`` and its time is ``base_ts`` + its delta.


def _read_var(data: bytes, p: int) -> tuple[int, int]:
    """A zigzag varint (up to 10 bytes) at ``p``: its value and the position after it."""
    b = data[p]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), p + 1
    result = b & 0x7F
    shift = 7
    p += 1
    while True:
        b = data[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), p
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def skip_records(data: bytes, pos: int, n: int) -> int:
    """The position after the next ``n`` records from ``pos``."""
    for _ in range(n):
        length, pos = _read_var(data, pos)
        pos += length
    return pos


def _full_record(data: bytes, pos: int, offset: int, base_ts: int, make_record: Callable[..., Any]) -> Any:
    """The record at ``pos`` (its length first) as ``make_record(offset, ts, key, value, headers)``."""
    length, p = _read_var(data, pos)
    p += 1  # attributes
    ts_delta, p = _read_var(data, p)
    _, p = _read_var(data, p)  # offset delta
    size, p = _read_var(data, p)
    key: bytes | None = None
    if size >= 0:
        key = data[p : p + size]
        p += size
    size, p = _read_var(data, p)
    value: bytes | None = None
    if size >= 0:
        value = data[p : p + size]
        p += size
    count, p = _read_var(data, p)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        size, p = _read_var(data, p)
        name = data[p : p + size].decode()
        p += size
        size, p = _read_var(data, p)
        header: bytes | None = None
        if size >= 0:
            header = data[p : p + size]
            p += size
        headers.append((name, header))
    return make_record(offset, base_ts + ts_delta, key, value, headers)


def _bytes_record(data: bytes, start: int, end: int, offset: int, base_ts: int, make_record: Callable[..., Any]) -> Any:
    """A record that cannot be read field by field, for a dead letter: its bytes as the value."""
    return make_record(offset, base_ts, None, data[start:end], [])


def decode_raw(data: bytes, pos: int, count: int, offset: int, base_ts: int,
               make_record: Callable[..., Any]) -> list[Any]:
    """The ``count`` records of a segment as ``make_record(offset, ts, key, value, headers)``."""
    out: list[Any] = []
    for i in range(count):
        out.append(_full_record(data, pos, offset + i, base_ts, make_record))
        length, p = _read_var(data, pos)
        pos = p + length
    return out


def _equal_at(data: bytes, at: int, expected: bytes) -> bool:
    """Whether ``data[at:]`` starts with ``expected`` (no slice made)."""
    if at + len(expected) > len(data):
        return False
    for i in range(len(expected)):  # noqa: SIM110 (a loop: mypyc compiles no generator well)
        if data[at + i] != expected[i]:
            return False
    return True


def _digits(data: bytes, start: int, end: int) -> int:
    """``int(data[start:end])`` when it is 1 to 18 ASCII digits, else -1."""
    if end <= start or end - start > 18:
        return -1
    n = 0
    for i in range(start, end):
        b = data[i]
        if b < 0x30 or b > 0x39:
            return -1
        n = n * 10 + (b - 0x30)
    return n


def read_raw(
    data: bytes,
    pos: int,
    count: int,
    offset: int,
    base_ts: int,
    dedupe: SeqFilter,
    keys: dict[bytes, Any],
    decode_key: Callable[[bytes], Any],
    loads: Callable[[bytes], Any],
    make_record: Callable[..., Any],
    marks: list[Any],
    bad: list[tuple[Any, Exception]],
) -> tuple[list[tuple[int, Any, Any]], int, int]:
    """``read_records`` over a segment's bytes: the keyed items of its ``count`` records, how many were
    duplicates, and the position after them. Only marks and records that cannot be read become
    records (``make_record``); every other record is read where it lies."""
    items: list[tuple[int, Any, Any]] = []
    duplicates = 0
    seq_len = len(_SEQ_NAME)
    mark_len = len(_MARK_NAME)
    for i in range(count):
        start = pos
        length, p = _read_var(data, pos)
        pos = p + length
        try:
            p += 1  # attributes
            ts_delta, p = _read_var(data, p)
            _, p = _read_var(data, p)  # offset delta
            key_size, p = _read_var(data, p)
            key_at = p
            if key_size > 0:
                p += key_size
            value_size, p = _read_var(data, p)
            value_at = p
            if value_size > 0:
                p += value_size
            headers, p = _read_var(data, p)
            seq_at = -1  # the sequence header's value
            seq_end = -1
            is_mark = False
            for _ in range(headers):
                size, p = _read_var(data, p)
                name_at = p
                p += size
                header_size, p = _read_var(data, p)
                header_at = p
                if header_size > 0:
                    p += header_size
                if size == seq_len and _equal_at(data, name_at, _SEQ_NAME):
                    if header_size >= 0:
                        seq_at, seq_end = header_at, header_at + header_size
                    break
                if size == mark_len and _equal_at(data, name_at, _MARK_NAME):
                    is_mark = True
                    break
            if p > pos:
                raise ValueError(f"the fields of a record overrun its length ({length} bytes)")
        except (IndexError, ValueError) as exc:
            bad.append((_bytes_record(data, start, pos, offset + i, base_ts, make_record), exc))
            continue
        if is_mark:
            try:
                marks.append(_full_record(data, start, offset + i, base_ts, make_record))
            except Exception as exc:  # a header name that is not UTF-8
                bad.append((_bytes_record(data, start, pos, offset + i, base_ts, make_record), exc))
            continue
        ts = base_ts + ts_delta
        try:
            if seq_at < 0:
                raise ValueError(f"a repartition record without a {HEADER_SHUFFLE_SEQ} header")
            colon = seq_end - 1  # the number's digits end the header: find the colon before them
            while colon >= seq_at and 0x30 <= data[colon] <= 0x39:
                colon -= 1
            seq = _digits(data, colon + 1, seq_end) if colon >= seq_at and data[colon] == 0x3A else -1
            if seq < 0:  # not ``<origin>:<digits>``: read as read_records does (int() or its error)
                raw_seq = data[seq_at:seq_end]
                colon = raw_seq.rfind(b":")
                if colon < 0:
                    raise ValueError(f"a {HEADER_SHUFFLE_SEQ} header without an origin: {raw_seq!r}")
                seq = int(raw_seq[colon + 1 :])
                colon += seq_at
            last = dedupe.last_prefix  # most records come from the origin of the one before: no copy then
            if dedupe.have_origin and colon - seq_at == len(last) and _equal_at(data, seq_at, last):
                fresh = seq > dedupe.last_seq
            else:
                fresh = dedupe.fresh(data[seq_at:colon], seq)
            if not fresh:
                duplicates += 1  # written again by a replaying upstream instance
                continue
            raw_key = data[key_at : key_at + key_size] if key_size > 0 else b"null"
            key = _cached_key(keys, raw_key, decode_key)
            value = None if value_size < 0 else loads(data[value_at : value_at + value_size])
            items.append((ts, key, value))
            dedupe.accept(seq)
        except Exception as exc:
            try:
                record = _full_record(data, start, offset + i, base_ts, make_record)
            except Exception:  # a header name that is not UTF-8
                record = _bytes_record(data, start, pos, offset + i, base_ts, make_record)
            bad.append((record, exc))
    return items, duplicates, pos
