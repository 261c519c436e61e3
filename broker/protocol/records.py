"""Kafka RecordBatch v2 (magic 2): the unit Sluice stores and serves.

Sans-IO: bytes in, frozen dataclasses out, and back. Layout (big-endian)::

    offset  size  field
    0       8     base_offset          (not covered by the CRC: the broker rewrites it)
    8       4     batch_length         (bytes after this field)
    12      4     partition_leader_epoch
    16      1     magic = 2
    17      4     crc                  CRC32C of bytes 21..end
    21      2     attributes           bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control
    23      4     last_offset_delta
    27      8     base_timestamp
    35      8     max_timestamp
    43      8     producer_id
    51      2     producer_epoch
    53      4     base_sequence
    57      4     record_count
    61      ...   records (possibly compressed)

Each record: length varint, attributes int8, timestamp_delta varlong, offset_delta varint,
key (varint length, -1 = null), value (same), header count varint, headers (key string, value bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import crc32c

from broker.errors import CorruptRecordError, UnsupportedMagicError
from broker.protocol.compression import DEFAULT_DECOMPRESS_LIMIT, Compression, compress, decompress

__all__ = [
    "BATCH_HEADER_SIZE",
    "BatchHeader",
    "Compression",
    "Headers",
    "Record",
    "RecordSpec",
    "decode_all",
    "decode_header",
    "decode_records",
    "RecordTuple",
    "encode_batch",
    "encode_headers",
    "encode_key",
    "encode_record_tuples",
    "recompress_batches",
    "stamp_log_append_time",
    "record_keys",
    "reencode_batch",
    "iter_batches",
    "split_complete_batches",
    "unpack_header",
    "verify_batch",
    "with_base_offset",
]

BATCH_HEADER_SIZE = 61
# Fields before batch_length (base_offset + batch_length) are not counted in batch_length.
LOG_OVERHEAD = 12
CRC_START = 21
MAGIC_V2 = 2

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
# The header split at the CRC field: what comes before it, and what the CRC covers.
_BEFORE_CRC = struct.Struct(">qiibI")
_AFTER_CRC = struct.Struct(">hiqqqhii")

ATTR_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


class BatchHeader(NamedTuple):
    """The 61-byte header of a RecordBatch v2, field by field as on the wire.

    A NamedTuple rather than the frozen dataclass of the other frames: it is built for every batch a
    Produce stores and a Fetch or a scan reads, and a frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field) took 3.9 µs against 1.1 (bench/RESULTS.md). Immutable all the same;
    ``_replace`` where a dataclass would use ``dataclasses.replace``."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> Compression:
        codec = self.attributes & ATTR_COMPRESSION_MASK
        if codec > Compression.ZSTD:
            raise CorruptRecordError(f"record batch names unknown compression codec {codec}")
        return Compression(codec)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """A record to be encoded: what a producer or ingester supplies."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int | None = None  # ms since the epoch; None = the batch's timestamp


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


# ---------------------------------------------------------------- varints


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _encode_varint_slow(n: int) -> bytes:
    v = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# Pre-encoded varints for -8192..8191: covers record lengths, deltas and field sizes of typical
# device records, so the hot path is one table lookup instead of a Python loop.
_SMALL_VARINT_LIMIT = 8192
_SMALL_VARINTS = [_encode_varint_slow(n) for n in range(-_SMALL_VARINT_LIMIT, _SMALL_VARINT_LIMIT)]


def _varint(n: int) -> bytes:
    if -_SMALL_VARINT_LIMIT <= n < _SMALL_VARINT_LIMIT:
        return _SMALL_VARINTS[n + _SMALL_VARINT_LIMIT]
    return _encode_varint_slow(n)


_ONE_BYTE_VARINTS = [(b >> 1) ^ -(b & 1) for b in range(0x80)]


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    if pos < len(buf) and buf[pos] < 0x80:  # the common case: one byte
        return _ONE_BYTE_VARINTS[buf[pos]], pos + 1
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError("truncated varint in record")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    first = buf[pos] if pos < len(buf) else 0x80
    if first < 0x80:
        length = _ONE_BYTE_VARINTS[first]
        pos += 1
    else:
        length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(buf):
        raise CorruptRecordError("record field runs past the end of the batch")
    return buf[pos:end], end


# ---------------------------------------------------------------- encode


def encode_batch(
    records: Sequence[RecordSpec],
    *,
    base_offset: int = 0,
    timestamp: int | None = None,
    compression: Compression = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = 0,
) -> bytes:
    """Build one RecordBatch v2 holding ``records`` (at least one)."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    if timestamp is None:
        import time

        timestamp = int(time.time() * 1000)
    stamps = [r.timestamp if r.timestamp is not None else timestamp for r in records]
    base_ts = min(stamps)
    body = bytearray()
    varint = _varint
    null = _varint(-1)
    for delta, (rec, ts) in enumerate(zip(records, stamps, strict=True)):
        key, value = rec.key, rec.value
        inner = b"".join(
            (
                b"\x00",  # attributes
                varint(ts - base_ts),
                varint(delta),
                null if key is None else varint(len(key)) + key,
                null if value is None else varint(len(value)) + value,
                varint(len(rec.headers)),
                *(_encode_header(hkey, hvalue) for hkey, hvalue in rec.headers),
            )
        )
        body += varint(len(inner))
        body += inner
    payload = compress(compression, bytes(body))
    attributes = int(compression)
    after_crc = _AFTER_CRC.pack(
        attributes, len(records) - 1, base_ts, max(stamps), producer_id, producer_epoch, base_sequence, len(records)
    ) + payload
    crc = crc32c.crc32c(after_crc)
    batch_length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(payload)
    return _BEFORE_CRC.pack(base_offset, batch_length, partition_leader_epoch, MAGIC_V2, crc) + after_crc


Headers = tuple[tuple[str, bytes | None], ...]
# (value, key, headers, timestamp ms): RecordSpec's fields as a plain tuple, for hot paths that
# build thousands of records per call and should not pay for a dataclass each.
RecordTuple = tuple[bytes | None, bytes | None, Headers, int]


def encode_record_tuples(
    records: Sequence[RecordTuple], *, base_offset: int = 0, header_cache: dict[Headers, bytes] | None = None
) -> bytes:
    """The same bytes as ``encode_batch([RecordSpec(v, k, h, ts) ...], base_offset=...)``, faster.

    Uncompressed, no producer id, every record with its own timestamp. Faster because it joins all
    the pieces once instead of per record, inlines the small-varint table lookup, and encodes each
    distinct headers tuple once per call (ingest records of one device share theirs).
    ``header_cache`` (headers -> encoded bytes, owned by the caller, who bounds it) carries those
    encodings across calls, for callers whose devices repeat from one call to the next.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    stamps = [rec[3] for rec in records]
    base_ts = min(stamps)
    small = _SMALL_VARINTS
    lim = _SMALL_VARINT_LIMIT
    null = small[lim - 1]
    # Keyed by id(): the tuples stay alive (referenced by ``records``) for the whole call.
    encoded_headers: dict[int, bytes] = {}
    parts: list[bytes] = []
    extend = parts.extend
    for delta, (value, key, headers, ts) in enumerate(records):
        hbytes = encoded_headers.get(id(headers))
        if hbytes is None:
            hbytes = header_cache.get(headers) if header_cache is not None else None
            if hbytes is None:
                hbytes = _encode_headers(headers)
                if header_cache is not None:
                    header_cache[headers] = hbytes
            encoded_headers[id(headers)] = hbytes
        ts_delta = ts - base_ts
        tsv = small[ts_delta + lim] if ts_delta < lim else _encode_varint_slow(ts_delta)
        dv = small[delta + lim] if delta < lim else _encode_varint_slow(delta)
        if key is None:
            kv, key = null, b""
        else:
            n = len(key)
            kv = small[n + lim] if n < lim else _encode_varint_slow(n)
        if value is None:
            vv, value = null, b""
        else:
            n = len(value)
            vv = small[n + lim] if n < lim else _encode_varint_slow(n)
        size = 1 + len(tsv) + len(dv) + len(kv) + len(key) + len(vv) + len(value) + len(hbytes)
        sv = small[size + lim] if size < lim else _encode_varint_slow(size)
        extend((sv, b"\x00", tsv, dv, kv, key, vv, value, hbytes))  # \x00: attributes
    payload = b"".join(parts)
    after_crc = _AFTER_CRC.pack(0, len(records) - 1, base_ts, max(stamps), -1, -1, -1, len(records)) + payload
    batch_length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(payload)
    return _BEFORE_CRC.pack(base_offset, batch_length, 0, MAGIC_V2, crc32c.crc32c(after_crc)) + after_crc


def encode_key(key: bytes | None) -> bytes:
    """A record key as it sits in a record: its varint length, then the bytes (-1 for none)."""
    return _varint(-1) if key is None else _varint(len(key)) + key


def encode_headers(headers: Headers) -> bytes:
    """Record headers as they sit in a record (their count, then each header)."""
    return _encode_headers(headers)


def _encode_headers(headers: Headers) -> bytes:
    return _varint(len(headers)) + b"".join([_encode_header(hkey, hvalue) for hkey, hvalue in headers])


def _encode_header(key: str, value: bytes | None) -> bytes:
    raw_key = key.encode()
    encoded_value = _varint(-1) if value is None else _varint(len(value)) + value
    return _varint(len(raw_key)) + raw_key + encoded_value


# ---------------------------------------------------------------- decode


def unpack_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """The 61 header bytes at ``pos`` as they are, nothing checked (for validators that decide
    themselves which rule a bad field breaks)."""
    return BatchHeader._make(_HEADER.unpack_from(buf, pos))


def decode_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the 61-byte header at ``pos``; checks magic and lengths but not the CRC."""
    if len(buf) - pos < BATCH_HEADER_SIZE:
        if len(buf) - pos >= 17 and buf[pos + 16] != MAGIC_V2:
            raise UnsupportedMagicError(f"record batch magic {buf[pos + 16]} is not supported (need 2)")
        raise CorruptRecordError(
            f"truncated record batch: {len(buf) - pos} bytes, a header needs {BATCH_HEADER_SIZE}"
        )
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC_V2:
        raise UnsupportedMagicError(f"record batch magic {header.magic} is not supported (need 2)")
    if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"record batch length {header.batch_length} is shorter than its header")
    if header.record_count < 0 or header.last_offset_delta < 0:
        raise CorruptRecordError("record batch has a negative record count or offset delta")
    return header


def verify_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos`` and check that the whole batch is present and its CRC matches."""
    header = decode_header(buf, pos)
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError(
            f"truncated record batch: header says {header.size} bytes, {len(buf) - pos} present"
        )
    actual = crc32c.crc32c(buf[pos + CRC_START : end])
    if actual != header.crc:
        raise CorruptRecordError(
            f"record batch CRC mismatch at base offset {header.base_offset}: "
            f"stored {header.crc:#010x}, computed {actual:#010x}"
        )
    return header


def iter_batches(buf: bytes | memoryview, *, verify: bool = True) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each batch in ``buf``; raises on anything malformed."""
    pos = 0
    check = verify_batch if verify else decode_header
    while pos < len(buf):
        header = check(buf, pos)
        if pos + header.size > len(buf):
            raise CorruptRecordError("truncated record batch at the end of the buffer")
        yield pos, header
        pos += header.size


def split_complete_batches(buf: bytes | memoryview) -> tuple[list[BatchHeader], int]:
    """Headers of the complete batches at the start of ``buf`` and the byte count they cover.

    Used on fetch responses, where the last batch may be cut short by max_bytes.
    """
    headers: list[BatchHeader] = []
    pos = 0
    while len(buf) - pos >= BATCH_HEADER_SIZE:
        header = decode_header(buf, pos)
        if pos + header.size > len(buf):
            break
        headers.append(header)
        pos += header.size
    return headers, pos


def with_base_offset(batch: bytes | bytearray | memoryview, base_offset: int) -> bytearray:
    """A copy of ``batch`` whose base offset is rewritten (outside the CRC, so it stays valid)."""
    out = bytearray(batch)
    _BASE_OFFSET.pack_into(out, 0, base_offset)
    return out


def decode_records(
    batch: bytes | bytearray | memoryview, header: BatchHeader | None = None, *, limit: int = DEFAULT_DECOMPRESS_LIMIT
) -> list[Record]:
    """Decode every record of one batch (decompressing if needed); control batches give none.

    A compressed payload that would decompress to more than ``limit`` bytes raises
    ``RecordTooLargeError`` before that much memory is taken."""
    if header is None:
        header = verify_batch(batch)
    if header.is_control:
        return []
    payload = bytes(memoryview(batch)[BATCH_HEADER_SIZE : header.size])  # indexing bytes is fastest
    if header.compression is not Compression.NONE:
        payload = decompress(header.compression, payload, limit)
    records: list[Record] = []
    pos = 0
    read_varint, read_bytes = _read_varint, _read_bytes
    log_append_time = header.attributes & ATTR_LOG_APPEND_TIME
    for _ in range(header.record_count):
        length, pos = read_varint(payload, pos)
        end = pos + length
        if length < 0 or end > len(payload):
            raise CorruptRecordError("record length runs past the end of the batch")
        pos += 1  # attributes, unused in v2
        ts_delta, pos = read_varint(payload, pos)
        offset_delta, pos = read_varint(payload, pos)
        key, pos = read_bytes(payload, pos)
        value, pos = read_bytes(payload, pos)
        count, pos = read_varint(payload, pos)
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(count):
            hkey, pos = read_bytes(payload, pos)
            hvalue, pos = read_bytes(payload, pos)
            headers.append(((hkey or b"").decode("utf-8", "replace"), hvalue))
        if pos != end:
            raise CorruptRecordError("record length does not match its fields")
        timestamp = header.max_timestamp if log_append_time else header.base_timestamp + ts_delta
        records.append(Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers)))
    return records


def record_keys(
    batch: bytes | bytearray | memoryview, header: BatchHeader, *, limit: int = DEFAULT_DECOMPRESS_LIMIT
) -> list[tuple[int, bytes | None, bool]]:
    """``(offset, key, is_tombstone)`` of every record of one batch: what the log cleaner needs, read
    without building records (values and headers are skipped, not copied). Control batches give none."""
    if header.is_control:
        return []
    payload = bytes(memoryview(batch)[BATCH_HEADER_SIZE : header.size])
    if header.compression is not Compression.NONE:
        payload = decompress(header.compression, payload, limit)
    out: list[tuple[int, bytes | None, bool]] = []
    append = out.append
    pos = 0
    size = len(payload)
    read_varint, one = _read_varint, _ONE_BYTE_VARINTS
    base = header.base_offset
    try:
        for _ in range(header.record_count):
            # one-byte varints inline (the common case); _read_varint for the rest
            b = payload[pos]
            length, pos = (one[b], pos + 1) if b < 0x80 else read_varint(payload, pos)
            end = pos + length
            if length < 0 or end > size:
                raise CorruptRecordError("record length runs past the end of the batch")
            pos += 1  # attributes
            pos = pos + 1 if payload[pos] < 0x80 else read_varint(payload, pos)[1]  # timestamp delta
            b = payload[pos]
            delta, pos = (one[b], pos + 1) if b < 0x80 else read_varint(payload, pos)
            b = payload[pos]
            key_length, pos = (one[b], pos + 1) if b < 0x80 else read_varint(payload, pos)
            key = None if key_length < 0 else payload[pos : pos + key_length]
            pos += max(key_length, 0)
            append((base + delta, key, payload[pos] == 0x01))  # zigzag(-1) = 0x01: a null value
            pos = end
    except IndexError:
        raise CorruptRecordError("record runs past the end of the batch") from None
    return out


def decode_all(buf: bytes | memoryview) -> list[Record]:
    """Every record in a buffer of whole batches (a partial batch at the end is ignored)."""
    headers, _ = split_complete_batches(buf)
    out: list[Record] = []
    pos = 0
    view = memoryview(buf)
    for header in headers:
        out.extend(decode_records(view[pos : pos + header.size], header))
        pos += header.size
    return out


def reencode_batch(
    header: BatchHeader, records: Sequence[Record], *, compression: Compression | None = None
) -> bytes:
    """A batch with ``header``'s offsets, producer fields and attributes holding only ``records``
    (each keeping its own offset and timestamp), compressed with ``compression`` (default: as before).

    For the log cleaner (records dropped, offsets kept: the batch still spans base..last offset, so
    the log stays dense and consumers skip the gaps) and for ``compression.type`` (same records, another
    codec). No records gives an empty batch, which Kafka clients step over."""
    codec = header.compression if compression is None else compression
    base_ts = header.base_timestamp
    body = bytearray()
    for rec in records:
        key, value = rec.key, rec.value
        inner = b"".join((
            b"\x00",
            _varint(rec.timestamp - base_ts),
            _varint(rec.offset - header.base_offset),
            _varint(-1) if key is None else _varint(len(key)) + key,
            _varint(-1) if value is None else _varint(len(value)) + value,
            _varint(len(rec.headers)),
            *(_encode_header(hkey, hvalue) for hkey, hvalue in rec.headers),
        ))
        body += _varint(len(inner))
        body += inner
    payload = compress(codec, bytes(body)) if records else b""
    attributes = (header.attributes & ~ATTR_COMPRESSION_MASK) | (int(codec) if records else 0)
    if header.attributes & ATTR_LOG_APPEND_TIME or not records:
        max_ts = header.max_timestamp
    else:
        max_ts = max(rec.timestamp for rec in records)
    after_crc = _AFTER_CRC.pack(attributes, header.last_offset_delta, base_ts, max_ts, header.producer_id,
                                header.producer_epoch, header.base_sequence, len(records)) + payload
    batch_length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(payload)
    return _BEFORE_CRC.pack(header.base_offset, batch_length, header.partition_leader_epoch, MAGIC_V2,
                            crc32c.crc32c(after_crc)) + after_crc


def recompress_batches(
    buf: bytes | bytearray | memoryview, codec: Compression
) -> bytes | bytearray | memoryview:
    """``buf`` with every data batch compressed with ``codec`` (a topic's ``compression.type``); batches
    already in it, and control batches, are kept byte for byte. CRCs are checked before rewriting."""
    view = memoryview(buf)
    parts: list[bytes | memoryview] = []
    changed = False
    for pos, header in iter_batches(view):
        batch = view[pos : pos + header.size]
        if header.is_control or header.compression is codec:
            parts.append(batch)
            continue
        parts.append(reencode_batch(header, decode_records(batch, header), compression=codec))
        changed = True
    return b"".join(parts) if changed else buf


_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMP = struct.Struct(">q")
_U32_CRC = struct.Struct(">I")
_ATTRIBUTES_AT, _MAX_TIMESTAMP_AT, _CRC_AT = 21, 35, 17


def stamp_log_append_time(batch: bytearray, now_ms: int) -> None:
    """Mark a stored batch LogAppendTime with ``now_ms`` (in place, CRC recomputed), as Kafka does for a
    topic with ``message.timestamp.type=LogAppendTime``: the timestamp-type bit and max_timestamp change,
    the records keep their own create times, which consumers then ignore."""
    (attributes,) = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)
    _ATTRIBUTES.pack_into(batch, _ATTRIBUTES_AT, attributes | ATTR_LOG_APPEND_TIME)
    _TIMESTAMP.pack_into(batch, _MAX_TIMESTAMP_AT, now_ms)
    _U32_CRC.pack_into(batch, _CRC_AT, crc32c.crc32c(memoryview(batch)[CRC_START:]))
