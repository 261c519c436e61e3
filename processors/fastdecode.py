"""Record decoding for the processor hot path.

``SourceRecord`` has the attributes of ``broker.protocol.records.Record`` (offset, timestamp, key,
value, headers, ``header()``) but is a plain slotted class, which is several times cheaper to
create than a frozen dataclass. ``decode_from`` turns stored RecordBatch v2 bytes into them with
single-byte varint fast paths; compressed and control batches go through the broker's decoder.
Input is trusted to the extent the log validated it on append (CRC, lengths); anything malformed
still raises ``CorruptRecordError`` from the bounds checks.
"""

from __future__ import annotations

from broker.errors import CorruptRecordError
from broker.protocol.records import BATCH_HEADER_SIZE, Compression, decode_records, iter_batches
from processors.executor import RecordLike

__all__ = ["SourceRecord", "decode_from"]

_LOG_APPEND_TIME = 0x08


class SourceRecord:
    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(self, offset: int, timestamp: int, key: bytes | None, value: bytes | None,
                 headers: tuple[tuple[str, bytes | None], ...]) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def __repr__(self) -> str:
        return f"SourceRecord(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, value={self.value!r})"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
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
            raise CorruptRecordError("varint longer than 10 bytes")


def _decode_plain(payload: bytes, count: int, base_offset: int, base_ts: int, fixed_ts: int | None,
                  min_offset: int, out: list[RecordLike]) -> None:
    pos = 0
    varint = _varint
    empty: tuple[tuple[str, bytes | None], ...] = ()
    try:
        for _ in range(count):
            b = payload[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = varint(payload, pos)
            end = pos + length
            pos += 1  # attributes
            ts_delta, pos = varint(payload, pos)
            b = payload[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = varint(payload, pos)
            b = payload[pos]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                klen, pos = varint(payload, pos)
            if klen < 0:
                key = None
            else:
                key = payload[pos : pos + klen]
                pos += klen
            b = payload[pos]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                vlen, pos = varint(payload, pos)
            if vlen < 0:
                value = None
            else:
                value = payload[pos : pos + vlen]
                pos += vlen
            b = payload[pos]
            if b == 0:
                headers = empty
                pos += 1
            else:
                hcount, pos = varint(payload, pos)
                hs = []
                for _h in range(hcount):
                    hk, pos = varint(payload, pos)
                    hkey = payload[pos : pos + hk].decode("utf-8", "replace")
                    pos += hk
                    hv, pos = varint(payload, pos)
                    if hv < 0:
                        hval = None
                    else:
                        hval = payload[pos : pos + hv]
                        pos += hv
                    hs.append((hkey, hval))
                headers = tuple(hs)
            if pos != end:
                raise CorruptRecordError("record length does not match its fields")
            offset = base_offset + offset_delta
            if offset >= min_offset:
                ts = fixed_ts if fixed_ts is not None else base_ts + ts_delta
                out.append(SourceRecord(offset, ts, key, value, headers))
    except IndexError as exc:
        raise CorruptRecordError("record runs past the end of its batch") from exc


def decode_from(data: bytes | memoryview, min_offset: int, max_records: int = 1 << 62) -> list[RecordLike]:
    """Records with offset ≥ ``min_offset`` from whole stored batches, stopping after the batch
    that reaches ``max_records``."""
    out: list[RecordLike] = []
    view = memoryview(data)
    for pos, header in iter_batches(view, verify=False):
        if header.last_offset < min_offset:
            continue
        batch = view[pos : pos + header.size]
        if header.is_control:
            continue
        if header.compression is not Compression.NONE:
            out.extend(SourceRecord(r.offset, r.timestamp, r.key, r.value, r.headers)
                       for r in decode_records(batch, header) if r.offset >= min_offset)
        else:
            fixed = header.max_timestamp if header.attributes & _LOG_APPEND_TIME else None
            _decode_plain(bytes(batch[BATCH_HEADER_SIZE:]), header.record_count, header.base_offset,
                          header.base_timestamp, fixed, min_offset, out)
        if len(out) >= max_records:
            break
    return out
