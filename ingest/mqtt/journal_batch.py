"""The session journal's RecordBatch v2 encoder (``journal.py``): its records are simple (a key, a value
or a tombstone, no headers, one timestamp per batch) and it writes two or three per message delivered to
a persistent session, so it frames them itself rather than through the generic ``encode_batch`` (a
``RecordSpec`` and a join per record, the largest cost of durable QoS 1 delivery in bench_mqtt_durable's
profile). Gives the bytes ``records.encode_batch`` gives for the same records (tests/ingest/mqtt/
test_journal_batch.py).

Compiled with mypyc where a compiler is available (``native-modules.txt``; ``journal.py`` picks the build
through ``broker.native.select``). Keep it to what mypyc compiles well: typed locals, no closures.
"""

from __future__ import annotations

import struct
from typing import Final

import crc32c

__all__ = ["encode_journal_batch"]

_BEFORE_CRC: Final = struct.Struct(">qiibI")  # base offset, batch length, leader epoch, magic, CRC
_AFTER_CRC: Final = struct.Struct(">hiqqqhii")  # attributes … record count: what the CRC covers


def _zigzag(n: int) -> bytes:
    v = n << 1 if n >= 0 else ((-n) << 1) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_LIMIT: Final = 1 << 14
_VARINTS: Final = [_zigzag(n) for n in range(_LIMIT)]  # lengths and deltas below 16 KiB: a lookup
_NULL: Final = _zigzag(-1)


def encode_journal_batch(records: list[tuple[bytes, bytes | None]], timestamp_ms: int) -> bytes:
    """One uncompressed RecordBatch v2 (base offset 0, no producer) of ``(key, value)`` records, value None
    for a tombstone, all stamped ``timestamp_ms``: the bytes ``encode_batch`` gives for the same records."""
    small = _VARINTS
    parts: list[bytes] = []
    count = len(records)
    for delta in range(count):
        key, value = records[delta]
        dv = small[delta] if delta < _LIMIT else _zigzag(delta)
        n = len(key)
        kv = small[n] if n < _LIMIT else _zigzag(n)
        if value is None:
            vv = _NULL
            value = b""
        else:
            n = len(value)
            vv = small[n] if n < _LIMIT else _zigzag(n)
        # attributes, timestamp delta 0, offset delta, key, value, 0 headers
        size = 3 + len(dv) + len(kv) + len(key) + len(vv) + len(value)
        parts.extend((small[size] if size < _LIMIT else _zigzag(size), b"\x00\x00", dv, kv, key, vv, value, b"\x00"))
    after_crc = _AFTER_CRC.pack(0, count - 1, timestamp_ms, timestamp_ms, -1, -1, -1, count) + b"".join(parts)
    return _BEFORE_CRC.pack(0, len(after_crc) + 9, 0, 2, crc32c.crc32c(after_crc)) + after_crc
