"""The per-record part of Produce validation: walk a RecordBatch v2 payload as Kafka reads it.

``walk_records`` checks that ``count`` records tile ``buf[pos:end]`` exactly, each field inside its
record, offset deltas 0, 1, 2, …, and reports the largest timestamp delta and the records without a
key. It reads only lengths and varints: no value, key or header is materialised or copied.
``walk_piece`` is the same walk over a piece of a batch (a batch that is not ``bytes`` is copied in
pieces that land on warm memory, see ``batch_validation``), ``finish_walk`` its checks at the end.

The rules are Kafka's ``DefaultRecord.readFrom`` (what ``LogValidator`` runs on every record of a
produced batch): a record's body length is a varint (32-bit, at most 5 bytes); then one attributes
byte, the timestamp delta (varlong, at most 10 bytes), the offset delta, key and value lengths
(negative = null, any negative), the header count (negative is refused), each header's key length
(negative is refused) and value length; and what was read must be exactly the body length. Every
failure is ``InvalidRecordError`` naming the record (INVALID_RECORD, as Kafka's
``InvalidRecordException("Found invalid record structure")``).

This module is compiled with mypyc where a compiler is available (``setup.py``'s ``NATIVE_MODULES``;
``broker.native`` picks the build): the same source, so the same verdicts, at C speed
(``python -m bench.bench_records``). Keep it to what mypyc compiles well: typed locals, ``bytes``
indexing, no closures or generators in the loop.
"""

from __future__ import annotations

from typing import Final

from broker.errors import CorruptRecordError, InvalidRecordError

__all__ = ["LONGEST_DELTA", "finish_walk", "walk_piece", "walk_records"]

_MIN_RECORD_BODY: Final = 6  # attributes, timestamp delta, offset delta, key, value, header count
LONGEST_DELTA: Final = -(1 << 63)  # below any timestamp delta: the start of the running maximum


def _record_error(index: int, reason: str) -> InvalidRecordError:
    return InvalidRecordError(f"One or more records have been rejected: record {index}: {reason}", ((index, reason),))


def _read_varlong(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint of up to 10 bytes (Kafka's readVarlong: the timestamp delta)."""
    shift = 0
    result = 0
    while True:
        b = buf[pos]  # IndexError past the end: the caller reports a truncated record
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varlong longer than 10 bytes")


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint of a 32-bit field: at most 5 bytes, as Kafka's readVarint."""
    shift = 0
    result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            result &= 0xFFFFFFFF  # Java's int: bits of a 5th byte past bit 31 are dropped
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 28:
            raise CorruptRecordError("varint longer than 5 bytes")


def _skip_headers(buf: bytes, p: int, record_end: int, index: int) -> int:
    count, p = _read_varint(buf, p)
    if count < 0:
        raise _record_error(index, f"invalid header count {count}")
    for _ in range(count):
        if p >= record_end:
            raise _record_error(index, f"{count} headers do not fit in the record")
        key_size, p = _read_varint(buf, p)
        if key_size < 0:
            raise _record_error(index, f"invalid negative header key size {key_size}")
        p += key_size
        value_size, p = _read_varint(buf, p)
        if value_size > 0:
            p += value_size
    return p


def walk_records(buf: bytes, pos: int, end: int, count: int, keys: bool = True) -> tuple[int, list[int]]:
    """Walk ``count`` records in ``buf[pos:end]``; return the largest timestamp delta and the indexes
    of records without a key (only with ``keys``: a compacted topic's rule; collecting them cost ~20 ns
    per keyless record), or raise ``InvalidRecordError`` naming the record at fault (offset deltas out
    of order: every such record named)."""
    null_keys: list[int] = []
    bad_offsets: list[tuple[int, str]] = []
    i, pos, max_delta, _need = walk_piece(buf, pos, end, count, 0, LONGEST_DELTA, null_keys, bad_offsets, keys)
    finish_walk(pos, end, count, bad_offsets)
    return max_delta, null_keys


def finish_walk(pos: int, end: int, count: int, bad_offsets: list[tuple[int, str]]) -> None:
    """The checks after the last record: the records end where the batch ends, offset deltas in order."""
    if pos != end:
        raise InvalidRecordError(f"record batch declares {count} records but {end - pos} bytes follow the last of them")
    if bad_offsets:
        raise InvalidRecordError(
            f"One or more records have been rejected: {len(bad_offsets)} records with offset deltas that do "
            f"not follow 0, 1, 2, … (first: record {bad_offsets[0][0]}, {bad_offsets[0][1]})",
            tuple(bad_offsets),
        )


def walk_piece(
    buf: bytes, pos: int, end: int, count: int, i: int, max_delta: int, null_keys: list[int],
    bad_offsets: list[tuple[int, str]], keys: bool = True,
) -> tuple[int, int, int, int]:
    """Walk records ``i``, ``i + 1``, … (up to ``count``) from ``buf[pos:]``, the batch ending at ``end``.

    ``buf`` may hold only a piece of the batch (``len(buf) < end``: the caller copies a batch that is
    not ``bytes`` in pieces): the walk then stops before the first record not wholly in it. Returns the
    next record's index and position, the largest timestamp delta so far and, when a record was too
    long for the piece, its length (else 0). Keyless records (with ``keys``) and offset deltas out of
    order are added to ``null_keys`` and ``bad_offsets``; a record that breaks a rule raises at once."""
    limit = len(buf)
    piece = limit < end
    try:
        while i < count:
            start = pos
            if piece and pos + 5 > limit:  # the length varint may be cut: the next piece starts here
                return i, start, max_delta, 0
            b = buf[pos]
            if b < 0x80:  # one-byte varints are the common case: read inline
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:  # two bytes: records of 64 bytes to 8 KiB, inline too
                v = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (v >> 1) ^ -(v & 1)
                pos += 2
            else:
                length, pos = _read_varint(buf, pos)
            record_end = pos + length
            if length < _MIN_RECORD_BODY or record_end > end:
                raise _record_error(i, f"record length {length} does not fit the {end - pos} bytes left")
            if record_end > limit:  # (only in a piece: end <= limit otherwise)
                return i, start, max_delta, record_end - start
            p = pos + 1  # attributes: one byte, unused in v2
            b = buf[p]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                ts_delta, p = _read_varlong(buf, p)
            if ts_delta > max_delta:
                max_delta = ts_delta
            b = buf[p]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:  # records 64 to 8191 of a batch
                v = (b & 0x7F) | (buf[p + 1] << 7)
                offset_delta = (v >> 1) ^ -(v & 1)
                p += 2
            else:
                offset_delta, p = _read_varint(buf, p)
            if offset_delta != i:
                bad_offsets.append((i, f"offset delta {offset_delta}, expected {i}"))
            b = buf[p]  # key: length (negative = null) and bytes
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                size, p = _read_varint(buf, p)
            if size > 0:
                p += size
            elif size < 0 and keys:
                null_keys.append(i)
            b = buf[p]  # value
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                v = (b & 0x7F) | (buf[p + 1] << 7)
                size = (v >> 1) ^ -(v & 1)
                p += 2
            else:
                size, p = _read_varint(buf, p)
            if size > 0:
                p += size
            if buf[p]:
                p = _skip_headers(buf, p, record_end, i)
            else:
                p += 1
            if p != record_end:
                raise _record_error(i, f"record length {length} does not match its fields ({p - pos} bytes)")
            pos = record_end
            i += 1
    except IndexError:
        raise _record_error(i, "record runs past the end of the batch") from None
    except CorruptRecordError as exc:
        raise _record_error(i, str(exc)) from None
    return i, pos, max_delta, 0
