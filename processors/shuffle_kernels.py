"""The repartition topic's per-record loops: items into RecordBatches, fetched records into items.

``write_items`` is the upstream stage's loop (``processors.repartition``): it keys each item, picks
its repartition partition, numbers it and appends it, encoded as a Kafka v2 record, to that
partition's ``RecordsBuilder``; a builder grown past ``BATCH_BYTES`` is finished there and then.
The stage hands finished records to the sink as an ``executor.OutBatch``, which it sends as one
RecordBatch (``processors.kafka``), so no client object is made per record. ``read_records`` is the
downstream stage's loop: the sequence header, the duplicate check, the key and the value of each fetched record.
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
    "read_records",
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


def _small(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < _SMALL_LIMIT else _varint(n)


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
        tsv = self._delta(ts)
        dv = _small(self.count)
        n = len(value)
        vv = _small(n)
        digits = str(seq).encode()
        header_len = len(origin) + len(digits)
        hv = _small(header_len)
        size = 1 + len(tsv) + len(dv) + len(key) + len(vv) + n + len(_SEQ_HEAD) + len(hv) + header_len
        buf = self.buf
        buf += _small(size)
        buf += _ZERO
        buf += tsv
        buf += dv
        buf += key
        buf += vv
        buf += value
        buf += _SEQ_HEAD
        buf += hv
        buf += origin
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
        builder.add_keyed(placed[0], raw, ts, origin, seq)
        if len(builder.buf) >= BATCH_BYTES:
            batch = builder.finish()
            if batch is not None:
                batches.append(batch)


def read_records(
    records: Sequence[Any],
    seqs: dict[str, int],
    origins: dict[bytes, str],
    keys: dict[bytes, Any],
    decode_key: Callable[[bytes], Any],
    loads: Callable[[bytes], Any],
    marks: list[Any],
    bad: list[tuple[Any, Exception]],
) -> tuple[list[tuple[int, Any, Any]], int]:
    """The keyed items ``(ts, key, value)`` of fetched repartition records and how many were
    duplicates (a sequence number at or below the highest seen from its origin, in ``seqs``, which
    is updated). Marks are collected into ``marks`` for the caller; records that cannot be read go to
    ``bad`` as ``(record, exception)``. ``origins`` and ``keys`` cache decoded origins and keys
    (cleared at 100,000 entries)."""
    items: list[tuple[int, Any, Any]] = []
    duplicates = 0
    last_origin = ""  # the origin of the previous record (when have_origin) and its highest number
    have_origin = False
    last_seq = -1
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
            prefix = raw_seq[:colon]
            origin = origins.get(prefix)
            if origin is None:
                origin = prefix.decode()
                if len(origins) >= 100_000:
                    origins.clear()
                origins[prefix] = origin
            seq = int(raw_seq[colon + 1 :])
            if not have_origin or origin != last_origin:
                if have_origin:
                    seqs[last_origin] = last_seq
                have_origin = True
                last_origin = origin
                last_seq = seqs.get(origin, -1)
            if seq <= last_seq:
                duplicates += 1  # written again by a replaying upstream instance
                continue
            raw_key: bytes = r.key or b"null"
            key = keys.get(raw_key)
            if key is None:
                key = decode_key(raw_key)
                if len(keys) >= 100_000:
                    keys.clear()
                keys[raw_key] = key
            raw_value: bytes | None = r.value
            items.append((r.timestamp, key, None if raw_value is None else loads(raw_value)))
            last_seq = seq
        except Exception as exc:
            bad.append((r, exc))
    if have_origin:
        seqs[last_origin] = last_seq
    return items, duplicates
