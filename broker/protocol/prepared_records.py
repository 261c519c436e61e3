"""RecordBatch v2 encoding of records whose key and headers were encoded once for many records.

A ``PreparedRecord`` is ``(value, encoded key, encoded headers, timestamp ms)``: the key as it sits in
a record (varint length, then the bytes; ``records.encode_key``) and the headers likewise
(``records.encode_headers``). Ingest lines of one device share both, so per record only the lengths,
the two deltas and the value are left to write. ``encode_prepared_records`` gives the same bytes as
``records.encode_record_tuples`` for the same records (uncompressed, no producer id, CreateTime;
tests/ingest/test_line_routes.py checks it).

This module is compiled with mypyc where a compiler is available (``native-modules.txt``; the sink
picks the build through ``broker.native.select``): the record loop runs at C speed.
Keep it to what mypyc compiles well: typed locals, ``bytes``/``bytearray``/``int`` work, no closures.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

import crc32c

__all__ = ["PreparedRecord", "encode_prepared_records"]

PreparedRecord = tuple[bytes, bytes, bytes, int]

_BEFORE_CRC: Final = struct.Struct(">qiibI")  # base offset, batch length, leader epoch, magic, CRC
_AFTER_CRC: Final = struct.Struct(">hiqqqhii")  # attributes … record count: what the CRC covers
_BATCH_HEADER_SIZE: Final = 61
_LOG_OVERHEAD: Final = 12  # base offset and batch length are not counted in the batch length
_MAGIC_V2: Final = 2


def _slow_varint(n: int) -> bytes:
    """``n`` (non-negative: a length or a delta) as a zigzag varint."""
    v = n << 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL_LIMIT: Final = 16384  # varints of 0 .. _SMALL_LIMIT - 1, looked up instead of computed
_SMALL: Final = [_slow_varint(n) for n in range(_SMALL_LIMIT)]


def encode_prepared_records(records: Sequence[PreparedRecord], *, base_offset: int = 0) -> bytes:
    """One RecordBatch holding ``records`` in order (see the module docstring)."""
    count = len(records)
    if count == 0:
        raise ValueError("a record batch needs at least one record")
    base_ts = records[0][3]
    max_ts = base_ts
    for i in range(1, count):
        ts = records[i][3]
        if ts < base_ts:
            base_ts = ts
        if ts > max_ts:
            max_ts = ts
    small = _SMALL
    parts: list[bytes] = []
    for delta in range(count):
        value, key, headers, ts = records[delta]
        ts_delta = ts - base_ts
        tsv = small[ts_delta] if ts_delta < _SMALL_LIMIT else _slow_varint(ts_delta)
        dv = small[delta] if delta < _SMALL_LIMIT else _slow_varint(delta)
        n = len(value)
        vv = small[n] if n < _SMALL_LIMIT else _slow_varint(n)
        size = 1 + len(tsv) + len(dv) + len(key) + len(vv) + n + len(headers)
        parts.append(small[size] if size < _SMALL_LIMIT else _slow_varint(size))
        parts.append(b"\x00")  # attributes
        parts.append(tsv)
        parts.append(dv)
        parts.append(key)
        parts.append(vv)
        parts.append(value)
        parts.append(headers)
    payload = b"".join(parts)
    after_crc = _AFTER_CRC.pack(0, count - 1, base_ts, max_ts, -1, -1, -1, count) + payload
    batch_length = _BATCH_HEADER_SIZE - _LOG_OVERHEAD + len(payload)
    head = _BEFORE_CRC.pack(base_offset, batch_length, 0, _MAGIC_V2, crc32c.crc32c(after_crc))
    return head + after_crc
